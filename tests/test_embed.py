"""The embedding job: buckets vs one-by-one, the launch command end to end, resume, hosts."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds
import torch
import transformers

from tailaware import models
from tailaware.configs import embed as embed_config
from tailaware.core import sampling
from tailaware.data import preprocess
from tailaware.embed import embedder
from tailaware.io import features
from tailaware.jobs import embed
from tests.test_data import jpeg, make_core, write_tar

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tiny_config(**embed_fields):
    c = embed_config.get_config("mu")
    c.embed.batch_size = 4
    c.embed.num_buckets = 2
    c.embed.workers = 2
    c.embed.update(embed_fields)
    return c


def test_embedder_matches_the_model_image_by_image():
    c = _tiny_config()
    module, variables, pre = embed.build_model(c.model, c.embed)
    images = embedder.Embedder(module, variables, pre, batch_size=4, workers=2)
    assert images.mesh.size == 2  # data-parallel over both CPU devices
    # Four distinct patch grids (one reference compile each) in two buckets.
    sizes = [(40, 30), (30, 40), (50, 50), (41, 30), (44, 31), (45, 35), (33, 44)]
    examples = [(f"img{k}", jpeg(h, w, seed=k)) for k, (h, w) in enumerate(sizes)]
    ids, feats = images.embed(examples)
    assert ids == [i for i, _ in examples]  # input order, whatever the buckets
    apply = jax.jit(module.apply)
    for k, (_, image) in enumerate(examples):
        x, grid = pre(image)
        p = pre.patch_size
        y = np.asarray(apply(variables, jnp.asarray(x[None, : grid[0] * p, : grid[1] * p]))[0])[0]
        np.testing.assert_allclose(feats[k], y / np.linalg.norm(y), atol=1e-5, err_msg=f"{k}")
    # Mixed aspect ratios, few compiled shapes: one per bucket used, not one per image.
    assert images._jit_step._cache_size() <= len({pre.bucket(pre(b)[1]) for _, b in examples})


def _hf_dinov2_checkpoint(path):
    cfg = transformers.Dinov2Config(
        image_size=28, patch_size=14, hidden_size=32, num_hidden_layers=2, num_attention_heads=2
    )
    model = transformers.Dinov2Model(cfg).eval()
    import safetensors.torch

    safetensors.torch.save_file(model.state_dict(), str(path))
    return model


def test_launch_embeds_ilias_core_with_a_converted_checkpoint(tmp_path):
    queries, positives = make_core(tmp_path / "core")
    model = _hf_dinov2_checkpoint(tmp_path / "dino.safetensors")
    workdir = tmp_path / "out"
    cmd = [
        sys.executable,
        "launch.py",
        "--config=configs/embed.py:mu",
        f"--workdir={workdir}",
        f"--config.model.checkpoint={tmp_path / 'dino.safetensors'}",
        "--config.embed.input=ilias_core",
        f"--config.embed.folder={tmp_path / 'core'}",
        "--config.embed.batch_size=4",
    ]
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu"
    )
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)

    q_feats, q_ids = features.read_features(workdir / features.IMAGE_QUERIES)
    p_feats, p_ids = features.read_features(workdir / features.POSITIVES)
    assert q_ids == queries and p_ids == positives and q_feats.dtype == np.float16
    # Against the PyTorch model on the same preprocessed pixels.
    pre = preprocess.Preprocess(resolution=56, patch_size=14)
    for i, feat in zip(p_ids, p_feats, strict=True):
        x, (h, w) = pre((tmp_path / "core" / i).read_bytes())
        x = torch.from_numpy(x[: h * 14, : w * 14].transpose(2, 0, 1)[None].copy())
        with torch.no_grad():
            ref = model(x).pooler_output[0].numpy()
        np.testing.assert_allclose(feat, ref / np.linalg.norm(ref), atol=2e-3)  # float16


def test_tars_sample_resume_and_processes(tmp_path, monkeypatch):
    all_ids = []
    for t in range(3):
        members = {f"{k:04d}.jpg": jpeg(20 + 3 * k, 30, seed=10 * t + k) for k in range(6)}
        write_tar(tmp_path / f"shard{t:03d}.tar", members)
        all_ids += [f"shard{t:03d}/{k:04d}" for k in range(6)]
    c = _tiny_config(
        input="tars", tars=str(tmp_path / "*.tar"), tars_per_file=2, sample_fraction=0.5
    )
    # Two processes, each its own disjoint units (0 and 2 | 1 of three 2-tar groups... here 2).
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    written = []
    for index in (0, 1):
        monkeypatch.setattr(jax, "process_index", lambda index=index: index)
        written.append([os.path.basename(p) for p in embed.run(c, str(tmp_path / "out"))])
    assert written == [[features.distractor_name(0)], [features.distractor_name(1)]]

    got = []
    for k in (0, 1):
        feats, ids = features.read_features(tmp_path / "out" / features.distractor_name(k))
        np.testing.assert_allclose(np.linalg.norm(feats.astype(np.float32), axis=1), 1, atol=2e-3)
        got += ids
    want = [i for i, keep in zip(all_ids, sampling.in_sample(all_ids, 0.5, 0), strict=True) if keep]
    assert got == want and 0 < len(got) < len(all_ids)

    before = os.path.getmtime(tmp_path / "out" / features.distractor_name(0))
    monkeypatch.setattr(jax, "process_index", lambda: 0)
    assert embed.run(c, str(tmp_path / "out")) == []  # finished units are skipped
    assert os.path.getmtime(tmp_path / "out" / features.distractor_name(0)) == before


def test_tfds_split_input(tmp_path):
    c = _tiny_config(input="tfds", tfds_name="ilias_core/images", tfds_split="positives")
    with tfds.testing.mock_data(num_examples=5):
        (path,) = embed.run(c, str(tmp_path))
    feats, ids = features.read_features(path)
    assert os.path.basename(path) == features.POSITIVES and feats.shape == (5, 32)


def test_config_presets_build():
    for name in embed_config.PRESETS:
        c = embed_config.get_config(name)
        spec = models.spec_for(
            c.model.source, c.model.family, c.model.variant, c.model.pos_grid, c.model.proj_dim
        )
        assert c.model.resolution % spec.patch_size < spec.patch_size


def test_text_queries_with_a_converted_siglip_text_tower(tmp_path):
    import safetensors.torch
    import tokenizers

    make_core(tmp_path / "core")
    words = ["<pad>", "</s>", "<unk>", "a", "photo", "of", "object", "0", "1", "2"]
    tok = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({w: k for k, w in enumerate(words)}, unk_token="<unk>")
    )
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", 1)]
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    cfg = transformers.SiglipTextConfig(
        vocab_size=10,
        max_position_embeddings=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        pad_token_id=1,
        eos_token_id=1,
        bos_token_id=1,
    )
    model = transformers.SiglipTextModel(cfg).eval()
    safetensors.torch.save_file(model.state_dict(), str(tmp_path / "text.safetensors"))

    c = _tiny_config(input="ilias_core", folder=str(tmp_path / "core"))
    c.text.update(
        variant="mu",
        checkpoint=str(tmp_path / "text.safetensors"),
        vocab_size=10,
        max_len=8,
        tokenizer=str(tmp_path / "tokenizer.json"),
        pad_id=1,
    )
    out = tmp_path / "out"
    out.mkdir()
    for name in (features.IMAGE_QUERIES, features.POSITIVES):  # done: only text is left
        (out / name).touch()
    assert embed.run(c, str(out)) == [str(out / features.TEXT_QUERIES)]

    feats, ids = features.read_features(out / features.TEXT_QUERIES)
    assert ids == ["inst00/text.txt", "inst01/text.txt", "inst02/text.txt"]
    tokens = torch.tensor([[3, 4, 5, 6, k + 7, 1, 1, 1] for k in range(3)])  # padded with </s>
    with torch.no_grad():
        ref = model(tokens).pooler_output.numpy()
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    np.testing.assert_allclose(feats, ref, atol=2e-3)  # float16 storage
