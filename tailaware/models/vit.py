"""One configurable Flax ViT for the backbones of ILIAS-scale evaluation.

DINOv2 (with and without register tokens), CLIP / OpenCLIP image towers and SigLIP / SigLIP2
image towers are one pre-norm ViT with a few switches (`FAMILIES`); sizes come from `SIZES`,
which includes the test-only size `"mu"`. `TextTransformer` is the SigLIP text tower.

Images of mixed aspect ratio share one compiled function: each batch is padded to a bucket of
`[Hb, Wb]` patches and every image carries its real patch grid `[h, w]`. Padded tokens are
moved behind the real ones and kept out of attention and pooling by each image's count of real
keys, and the position embedding of each image is interpolated to its own grid with the exact
weights of PyTorch's bicubic `interpolate` (computed inside `jit` from the traced grid size), so
a padded image embeds as it would alone, unpadded.

Attention is `jax.nn.dot_product_attention`: cuDNN's fused (flash) kernel on NVIDIA GPUs in
bfloat16/float16, which never holds the [B, heads, T, T] logits in memory (at 518-724 px,
1,400-2,600 tokens, they are 100-325 MB per image and layer), and XLA's einsum + float32
softmax elsewhere. Per-image key counts rather than a boolean mask are what lets cuDNN take
padded batches (its masks must be a prefix of the keys or a full [T, S] array).

Shapes: `B` images, `Hb, Wb` bucket grid in patches, `T` tokens, `D` width, `E` embedding size,
`G` side of the stored position grid, `L` text length.
"""

import dataclasses
import math
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

# name -> (width, depth, mlp_dim, num_heads). "mu" is for tests only (big_vision's name).
SIZES = {
    "mu": (32, 2, 128, 2),
    "Ti": (192, 12, 768, 3),
    "S": (384, 12, 1536, 6),
    "B": (768, 12, 3072, 12),
    "L": (1024, 24, 4096, 16),
    "So400m": (1152, 27, 4304, 16),
    "H": (1280, 32, 5120, 16),
    "g": (1536, 40, 6144, 24),
    "bigG": (1664, 48, 8192, 16),
}

# Architectural switches per family; the checkpoint sources of each are in weights.py.
FAMILIES = {
    # Oquab et al. 2023: LayerScale, exact GELU, CLS token after the final norm.
    "dinov2": dict(act="gelu", eps=1e-6, layerscale=True, pool="cls", pos_interp="bicubic"),
    # Darcet et al. 2024: + 4 register tokens (HF resamples its positions with antialiasing).
    "dinov2_reg": dict(
        act="gelu", eps=1e-6, layerscale=True, pool="cls", num_registers=4, pos_interp="bicubic_aa"
    ),
    # Radford et al. 2021 (OpenAI weights use QuickGELU): ln_pre, CLS after ln_post, projection.
    "clip": dict(act="quick_gelu", eps=1e-5, pre_norm=True, pool="cls", pos_interp="bicubic"),
    # OpenCLIP's LAION models: the same with exact GELU.
    "openclip": dict(act="gelu", eps=1e-5, pre_norm=True, pool="cls", pos_interp="bicubic"),
    # Zhai et al. 2023 / Tschannen et al. 2025: no CLS token, attention-pooling (MAP) head.
    "siglip": dict(act="gelu_tanh", eps=1e-6, class_token=False, pool="map", pos_interp="bicubic"),
}

_ACTS = {
    "gelu": lambda x: nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: nn.gelu(x, approximate=True),
    "quick_gelu": lambda x: x * nn.sigmoid(1.702 * x),
}


@dataclasses.dataclass(frozen=True)
class ViTSpec:
    """Everything that fixes the parameter shapes and the forward pass of a `ViT`."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    patch_size: int
    pos_grid: int  # side G of the stored (pre-training) position grid
    act: str = "gelu"
    eps: float = 1e-6
    class_token: bool = True
    num_registers: int = 0
    layerscale: bool = False
    pre_norm: bool = False
    pool: str = "cls"  # "cls" or "map"
    proj_dim: int = 0  # 0: no projection head
    pos_interp: str = "bicubic"  # "bicubic" (PyTorch default) or "bicubic_aa" (antialias=True)


def vit_spec(family: str, variant: str, pos_grid: int, proj_dim: int = 0, **overrides) -> ViTSpec:
    """Returns the `ViTSpec` of e.g. `vit_spec("dinov2", "B/14", pos_grid=37)`."""
    if family not in FAMILIES:
        raise ValueError(f"unknown ViT family {family!r}; known: {sorted(FAMILIES)}")
    size, patch = variant.split("/")
    if size not in SIZES:
        raise ValueError(f"unknown ViT size {size!r}; known: {sorted(SIZES)}")
    width, depth, mlp_dim, heads = SIZES[size]
    fields: dict[str, Any] = dict(width=width, depth=depth, mlp_dim=mlp_dim, num_heads=heads)
    fields.update(FAMILIES[family])
    fields.update(overrides)
    return ViTSpec(patch_size=int(patch), pos_grid=pos_grid, proj_dim=proj_dim, **fields)


def _cubic(x, a):
    """Returns the cubic convolution kernel (Keys 1981) of parameter `a` at `x`, 0 for |x| >= 2."""
    x = jnp.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return jnp.where(x < 1.0, near, jnp.where(x < 2.0, far, 0.0))


def resize_weights(out_size, in_size: int, out_max: int, antialias: bool) -> jax.Array:
    """Returns the [out_max, in_size] matrix of PyTorch's 1-D bicubic `interpolate`.

    Rows at or beyond the (possibly traced) `out_size` are zero. Without antialiasing this is
    `upsample_bicubic2d` with `align_corners=False` (a = -0.75, border indices clamped); with
    it, the PIL-style `_upsample_bicubic2d_aa` (a = -0.5, window renormalised at the border).
    """
    out_f = jnp.asarray(out_size, jnp.float32)
    scale = in_size / out_f
    dst = jnp.arange(out_max, dtype=jnp.float32)[:, None]
    src = jnp.arange(in_size, dtype=jnp.float32)[None, :]
    if antialias:
        support = jnp.where(scale >= 1.0, 2.0 * scale, 2.0)
        inv = jnp.where(scale >= 1.0, 1.0 / scale, 1.0)
        center = scale * (dst + 0.5)
        lo = jnp.maximum(jnp.trunc(center - support + 0.5), 0.0)
        hi = jnp.minimum(jnp.trunc(center + support + 0.5), float(in_size))
        w = jnp.where((src >= lo) & (src < hi), _cubic((src - center + 0.5) * inv, -0.5), 0.0)
        w = w / jnp.sum(w, axis=1, keepdims=True)
    else:
        pos = (dst + 0.5) * scale - 0.5
        base = jnp.floor(pos)
        t = pos - base
        w = jnp.zeros((out_max, in_size), jnp.float32)
        for k in range(-1, 3):
            idx = jnp.clip(base + k, 0, in_size - 1)
            w = w + jnp.where(src == idx, _cubic(t - k, -0.75), 0.0)
    return jnp.where(dst < out_f, w, 0.0)


def _layer_norm(eps: float, name: str, x, dtype):
    """Returns LayerNorm `name` of `x`, computed in float32 whatever `dtype` and cast to it.

    Must be called inside a compact module.
    """
    y = nn.LayerNorm(epsilon=eps, dtype=jnp.float32, name=name)(x.astype(jnp.float32))
    return y.astype(dtype)


class PatchEmbed(nn.Module):
    """A stride-p p x p convolution (the parameters of `nn.Conv`), computed as one matmul.

    Pixels beyond the last whole patch are dropped, as PyTorch's `Conv2d` does; on CPU the
    matmul form is markedly faster than XLA's convolution.
    """

    width: int
    patch_size: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, images):
        p = self.patch_size
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (p, p, 3, self.width))
        bias = self.param("bias", nn.initializers.zeros, (self.width,))
        b, h, w, c = images.shape
        h, w = h // p, w // p
        x = images[:, : h * p, : w * p].astype(self.dtype)
        x = x.reshape(b, h, p, w, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, h, w, p * p * c)
        x = x @ kernel.reshape(p * p * c, self.width).astype(self.dtype)
        return x + bias.astype(self.dtype)[None, None, None]


class MlpBlock(nn.Module):
    """Transformer MLP: Dense, activation, Dense."""

    mlp_dim: int
    act: str
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        d = x.shape[-1]
        x = nn.Dense(self.mlp_dim, dtype=self.dtype, name="fc1")(x)
        x = _ACTS[self.act](x)
        return nn.Dense(d, dtype=self.dtype, name="fc2")(x)


def _attention_implementation(dtype, head_dim: int) -> str:
    """Returns "cudnn" where cuDNN's fused attention applies, else "xla".

    cuDNN's flash kernels take bfloat16/float16 with head dims that are multiples of 8 up to 128
    (256 from Hopper on; 128 covers every size in `SIZES`), on NVIDIA GPUs only.
    """
    half = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    fits = head_dim % 8 == 0 and head_dim <= 128
    return "cudnn" if jax.default_backend() == "gpu" and half and fits else "xla"


class Attention(nn.Module):
    """Multi-head attention with separate query/key/value projections.

    `kv_len` [B] int32: each example's number of real keys, which come first (`ViT` moves
    padded tokens last); None means every key is real. Logits and softmax are float32 whatever
    the compute dtype (in both of `jax.nn.dot_product_attention`'s implementations).
    """

    num_heads: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x_q, x_kv, kv_len=None):
        d = x_q.shape[-1]
        h = self.num_heads

        def proj(name, x):
            y = nn.Dense(d, dtype=self.dtype, name=name)(x)
            return y.reshape(*y.shape[:-1], h, d // h)

        q, k, v = proj("query", x_q), proj("key", x_kv), proj("value", x_kv)

        def attend(impl):
            # jax's XLA path promotes bfloat16 with float32 by name (`jnp.promote_types`), which
            # strict promotion (the tests' setting) refuses; its arithmetic is explicit anyway.
            with jax.numpy_dtype_promotion("standard"):
                return jax.nn.dot_product_attention(
                    q, k, v, key_value_seq_lengths=kv_len, implementation=impl
                )

        if _attention_implementation(q.dtype, d // h) == "cudnn":
            try:
                y = attend("cudnn")
            except NotImplementedError:  # a shape or cuDNN version its kernels do not cover
                y = attend("xla")
        else:
            y = attend("xla")
        return nn.Dense(d, dtype=self.dtype, name="out")(y.reshape(*y.shape[:-2], d))


class EncoderBlock(nn.Module):
    """Pre-norm transformer block, optionally with LayerScale (Touvron et al. 2021)."""

    spec: ViTSpec
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, kv_len=None):
        s = self.spec
        y = _layer_norm(s.eps, "norm1", x, self.dtype)
        y = Attention(s.num_heads, self.dtype, name="attn")(y, y, kv_len)
        if s.layerscale:
            y = y * self.param("ls1", nn.initializers.ones, (s.width,)).astype(y.dtype)[None, None]
        x = x + y
        y = _layer_norm(s.eps, "norm2", x, self.dtype)
        y = MlpBlock(s.mlp_dim, s.act, self.dtype, name="mlp")(y)
        if s.layerscale:
            y = y * self.param("ls2", nn.initializers.ones, (s.width,)).astype(y.dtype)[None, None]
        return x + y


class MAPHead(nn.Module):
    """Multihead attention pooling (Lee et al. 2019; SigLIP's head): one learned probe."""

    spec: ViTSpec
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, kv_len):
        s = self.spec
        probe = self.param("probe", nn.initializers.normal(0.02), (1, 1, s.width))
        probe = jnp.broadcast_to(probe, (x.shape[0], 1, s.width)).astype(x.dtype)
        x = Attention(s.num_heads, self.dtype, name="attn")(probe, x, kv_len)
        y = _layer_norm(s.eps, "norm", x, self.dtype)
        x = x + MlpBlock(s.mlp_dim, s.act, self.dtype, name="mlp")(y)
        return x[:, 0]


class ViT(nn.Module):
    """A ViT image tower; returns `(embedding [B, E], out)` with `out["pre_logits"]` = embedding.

    Attributes:
      spec: the architecture (see `vit_spec`).
      dtype: compute dtype (bfloat16 on accelerators); parameters stay float32.
    """

    spec: ViTSpec
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, images, grid=None):
        """Embeds images.

        Args:
          images: [B, Hb * p, Wb * p, 3] normalised pixels, real content at the top left.
          grid: [B, 2] int, each image's real patch grid (h, w) with h <= Hb, w <= Wb; None
            means the whole bucket.

        Returns:
          `(embedding, out)`: embedding [B, E]; out holds "encoded" [B, T, D] and "pre_logits".
        """
        s = self.spec
        b = images.shape[0]
        p = s.patch_size
        x = PatchEmbed(s.width, p, self.dtype, name="embedding")(images)
        _, hb, wb, d = x.shape
        padded = grid is not None
        if not padded:
            grid = jnp.broadcast_to(jnp.asarray([hb, wb], jnp.int32), (b, 2))

        # Each image's position embedding, resampled to its own grid.
        pos = self.param("pos_embedding", nn.initializers.normal(0.02), (s.pos_grid, s.pos_grid, d))
        aa = s.pos_interp == "bicubic_aa"
        wh = jax.vmap(lambda n: resize_weights(n, s.pos_grid, hb, aa))(grid[:, 0])
        ww = jax.vmap(lambda n: resize_weights(n, s.pos_grid, wb, aa))(grid[:, 1])
        pos = jnp.einsum("bhi,bwj,ijd->bhwd", wh, ww, pos, precision="highest")
        x = (x + pos.astype(x.dtype)).reshape(b, hb * wb, d)

        # Prefix tokens carry no position (a pre-trained one is folded in at conversion).
        prefix = []
        if s.class_token:
            prefix.append(self.param("cls", nn.initializers.zeros, (1, 1, d)))
        if s.num_registers:
            prefix.append(self.param("registers", nn.initializers.zeros, (1, s.num_registers, d)))
        if prefix:
            tok = jnp.concatenate(prefix, axis=1).astype(x.dtype)
            x = jnp.concatenate([jnp.broadcast_to(tok, (b, *tok.shape[1:])), x], axis=1)

        kv_len = order = None
        if padded:
            # Real tokens first (prefix, then the image's patches in raster order), padding last:
            # attention sees only each image's first kv_len keys. Every other layer acts on each
            # token alone, so the order matters only for "encoded", which is put back.
            valid = (jnp.arange(hb)[None, :, None] < grid[:, 0, None, None]) & (
                jnp.arange(wb)[None, None, :] < grid[:, 1, None, None]
            )
            num_prefix = int(s.class_token) + s.num_registers
            real = jnp.concatenate(
                [jnp.ones((b, num_prefix), bool), valid.reshape(b, hb * wb)], axis=1
            )
            order = jnp.argsort(~real, axis=1, stable=True)  # [B, T]
            x = jnp.take_along_axis(x, order[:, :, None], axis=1)
            kv_len = jnp.sum(real, axis=1, dtype=jnp.int32)

        if s.pre_norm:
            x = _layer_norm(s.eps, "norm_pre", x, self.dtype)
        for i in range(s.depth):
            x = EncoderBlock(s, self.dtype, name=f"block{i}")(x, kv_len)
        x = _layer_norm(s.eps, "norm", x, self.dtype)

        if s.pool == "cls":
            y = x[:, 0]  # the CLS token stays first
        elif s.pool == "map":
            y = MAPHead(s, self.dtype, name="head")(x, kv_len)
        else:
            raise ValueError(f"unknown pool {s.pool!r}")
        if padded:
            x = jnp.take_along_axis(x, jnp.argsort(order, axis=1)[:, :, None], axis=1)
        out = {"encoded": x}
        if s.proj_dim:
            y = nn.Dense(s.proj_dim, dtype=self.dtype, name="proj")(y)
        out["pre_logits"] = y
        return y, out


@dataclasses.dataclass(frozen=True)
class TextSpec:
    """The SigLIP text tower: pre-norm transformer, last-token pooling, a linear head."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    vocab_size: int = 32000
    max_len: int = 64
    act: str = "gelu_tanh"
    eps: float = 1e-6
    proj_dim: int = 0  # 0: the head keeps the width (SigLIP)
    layerscale = False  # EncoderBlock reads it; text towers have none


def text_spec(variant: str, **overrides) -> TextSpec:
    """Returns the `TextSpec` of a SigLIP text tower, e.g. `text_spec("B")`."""
    width, depth, mlp_dim, heads = SIZES[variant]
    return TextSpec(width=width, depth=depth, mlp_dim=mlp_dim, num_heads=heads, **overrides)


class TextTransformer(nn.Module):
    """SigLIP text tower; returns `(embedding [B, E], out)` for token ids [B, L].

    SigLIP is trained on text padded to `max_len` without an attention mask and pools the last
    token, so ids must be padded (with the tokenizer's pad id) to exactly `max_len`.
    """

    spec: TextSpec
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, tokens):
        s = self.spec
        if tokens.shape[-1] != s.max_len:
            raise ValueError(f"text must be padded to {s.max_len} tokens, got {tokens.shape}")
        x = nn.Embed(s.vocab_size, s.width, name="embedding")(tokens).astype(self.dtype)
        pos = self.param("pos_embedding", nn.initializers.normal(0.02), (s.max_len, s.width))
        x = x + pos.astype(x.dtype)[None]
        for i in range(s.depth):
            x = EncoderBlock(s, self.dtype, name=f"block{i}")(x)
        x = _layer_norm(s.eps, "norm", x, self.dtype)
        y = nn.Dense(s.proj_dim or s.width, dtype=self.dtype, name="head")(x[:, -1])
        return y, {"encoded": x, "pre_logits": y}


def flops_per_image(spec: ViTSpec, grid: tuple[int, int]) -> float:
    """Returns the forward FLOPs (2 per multiply-add) of one image on a `grid` of patches."""
    n = grid[0] * grid[1]
    t = n + int(spec.class_token) + spec.num_registers
    d, m = spec.width, spec.mlp_dim
    per_block = 2 * t * (4 * d * d + 2 * d * m) + 2 * 2 * t * t * d
    embed = 2 * n * 3 * spec.patch_size**2 * d
    return float(spec.depth * per_block + embed)


def num_params(params) -> int:
    """Returns the number of scalars in a parameter tree."""
    return int(sum(math.prod(x.shape) for x in jax.tree.leaves(params)))


def random_variables(module: nn.Module, sample_input, seed: int = 0, scale: float = 0.02):
    """Returns random variables for `module` without compiling its initialisers.

    Every parameter is `N(0, scale^2)`, plus 1 for LayerNorm scales and LayerScale; for tests,
    benchmarks and dry runs (`module.init` compiles every initialiser, slow for big models).
    """
    shapes = jax.eval_shape(module.init, jax.random.key(0), sample_input)
    flat = flax.traverse_util.flatten_dict(shapes)
    rng = np.random.default_rng(seed)
    out = {}
    for path, leaf in flat.items():
        x = scale * rng.standard_normal(leaf.shape, dtype=np.float32)
        if path[-1] in ("scale", "ls1", "ls2"):
            x = x + 1.0
        out[path] = jnp.asarray(x)
    return flax.traverse_util.unflatten_dict(out)
