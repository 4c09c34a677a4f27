"""The Flax ViT: position resampling against torch, padding invariance, jit/vmap, dtypes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tailaware.data import preprocess
from tailaware.models import vit

SPEC = vit.vit_spec("dinov2_reg", "mu/8", pos_grid=3)
MAP_SPEC = vit.vit_spec("siglip", "mu/8", pos_grid=3)


@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize("g, out", [(3, 3), (3, 5), (5, 2), (4, 9), (7, 3), (37, 51)])
def test_resize_weights_match_torch_interpolate(g, out, antialias):
    x = np.random.default_rng(g * out).standard_normal((1, 1, g, g)).astype(np.float32)
    ref = torch.nn.functional.interpolate(
        torch.from_numpy(x),
        size=(out, g),
        mode="bicubic",
        align_corners=False,
        antialias=antialias,
    ).numpy()[0, 0]
    w = jax.jit(vit.resize_weights, static_argnums=(1, 2, 3))(out, g, out + 2, antialias)
    got = np.asarray(w) @ x[0, 0]
    np.testing.assert_allclose(got[:out], ref, atol=1e-5)
    np.testing.assert_array_equal(got[out:], 0.0)  # rows past the traced size are zero


def _init(spec, seed=0):
    # Random everywhere (scale 0.2) so LayerScale, norms and biases are not at identity values.
    module = vit.ViT(spec)
    p = spec.patch_size
    x = jnp.zeros((1, p, p, 3), jnp.float32)
    return module, vit.random_variables(module, x, seed, scale=0.2)


@pytest.mark.parametrize("spec", [SPEC, MAP_SPEC], ids=["cls+registers", "map"])
def test_padding_and_batching_do_not_change_an_embedding(spec):
    module, params = _init(spec)
    p = spec.patch_size
    rng = np.random.default_rng(0)
    grids = [(3, 2), (2, 4)]
    apply = jax.jit(module.apply)
    alone = []
    for h, w in grids:
        x = rng.standard_normal((1, h * p, w * p, 3)).astype(np.float32)
        y, out = apply(params, jnp.asarray(x))
        alone.append((x, np.asarray(y)[0], np.asarray(out["encoded"])[0]))
    bucket = np.zeros((2, 4 * p, 4 * p, 3), np.float32)
    bucket += 100.0  # garbage in the padding must be masked out
    for i, ((h, w), (x, _, _)) in enumerate(zip(grids, alone, strict=True)):
        bucket[i, : h * p, : w * p] = x[0]
    y, out = apply(params, jnp.asarray(bucket), jnp.asarray(grids, jnp.int32))
    num_prefix = int(spec.class_token) + spec.num_registers
    for i, ((h, w), (_, ref, encoded)) in enumerate(zip(grids, alone, strict=True)):
        np.testing.assert_allclose(np.asarray(y[i]), ref, atol=2e-5)
        # "encoded" keeps the bucket's token order: prefix, then the 4 x 4 grid in raster order.
        rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        tokens = np.concatenate([np.arange(num_prefix), num_prefix + (rows * 4 + cols).ravel()])
        got = np.asarray(out["encoded"][i])[tokens]
        np.testing.assert_allclose(got, encoded, atol=2e-5)
    assert out["pre_logits"].shape == (2, spec.width)


def _einsum_attention(q, k, v, key_value_seq_lengths=None, implementation=None):
    """The einsum + float32 softmax attention `Attention` computed before cuDNN's kernels."""
    del implementation
    mask = jnp.arange(k.shape[1])[None, :] < key_value_seq_lengths[:, None]
    logits = jnp.einsum("bqhc,bkhc->bhqk", q, k, preferred_element_type=jnp.float32)
    logits = logits * (1.0 / np.sqrt(q.shape[-1]))
    logits = jnp.where(mask[:, None, None, :], logits, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    return jnp.einsum("bhqk,bkhc->bqhc", weights, v)


@pytest.mark.parametrize("dtype, atol", [(jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)])
@pytest.mark.parametrize("num_queries", [1, 7])  # a MAP probe, self-attention
def test_attention_matches_the_einsum_path(monkeypatch, dtype, atol, num_queries):
    module = vit.Attention(num_heads=2, dtype=dtype)
    rng = np.random.default_rng(num_queries)
    x_q = jnp.asarray(rng.standard_normal((3, num_queries, 32)), jnp.float32)
    x_kv = jnp.asarray(rng.standard_normal((3, 7, 32)), jnp.float32)
    kv_len = jnp.asarray([7, 3, 1], jnp.int32)
    params = module.init(jax.random.key(0), x_q, x_kv, kv_len)
    # Non-zero biases too, and logits of a few units so the softmax is not nearly uniform.
    params = jax.tree.map(lambda a: a + 0.3 * jax.random.normal(jax.random.key(1), a.shape), params)
    # A fresh function per call: jit would reuse the first trace for the same one.
    run = lambda x_kv: jax.jit(lambda *a: module.apply(*a))(params, x_q, x_kv, kv_len)
    got = np.asarray(run(x_kv), np.float32)
    monkeypatch.setattr(jax.nn, "dot_product_attention", _einsum_attention)
    want = np.asarray(run(x_kv), np.float32)
    np.testing.assert_allclose(got, want, atol=atol)
    # Keys past kv_len do not matter.
    again = np.asarray(run(x_kv.at[1, 3:].set(100.0).at[2, 1:].set(-100.0)), np.float32)
    np.testing.assert_allclose(again, want, atol=atol)


def test_cudnn_attention_only_on_gpus_in_half_precision(monkeypatch):
    assert vit._attention_implementation(jnp.bfloat16, 64) == "xla"  # this CPU
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert vit._attention_implementation(jnp.bfloat16, 64) == "cudnn"
    assert vit._attention_implementation(jnp.float16, 128) == "cudnn"
    assert vit._attention_implementation(jnp.float32, 64) == "xla"
    assert vit._attention_implementation(jnp.bfloat16, 12) == "xla"  # not a multiple of 8


def test_jit_vmap_and_loop_agree():
    module, params = _init(SPEC)
    x = np.random.default_rng(1).standard_normal((3, 16, 24, 3)).astype(np.float32)
    grid = np.asarray([[2, 3], [2, 2], [1, 3]], np.int32)

    def one(image, g):
        return module.apply(params, image[None], g[None])[0][0]

    one_jit = jax.jit(one)
    loop = np.stack(
        [np.asarray(one_jit(jnp.asarray(x[i]), jnp.asarray(grid[i]))) for i in range(3)]
    )
    vmapped = jax.jit(jax.vmap(one))(jnp.asarray(x), jnp.asarray(grid))
    batched = jax.jit(module.apply)(params, jnp.asarray(x), jnp.asarray(grid))[0]
    np.testing.assert_allclose(np.asarray(vmapped), loop, atol=2e-5)
    np.testing.assert_allclose(np.asarray(batched), loop, atol=2e-5)


def test_bfloat16_compute_stays_close_and_keeps_float32_params():
    module, params = _init(SPEC)
    x = jnp.asarray(np.random.default_rng(2).standard_normal((2, 16, 16, 3)), jnp.float32)
    y32 = jax.jit(module.apply)(params, x)[0]
    y16 = jax.jit(vit.ViT(SPEC, dtype=jnp.bfloat16).apply)(params, x)[0]
    assert y16.dtype == jnp.bfloat16
    cos = jnp.sum(y32 * y16.astype(jnp.float32), -1) / (
        jnp.linalg.norm(y32, axis=-1) * jnp.linalg.norm(y16.astype(jnp.float32), axis=-1)
    )
    assert float(cos.min()) > 0.99  # bfloat16 has 8 bits of mantissa


def test_text_transformer_pools_last_token():
    spec = vit.text_spec("mu", vocab_size=50, max_len=6)
    module = vit.TextTransformer(spec)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 50, (2, 6)), jnp.int32)
    params = vit.random_variables(module, tokens)
    y, out = jax.jit(module.apply)(params, tokens)
    head = params["params"]["head"]
    want = out["encoded"][:, -1] @ head["kernel"] + head["bias"][None]
    np.testing.assert_allclose(np.asarray(y), np.asarray(want), atol=1e-5)
    with pytest.raises(ValueError, match="padded to 6"):
        module.apply(params, tokens[:, :5])


def test_size_table_builds_the_published_parameter_counts():
    # ViT-B/16 image tower of CLIP (OpenAI): 86M parameters without the projection.
    spec = vit.vit_spec("clip", "B/16", pos_grid=14)
    shapes = jax.eval_shape(vit.ViT(spec).init, jax.random.key(0), jnp.zeros((1, 16, 16, 3)))
    assert abs(vit.num_params(shapes) / 1e6 - 85.8) < 0.2


def test_buckets_cover_every_aspect_ratio_with_few_shapes():
    pre = preprocess.Preprocess(resolution=384, patch_size=16, num_buckets=4)
    shapes = set()
    for h in range(1, 25):
        for grid in ((24, h), (h, 24)):
            bh, bw = pre.bucket(grid)
            assert bh >= grid[0] and bw >= grid[1]
            shapes.add((bh, bw))
    assert len(shapes) <= 2 * 4


def test_preprocess_resizes_the_longer_side_and_normalises():
    image = np.full((60, 90, 3), 255, np.uint8)
    pre = preprocess.Preprocess(resolution=48, patch_size=8, norm="siglip")
    x, grid = pre(image)
    assert x.shape == (32, 48, 3) and grid == (4, 6)
    np.testing.assert_allclose(x, 1.0, atol=1e-6)  # (1 - 0.5) / 0.5
