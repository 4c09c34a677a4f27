"""Weight import: PyTorch state dicts (safetensors or pickled) to `ViT` / `TextTransformer`.

Each supported source has an explicit name table, `TABLES[source](spec)`: a list of
`Rule(target, sources, fn)` where `target` is the Flax parameter path, `sources` the checkpoint
keys it is built from (alternatives separated by `|`, e.g. the names of two transformers
versions) and `fn` the array transform. Print one with `describe(source, spec)`.

| source        | checkpoints                                                | families          |
|---------------|------------------------------------------------------------|-------------------|
| `hf_dinov2`   | transformers `Dinov2Model`, `Dinov2WithRegistersModel`     | dinov2, dinov2_reg|
| `hf_clip`     | transformers `CLIPVisionModelWithProjection`, `CLIPModel`  | clip, openclip    |
| `hf_siglip`   | transformers `SiglipVisionModel`, `SiglipModel`, SigLIP2   | siglip            |
| `hf_siglip_text` | transformers `SiglipTextModel`, `SiglipModel`           | (text tower)      |
| `timm`        | timm `VisionTransformer` (DINOv2, CLIP, SigLIP variants);   | all               |
|               | open_clip `hf-hub:timm/...` towers (`visual.trunk.`)        |                   |
| `open_clip`   | open_clip `VisionTransformer` (`visual.` of a CLIP model)   | clip, openclip    |

Conventions: PyTorch `Linear` weights [out, in] are transposed to Flax kernels [in, out];
`Conv2d` weights [out, in, kh, kw] become [kh, kw, in, out]; fused `qkv` / `in_proj` weights
are split in thirds (query, key, value); a position embedding's prefix slots (CLS, registers)
are folded into those tokens, which `ViT` adds no position to; a bias the source lacks (CLIP's
patch embedding and projection) is zero. Keys of other towers in the same file (e.g. the text
tower of a CLIP checkpoint) are ignored; any other key nothing consumes is an error.
"""

import os
import re
from collections.abc import Callable
from typing import NamedTuple

import flax
import jax
import numpy as np

from tailaware.io import errors
from tailaware.models import state_dict as state_dict_io
from tailaware.models import vit

Array = np.ndarray


class Rule(NamedTuple):
    """One Flax parameter: `target` path, checkpoint `sources`, `fn(*arrays, shape=...)`."""

    target: str
    sources: tuple[str, ...]
    fn: Callable[..., Array]


class CheckpointError(errors.InputError):
    """A checkpoint does not match the model (one of another configuration): in one line, the
    missing, unexpected and mis-shaped names (the first few of each, and how many)."""


def _t(w, shape):  # Linear [out, in] -> Dense [in, out]
    return w.T


def _id(w, shape):
    return w


def _conv(w, shape):  # Conv2d [out, in, kh, kw] -> [kh, kw, in, out]
    return w.transpose(2, 3, 1, 0)


# Names shown by `describe`.
_t.__name__, _id.__name__, _conv.__name__ = "transpose", "copy", "oihw_to_hwio"


def _zero_bias(shape):  # the source has no bias here
    return np.zeros(shape, np.float32)


def _part(k, n, transpose):
    """Returns a transform taking the k-th of n equal chunks along axis 0 (fused qkv/kv)."""

    def fn(w, shape):
        w = np.split(w, n, axis=0)[k]
        return w.T if transpose else w

    fn.__name__ = f"chunk_{k}_of_{n}" + ("_transpose" if transpose else "")
    return fn


def _grid(pos, shape):
    """Drops a position embedding's prefix slots and reshapes it to [G, G, D]."""
    pos = pos.reshape(-1, pos.shape[-1])
    g = shape[0]
    return pos[pos.shape[0] - g * g :].reshape(g, g, -1)


_grid.__name__ = "drop_prefix_to_grid"


def _fold(slot, count, grid):
    """Returns a transform adding position slots [slot, slot + count) to prefix tokens.

    A table of `grid**2` positions has no prefix slots (e.g. timm's `no_embed_class`): the
    tokens are returned unchanged.
    """

    def fn(tok, pos, shape):
        tok = tok.reshape(shape)
        pos = pos.reshape(-1, pos.shape[-1])
        if pos.shape[0] - grid * grid >= slot + count:
            tok = tok + pos[slot : slot + count][None]
        return tok

    fn.__name__ = "fold_position"
    return fn


def _block(i, s, names, fused=None):
    """Returns the rules of encoder block i; `names` maps our sub-paths to source keys (less
    `.weight`)."""
    out = []
    p = f"block{i}"
    for ours, theirs in names.items():
        theirs = theirs.format(i=i)
        if ours in ("norm1", "norm2"):
            out.append(Rule(f"{p}/{ours}/scale", (theirs + ".weight",), _id))
            out.append(Rule(f"{p}/{ours}/bias", (theirs + ".bias",), _id))
        elif ours in ("ls1", "ls2"):
            if s.layerscale:
                out.append(Rule(f"{p}/{ours}", (theirs,), _id))
        else:
            out.append(Rule(f"{p}/{ours}/kernel", (theirs + ".weight",), _t))
            out.append(Rule(f"{p}/{ours}/bias", (theirs + ".bias",), _id))
    if fused is not None:  # one [3D, D] projection for query, key, value
        w, b = (f.format(i=i) for f in fused)
        for k, name in enumerate(("query", "key", "value")):
            out.append(Rule(f"{p}/attn/{name}/kernel", (w,), _part(k, 3, True)))
            out.append(Rule(f"{p}/attn/{name}/bias", (b,), _part(k, 3, False)))
    return out


def _norm(ours, theirs):
    return [
        Rule(f"{ours}/scale", (f"{theirs}.weight",), _id),
        Rule(f"{ours}/bias", (f"{theirs}.bias",), _id),
    ]


def _dense(ours, theirs, transform=_t):
    return [
        Rule(f"{ours}/kernel", (f"{theirs}.weight",), transform),
        Rule(f"{ours}/bias", (f"{theirs}.bias",), _id),
    ]


def _hf_layers(s, prefix):
    """Returns the rules of transformers' CLIP / SigLIP encoder layers under `prefix`."""
    names = {
        "norm1": prefix + "{i}.layer_norm1",
        "attn/query": prefix + "{i}.self_attn.q_proj",
        "attn/key": prefix + "{i}.self_attn.k_proj",
        "attn/value": prefix + "{i}.self_attn.v_proj",
        "attn/out": prefix + "{i}.self_attn.out_proj",
        "norm2": prefix + "{i}.layer_norm2",
        "mlp/fc1": prefix + "{i}.mlp.fc1",
        "mlp/fc2": prefix + "{i}.mlp.fc2",
    }
    return [r for i in range(s.depth) for r in _block(i, s, names)]


def _map_head(fused_in_proj: bool, names: dict):
    """Returns the rules of SigLIP's attention-pooling head, from transformers (in_proj) or timm
    (q + kv) names."""
    rules = [Rule("head/probe", (names["probe"],), _id)]
    if fused_in_proj:
        w, b = names["in_proj"] + "_weight", names["in_proj"] + "_bias"
        for k, name in enumerate(("query", "key", "value")):
            rules.append(Rule(f"head/attn/{name}/kernel", (w,), _part(k, 3, True)))
            rules.append(Rule(f"head/attn/{name}/bias", (b,), _part(k, 3, False)))
    else:
        rules += _dense("head/attn/query", names["q"])
        w, b = names["kv"] + ".weight", names["kv"] + ".bias"
        for k, name in enumerate(("key", "value")):
            rules.append(Rule(f"head/attn/{name}/kernel", (w,), _part(k, 2, True)))
            rules.append(Rule(f"head/attn/{name}/bias", (b,), _part(k, 2, False)))
    rules += _dense("head/attn/out", names["out"])
    rules += _norm("head/norm", names["norm"])
    rules += _dense("head/mlp/fc1", names["fc1"]) + _dense("head/mlp/fc2", names["fc2"])
    return rules


class Table(NamedTuple):
    """A source's rules, the prefixes its tower may sit under, and keys it may leave unused."""

    rules: list[Rule]
    roots: tuple[str, ...] = ("",)
    ignore: tuple[str, ...] = ()


def hf_dinov2(s: vit.ViTSpec) -> Table:
    """Returns the table of transformers Dinov2Model / Dinov2WithRegistersModel (v4 and v5
    attention names)."""
    pos = "embeddings.position_embeddings"
    rules = [
        Rule("embedding/kernel", ("embeddings.patch_embeddings.projection.weight",), _conv),
        Rule("embedding/bias", ("embeddings.patch_embeddings.projection.bias",), _id),
        Rule("cls", ("embeddings.cls_token", pos), _fold(0, 1, s.pos_grid)),
        Rule("pos_embedding", (pos,), _grid),
    ]
    if s.num_registers:
        rules.append(Rule("registers", ("embeddings.register_tokens",), _id))
    a = "encoder.layer.{i}.attention."
    names = {
        "norm1": "encoder.layer.{i}.norm1",
        "attn/query": a + "attention.query|" + a + "q_proj",
        "attn/key": a + "attention.key|" + a + "k_proj",
        "attn/value": a + "attention.value|" + a + "v_proj",
        "attn/out": a + "output.dense|" + a + "o_proj",
        "ls1": "encoder.layer.{i}.layer_scale1.lambda1",
        "norm2": "encoder.layer.{i}.norm2",
        "mlp/fc1": "encoder.layer.{i}.mlp.fc1",
        "mlp/fc2": "encoder.layer.{i}.mlp.fc2",
        "ls2": "encoder.layer.{i}.layer_scale2.lambda1",
    }
    rules += [r for i in range(s.depth) for r in _block(i, s, _alts(names))]
    rules += _norm("norm", "layernorm")
    return Table(rules, roots=("", "dinov2."), ignore=(r"^embeddings\.mask_token$",))


def _alts(names):
    """Expands `a|b` source names so `.weight` / `.bias` apply to each alternative."""
    return {k: _AltName(v) for k, v in names.items()}


class _AltName(str):
    """A `|`-separated source name whose suffixes distribute over the alternatives."""

    def format(self, **kw):
        return _AltName(str.format(self, **kw))

    def __add__(self, suffix):
        return "|".join(a + suffix for a in self.split("|"))


def hf_clip(s: vit.ViTSpec) -> Table:
    """Returns the table of transformers CLIPVisionModelWithProjection / CLIPModel (image tower
    and projection)."""
    v = "vision_model."
    pos = v + "embeddings.position_embedding.weight"
    rules = [
        Rule("embedding/kernel", (v + "embeddings.patch_embedding.weight",), _conv),
        Rule("embedding/bias", (), _zero_bias),
        Rule("cls", (v + "embeddings.class_embedding", pos), _fold(0, 1, s.pos_grid)),
        Rule("pos_embedding", (pos,), _grid),
    ]
    rules += _norm("norm_pre", v + "pre_layrnorm")
    rules += _hf_layers(s, v + "encoder.layers.")
    rules += _norm("norm", v + "post_layernorm")
    if s.proj_dim:
        rules.append(Rule("proj/kernel", ("visual_projection.weight",), _t))
        rules.append(Rule("proj/bias", (), _zero_bias))
    ignore = (r"^text_model\.", r"^text_projection\.", r"^logit_scale$", r"position_ids$")
    return Table(rules, roots=("",), ignore=ignore)


def hf_siglip(s: vit.ViTSpec) -> Table:
    """Returns the table of transformers SiglipVisionModel / SiglipModel / Siglip2
    fixed-resolution image towers."""
    rules = [
        Rule("embedding/kernel", ("embeddings.patch_embedding.weight",), _conv),
        Rule("embedding/bias", ("embeddings.patch_embedding.bias",), _id),
        Rule("pos_embedding", ("embeddings.position_embedding.weight",), _grid),
    ]
    rules += _hf_layers(s, "encoder.layers.")
    rules += _norm("norm", "post_layernorm")
    rules += _map_head(
        True,
        dict(
            probe="head.probe",
            in_proj="head.attention.in_proj",
            out="head.attention.out_proj",
            norm="head.layernorm",
            fc1="head.mlp.fc1",
            fc2="head.mlp.fc2",
        ),
    )
    return Table(rules, roots=("vision_model.", ""), ignore=(r"position_ids$",))


def hf_siglip_text(s: vit.TextSpec) -> Table:
    """Returns the table of transformers SiglipTextModel / the text tower of SiglipModel."""
    rules = [
        Rule("embedding/embedding", ("embeddings.token_embedding.weight",), _id),
        Rule("pos_embedding", ("embeddings.position_embedding.weight",), _id),
    ]
    rules += _hf_layers(s, "encoder.layers.")
    rules += _norm("norm", "final_layer_norm")
    rules += _dense("head", "head")
    return Table(rules, roots=("text_model.", ""), ignore=(r"position_ids$",))


def timm_vit(s: vit.ViTSpec) -> Table:
    """Returns the table of timm VisionTransformer (`vit_*_dinov2`, `vit_*_clip_*`,
    `vit_*_siglip_*`, ...)."""
    rules = [
        Rule("embedding/kernel", ("patch_embed.proj.weight",), _conv),
        # timm drops the patch bias exactly when it adds `norm_pre` (CLIP towers).
        Rule(
            "embedding/bias",
            () if s.pre_norm else ("patch_embed.proj.bias",),
            _zero_bias if s.pre_norm else _id,
        ),
        Rule("pos_embedding", ("pos_embed",), _grid),
    ]
    if s.class_token:
        rules.append(Rule("cls", ("cls_token", "pos_embed"), _fold(0, 1, s.pos_grid)))
    if s.num_registers:
        rules.append(
            Rule("registers", ("reg_token", "pos_embed"), _fold(1, s.num_registers, s.pos_grid))
        )
    if s.pre_norm:
        rules += _norm("norm_pre", "norm_pre")
    names = {
        "norm1": "blocks.{i}.norm1",
        "attn/out": "blocks.{i}.attn.proj",
        "ls1": "blocks.{i}.ls1.gamma",
        "norm2": "blocks.{i}.norm2",
        "mlp/fc1": "blocks.{i}.mlp.fc1",
        "mlp/fc2": "blocks.{i}.mlp.fc2",
        "ls2": "blocks.{i}.ls2.gamma",
    }
    fused = ("blocks.{i}.attn.qkv.weight", "blocks.{i}.attn.qkv.bias")
    rules += [r for i in range(s.depth) for r in _block(i, s, names, fused)]
    rules += _norm("norm", "norm")
    if s.pool == "map":
        rules += _map_head(
            False,
            dict(
                probe="attn_pool.latent",
                q="attn_pool.q",
                kv="attn_pool.kv",
                out="attn_pool.proj",
                norm="attn_pool.norm",
                fc1="attn_pool.mlp.fc1",
                fc2="attn_pool.mlp.fc2",
            ),
        )
    if s.proj_dim:  # timm's CLIP towers keep the projection as `head` (bias zero)
        rules += _dense("proj", "head")
    return Table(rules, roots=("", "visual.trunk.", "module."))


def open_clip_vit(s: vit.ViTSpec) -> Table:
    """Returns the table of open_clip VisionTransformer (`visual.` of a CLIP model; OpenAI and
    LAION weights)."""
    pos = "positional_embedding"
    rules = [
        Rule("embedding/kernel", ("conv1.weight",), _conv),
        Rule("embedding/bias", (), _zero_bias),
        Rule("cls", ("class_embedding", pos), _fold(0, 1, s.pos_grid)),
        Rule("pos_embedding", (pos,), _grid),
    ]
    rules += _norm("norm_pre", "ln_pre")
    r = "transformer.resblocks.{i}."
    names = {
        "norm1": r + "ln_1",
        "attn/out": r + "attn.out_proj",
        "ls1": r + "ls_1.gamma",
        "norm2": r + "ln_2",
        "mlp/fc1": r + "mlp.c_fc",
        "mlp/fc2": r + "mlp.c_proj",
        "ls2": r + "ls_2.gamma",
    }
    fused = (r + "attn.in_proj_weight", r + "attn.in_proj_bias")
    rules += [x for i in range(s.depth) for x in _block(i, s, names, fused)]
    rules += _norm("norm", "ln_post")
    if s.proj_dim:  # `x @ proj`: already [in, out]
        rules.append(Rule("proj/kernel", ("proj",), _id))
        rules.append(Rule("proj/bias", (), _zero_bias))
    return Table(rules, roots=("visual.", ""))


# Each takes the `vit.ViTSpec` (or, for a text tower, `vit.TextSpec`) its table is for.
TABLES: dict[str, Callable[..., Table]] = {
    "hf_dinov2": hf_dinov2,
    "hf_clip": hf_clip,
    "hf_siglip": hf_siglip,
    "hf_siglip_text": hf_siglip_text,
    "timm": timm_vit,
    "open_clip": open_clip_vit,
}


def describe(source: str, spec) -> str:
    """Returns the name table of `source` for `spec` as text, one Flax parameter a line."""
    table = TABLES[source](spec)
    lines = [f"# {source}: roots {table.roots}, ignored {table.ignore}"]
    for r in table.rules:
        lines.append(f"{r.target:40s} <- {', '.join(r.sources) or '(zeros)'} [{r.fn.__name__}]")
    return "\n".join(lines)


def convert(state_dict: dict[str, Array], source: str, spec, module=None) -> dict:
    """Maps a PyTorch state dict to Flax variables `{"params": ...}` for `spec`.

    Args:
      state_dict: checkpoint key -> array (see `state_dict.load_state_dict`).
      source: a key of `TABLES`.
      spec: the `vit.ViTSpec` or `vit.TextSpec` the parameters are for.
      module: the Flax module to check shapes against (default: `ViT(spec)` / `TextTransformer`).

    Raises:
      CheckpointError: listing every missing, unexpected or mis-shaped parameter name.
    """
    if source not in TABLES:
        raise ValueError(f"unknown checkpoint source {source!r}; known: {sorted(TABLES)}")
    table = TABLES[source](spec)
    module = module or _module(spec)
    expected = _expected_shapes(module)

    anchor = table.rules[0].sources[0].split("|")[0]
    root = next((r for r in table.roots if r + anchor in state_dict), table.roots[-1])
    sd = {k[len(root) :]: v for k, v in state_dict.items() if k.startswith(root)}

    used, missing, bad_shape, flat = set(), [], [], {}
    for rule in table.rules:
        arrays = []
        for src in rule.sources:
            key = next((a for a in src.split("|") if a in sd), None)
            if key is None:
                missing.append(root + src)
                continue
            used.add(key)
            arrays.append(np.asarray(sd[key], np.float32))
        if len(arrays) != len(rule.sources) or rule.target not in expected:
            if rule.target not in expected:
                bad_shape.append(f"{rule.target}: not a parameter of the Flax model")
            continue
        shape = expected[rule.target]
        try:
            value = rule.fn(*arrays, shape=shape)
        except ValueError as e:
            bad_shape.append(f"{rule.target} from {rule.sources}: {e}")
            continue
        if value.shape != shape:
            bad_shape.append(
                f"{rule.target}: checkpoint {rule.sources} gives {value.shape}, model needs {shape}"
            )
        flat[rule.target] = value.astype(np.float32)

    ignore = [re.compile(p) for p in table.ignore]
    unexpected = sorted(
        root + k for k in sd if k not in used and not any(p.search(k) for p in ignore)
    )
    unset = sorted(set(expected) - set(flat) - {r.target for r in table.rules})
    if missing or unexpected or bad_shape or unset:
        parts = [
            f"{label} ({len(names)}): {_first(names)}"
            for label, names in (
                ("missing", list(dict.fromkeys(missing))),  # a key two rules read, once
                ("unexpected", unexpected),
                ("mismatched", bad_shape),
                ("model parameters without a rule", unset),
            )
            if names
        ]
        raise CheckpointError(
            f"checkpoint does not match {source} for {spec} (a checkpoint of another model or "
            f"size?): {'; '.join(parts)}"
        )
    return {"params": flax.traverse_util.unflatten_dict(flat, sep="/")}


def load(path: str | os.PathLike, source: str, spec) -> dict:
    """Reads and converts a checkpoint file; see `state_dict.load_state_dict` and `convert`.

    Raises:
      CheckpointError: naming the file, when it does not match `spec`.
    """
    try:
        return convert(state_dict_io.load_state_dict(path), source, spec)
    except CheckpointError as e:
        raise CheckpointError(f"{os.fspath(path)}: {e}") from e


def _first(names, n: int = 6) -> str:
    """Returns the first `n` of `names`, and how many more there are."""
    more = f" and {len(names) - n} more" if len(names) > n else ""
    return ", ".join(names[:n]) + more


def _module(spec):
    if isinstance(spec, vit.TextSpec):
        return vit.TextTransformer(spec)
    return vit.ViT(spec)


def _expected_shapes(module) -> dict[str, tuple[int, ...]]:
    if isinstance(module, vit.TextTransformer):
        dummy = jax.ShapeDtypeStruct((1, module.spec.max_len), np.int32)
    else:
        p = module.spec.patch_size
        dummy = jax.ShapeDtypeStruct((1, p, p, 3), np.float32)
    shapes = jax.eval_shape(module.init, jax.random.key(0), dummy)["params"]
    flat = flax.traverse_util.flatten_dict(shapes, sep="/")
    return {k: tuple(v.shape) for k, v in flat.items()}


def spec_for(
    source: str, family: str, variant: str, pos_grid: int, proj_dim: int = 0, **overrides
) -> vit.ViTSpec:
    """Returns the `ViTSpec` of a `family` checkpoint read from `source`.

    Some forward conventions belong to the implementation, not the weights: timm resamples
    position embeddings with antialiasing and its SigLIP towers use exact GELU (transformers
    uses the tanh approximation). `overrides` win over both.
    """
    defaults = {}
    if source == "timm":
        defaults["pos_interp"] = "bicubic_aa"
        if family == "siglip":
            defaults["act"] = "gelu"
    defaults.update(overrides)
    return vit.vit_spec(family, variant, pos_grid, proj_dim, **defaults)
