"""Weight import: each architecture, random weights in its PyTorch reference, same embedding.

The references are the implementations users' checkpoints come from: transformers' model
classes, timm's `VisionTransformer` and open_clip's `VisionTransformer`. Every parameter is
perturbed after initialisation so that zero biases, unit norms and LayerScale all matter.
Tolerance: float32 on both sides; 1e-4 absolute on embeddings of norm ~1..10.

timm and open_clip import torchvision at package import (for data transforms and
`FrozenBatchNorm2d`) but their ViTs never call it, and PyPI's torchvision does not import beside
the CPU torch wheel used here. `_stub_torchvision` therefore puts placeholder modules under the
torchvision names before importing them; the ViT code under test is the libraries' own.
"""

import enum
import importlib.machinery
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from tailaware import models
from tailaware.models import state_dict, vit

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

ATOL = 1e-4
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)


class _Placeholders(types.ModuleType):
    """A module whose attributes are inert classes (nothing in a ViT forward uses them)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "InterpolationMode":
            value = enum.Enum(name, "NEAREST NEAREST_EXACT BILINEAR BICUBIC BOX HAMMING LANCZOS")
        else:
            value = type(name, (torch.nn.Module,), {})
        setattr(self, name, value)
        return value


def _stub_torchvision():
    if "timm" in sys.modules:
        return
    names = [
        "torchvision",
        "torchvision.datasets",
        "torchvision.io",
        "torchvision.models",
        "torchvision.models.feature_extraction",
        "torchvision.ops",
        "torchvision.ops.misc",
        "torchvision.transforms",
        "torchvision.transforms.functional",
        "torchvision.transforms.v2",
        "torchvision.utils",
    ]
    for name in names:
        module = _Placeholders(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        module.__path__ = []
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)


def _perturb(module, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return module.eval()


def _state(module):
    return {k: v.detach().numpy() for k, v in module.state_dict().items()}


def _images(b, h, w, seed=0):
    return np.random.default_rng(seed).standard_normal((b, 3, h, w), dtype=np.float32)


def _check(ref_fn, params, spec, shapes):
    """Compares with the reference on each input shape, all padded into one bucket batch.

    One compiled call per architecture; it also checks that padding and batching images of
    different sizes together leaves each embedding as the reference computes it alone.
    """
    p = spec.patch_size
    xs = [_images(2, h, w, seed=h * w) for h, w in shapes]
    hb = max(h for h, _ in shapes) + p
    wb = max(w for _, w in shapes) + p
    bucket = np.full((2 * len(shapes), hb, wb, 3), 7.0, np.float32)  # padding must be masked
    grid = np.zeros((2 * len(shapes), 2), np.int32)
    for k, (x, (h, w)) in enumerate(zip(xs, shapes, strict=True)):
        bucket[2 * k : 2 * k + 2, :h, :w] = x.transpose(0, 2, 3, 1)
        grid[2 * k : 2 * k + 2] = (h // p, w // p)
    got = np.asarray(jax.jit(vit.ViT(spec).apply)(params, bucket, grid)[0])
    for k, (x, (h, w)) in enumerate(zip(xs, shapes, strict=True)):
        with torch.no_grad():
            ref = ref_fn(torch.from_numpy(x)).numpy()
        assert np.abs(ref).max() > 0.1  # not a degenerate (all-zero) embedding
        np.testing.assert_allclose(
            got[2 * k : 2 * k + 2], ref, atol=ATOL, rtol=0, err_msg=f"input {h}x{w}"
        )


def test_hf_dinov2():
    cfg = transformers.Dinov2Config(image_size=28, patch_size=14, **TINY)
    m = _perturb(transformers.Dinov2Model(cfg))
    spec = models.spec_for("hf_dinov2", "dinov2", "mu/14", pos_grid=2)
    params = models.convert(_state(m), "hf_dinov2", spec)
    # Native size, then non-square sizes (bicubic position resampling), padded into a bucket.
    _check(lambda x: m(x).pooler_output, params, spec, [(28, 28), (42, 70), (56, 28)])


def test_hf_dinov2_registers():
    cfg = transformers.Dinov2WithRegistersConfig(image_size=28, patch_size=14, **TINY)
    m = _perturb(transformers.Dinov2WithRegistersModel(cfg))
    spec = models.spec_for("hf_dinov2", "dinov2_reg", "mu/14", pos_grid=2)
    params = models.convert(_state(m), "hf_dinov2", spec)
    _check(lambda x: m(x).pooler_output, params, spec, [(28, 28), (42, 70), (14, 28)])


def test_hf_clip():
    cfg = transformers.CLIPVisionConfig(image_size=32, patch_size=16, projection_dim=16, **TINY)
    m = _perturb(transformers.CLIPVisionModelWithProjection(cfg))
    spec = models.spec_for("hf_clip", "clip", "mu/16", pos_grid=2, proj_dim=16)
    params = models.convert(_state(m), "hf_clip", spec)
    ref = lambda x: m(x, interpolate_pos_encoding=True).image_embeds
    _check(ref, params, spec, [(32, 32), (48, 32)])


def test_hf_siglip():
    cfg = transformers.SiglipVisionConfig(image_size=32, patch_size=16, **TINY)
    m = _perturb(transformers.SiglipVisionModel(cfg))
    spec = models.spec_for("hf_siglip", "siglip", "mu/16", pos_grid=2)
    params = models.convert(_state(m), "hf_siglip", spec)
    ref = lambda x: m(x, interpolate_pos_encoding=True).pooler_output
    # The MAP head pools over real tokens only, so padding must not change the result.
    _check(ref, params, spec, [(32, 32), (32, 64)])


def test_hf_siglip_text():
    cfg = transformers.SiglipTextConfig(
        vocab_size=100,
        max_position_embeddings=8,
        pad_token_id=1,
        bos_token_id=2,
        eos_token_id=3,
        **TINY,
    )
    m = _perturb(transformers.SiglipTextModel(cfg))
    spec = vit.text_spec("mu", vocab_size=100, max_len=8)
    params = models.convert(_state(m), "hf_siglip_text", spec)
    tokens = np.random.default_rng(0).integers(0, 100, (3, 8))
    with torch.no_grad():
        ref = m(torch.from_numpy(tokens)).pooler_output.numpy()
    got, _ = vit.TextTransformer(spec).apply(params, jnp.asarray(tokens, jnp.int32))
    np.testing.assert_allclose(np.asarray(got), ref, atol=ATOL, rtol=0)


def _timm_vit(**kw):
    _stub_torchvision()
    from timm.models.vision_transformer import VisionTransformer

    base = dict(embed_dim=32, depth=2, num_heads=2, mlp_ratio=4.0, num_classes=0)
    return _perturb(VisionTransformer(**{**base, **kw}))


@pytest.mark.parametrize(
    "family, kwargs",
    [
        # vit_*_patch14_dinov2
        ("dinov2", dict(img_size=28, patch_size=14, init_values=1e-5, dynamic_img_size=True)),
        # vit_*_patch14_reg4_dinov2
        (
            "dinov2_reg",
            dict(
                img_size=28,
                patch_size=14,
                init_values=1e-5,
                reg_tokens=4,
                no_embed_class=True,
                dynamic_img_size=True,
            ),
        ),
        # vit_*_patch16_siglip_*
        ("siglip", dict(img_size=32, patch_size=16, class_token=False, global_pool="map")),
    ],
)
def test_timm(family, kwargs):
    m = _timm_vit(**kwargs)
    p = kwargs["patch_size"]
    spec = models.spec_for("timm", family, f"mu/{p}", pos_grid=2)
    params = models.convert(_state(m), "timm", spec)
    shapes = [(2 * p, 2 * p), (3 * p, 5 * p)] if kwargs.get("dynamic_img_size") else [(2 * p,) * 2]
    _check(m, params, spec, shapes)


def test_timm_clip():
    # vit_*_patch16_clip_quickgelu_224: pre-norm, eps 1e-5, QuickGELU, projection as `head`.
    from functools import partial

    m = _timm_vit(
        img_size=32,
        patch_size=16,
        pre_norm=True,
        act_layer="quick_gelu",
        num_classes=16,
        norm_layer=partial(torch.nn.LayerNorm, eps=1e-5),
    )
    spec = models.spec_for("timm", "clip", "mu/16", pos_grid=2, proj_dim=16)
    params = models.convert(_state(m), "timm", spec)
    _check(m, params, spec, [(32, 32)])


@pytest.mark.parametrize("family", ["clip", "openclip"])
def test_open_clip(family):
    _stub_torchvision()
    from open_clip.transformer import QuickGELU, VisionTransformer

    act = QuickGELU if family == "clip" else torch.nn.GELU
    m = _perturb(
        VisionTransformer(
            image_size=32,
            patch_size=16,
            width=32,
            layers=2,
            heads=2,
            mlp_ratio=4.0,
            output_dim=16,
            act_layer=act,
        )
    )
    spec = models.spec_for("open_clip", family, "mu/16", pos_grid=2, proj_dim=16)
    # As in a full CLIP checkpoint: the image tower under `visual.`, a text tower beside it.
    sd = {f"visual.{k}": v for k, v in _state(m).items()}
    sd["text_projection"] = np.zeros((32, 16), np.float32)
    params = models.convert(sd, "open_clip", spec)
    _check(m, params, spec, [(32, 32)])


def test_safetensors_reader_matches_torch(tmp_path):
    import safetensors.torch

    tensors = {
        "a": torch.randn(3, 4),
        "b": torch.randn(5).to(torch.bfloat16),
        "c": torch.randn(2, 2).half(),
        "d": torch.arange(6).reshape(2, 3),
    }
    path = tmp_path / "w.safetensors"
    safetensors.torch.save_file(tensors, str(path))
    got = state_dict.load_state_dict(path)
    for k, v in tensors.items():
        want = v.float().numpy() if v.is_floating_point() else v.numpy()
        np.testing.assert_array_equal(got[k], want)


def test_load_pickled_checkpoint(tmp_path):
    cfg = transformers.Dinov2Config(image_size=28, patch_size=14, **TINY)
    m = _perturb(transformers.Dinov2Model(cfg))
    torch.save({"state_dict": m.state_dict()}, tmp_path / "dino.pth")
    spec = models.spec_for("hf_dinov2", "dinov2", "mu/14", pos_grid=2)
    loaded = models.load(tmp_path / "dino.pth", "hf_dinov2", spec)
    direct = models.convert(_state(m), "hf_dinov2", spec)
    jax.tree.map(np.testing.assert_array_equal, loaded, direct)


def test_hf_dinov2_transformers_v4_names():
    # Checkpoints on the Hub were saved by transformers 4 (`attention.attention.query`, ...).
    cfg = transformers.Dinov2Config(image_size=28, patch_size=14, **TINY)
    sd = _state(transformers.Dinov2Model(cfg))
    v4 = {"q_proj": "attention.query", "k_proj": "attention.key", "v_proj": "attention.value"}
    v4["o_proj"] = "output.dense"
    old = {}
    for k, v in sd.items():
        for new, legacy in v4.items():
            k = k.replace(f"attention.{new}.", f"attention.{legacy}.")
        old[k] = v
    assert old.keys() != sd.keys()
    spec = models.spec_for("hf_dinov2", "dinov2", "mu/14", pos_grid=2)
    jax.tree.map(
        np.testing.assert_array_equal,
        models.convert(old, "hf_dinov2", spec),
        models.convert(sd, "hf_dinov2", spec),
    )


def test_mismatched_checkpoint_names_every_problem():
    cfg = transformers.Dinov2Config(image_size=28, patch_size=14, **TINY)
    sd = _state(transformers.Dinov2Model(cfg))
    del sd["layernorm.weight"]
    sd["extra.weight"] = np.zeros(3, np.float32)
    spec = models.spec_for("hf_dinov2", "dinov2", "mu/14", pos_grid=3)  # wrong grid
    with pytest.raises(models.CheckpointError) as e:
        models.convert(sd, "hf_dinov2", spec)
    msg = str(e.value)
    assert "missing (1): layernorm.weight" in msg
    assert "unexpected (1): extra.weight" in msg
    assert "pos_embedding" in msg


def test_missing_file_fails_without_download(tmp_path):
    with pytest.raises(FileNotFoundError, match="never downloaded"):
        state_dict.load_state_dict(tmp_path / "nope.safetensors")


def test_describe_lists_every_rule():
    spec = models.spec_for("timm", "siglip", "mu/16", pos_grid=2)
    text = models.describe("timm", spec)
    assert "head/attn/key/kernel" in text and "attn_pool.kv.weight" in text
