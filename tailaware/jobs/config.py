"""From a job's config (an `ml_collections.ConfigDict`) to the library's settings objects.

The library never reads a config: a job turns its config into frozen settings here, once, and
passes them in. Every job checks its config up front (`check_predict`, `check_ilias`, ...,
built on `check`): a value out of range, an unknown field in a settings block or a settings
object that refuses its values is an `InputError` naming the flag (`--config.k`) and what was
expected, before any file is read or any work is done.
"""

import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

from tailaware.core import metrics as core_metrics
from tailaware.io import reference_counts
from tailaware.io.errors import InputError, MissingInput
from tailaware.protocol import reference
from tailaware.protocol.settings import IntervalSettings, PredictSettings, ProtocolSettings
from tailaware.protocol.validation import ValidationSettings
from tailaware.tail.estimators import ESTIMATORS
from tailaware.tail.settings import TailSettings

# The largest cut-off k a job accepts: the law's table of E[1{a + K <= k} / (a + K)]
# (`core.law.gain_table`) takes 4096 x k doubles and a k x k product to build, in a time
# and memory that rule out larger k (benchmarks/README.md, "Job runtimes").
MAX_K = 10_000

# The config blocks that hold a settings object's fields (`configs/default.py`,
# `settings_block`), by block name: each field's meaning is in the class's docstring.
SETTINGS_BLOCKS = {
    "evt": TailSettings,
    "protocol": ProtocolSettings,
    "intervals": IntervalSettings,
    "validate": ValidationSettings,
}


def fail(flag: str, expected: str, got=None) -> InputError:
    """Returns the `InputError` "--config.FLAG: expected EXPECTED, got GOT"."""
    return InputError(
        f"--config.{flag}: expected {expected}" + ("" if got is None else f", got {got!r}")
    )


def check(config, flag: str, ok: Callable[[Any], bool], expected: str):
    """Returns the config's value at the dotted `flag` (e.g. "demo.sample_fraction") when
    `ok(value)`, else raises the `InputError` naming the flag and `expected`."""
    value = config
    for part in flag.split("."):
        value = value.get(part) if hasattr(value, "get") else None
    try:
        good = bool(ok(value))
    except (TypeError, ValueError):
        good = False
    if not good:
        raise fail(flag, expected, value)
    return value


def at_least(low: float) -> Callable[[Any], bool]:
    """Returns a check: an int (a float where `low` is one) >= low."""
    kinds = (int, float) if isinstance(low, float) else (int,)
    return lambda v: isinstance(v, kinds) and not isinstance(v, bool) and v >= low


def fraction(v) -> bool:
    """Returns whether `v` is a share in (0, 1]."""
    return isinstance(v, int | float) and not isinstance(v, bool) and 0.0 < v <= 1.0


def one_of(choices) -> Callable[[Any], bool]:
    """Returns a check: one of `choices`."""
    return lambda v: v in choices


def existing_file(flag: str, path: str, what: str) -> str:
    """Returns `path` when it is a file, else raises `MissingInput` naming the flag."""
    if not os.path.isfile(path):
        there = "a folder" if os.path.isdir(path) else "no such file"
        raise MissingInput(f"--config.{flag}={path}: {there}; expected {what}")
    return path


def existing_folder(flag: str, path: str, what: str) -> str:
    """Returns `path` when it is a folder, else raises `MissingInput` naming the flag."""
    if not path or not os.path.isdir(path):
        raise MissingInput(f"--config.{flag}={path!r}: no such folder; expected {what}")
    return path


def block(cls, values, name: str, **overrides):
    """Returns the settings dataclass `cls` built from the config block `values` (named `name`
    in errors; absent fields keep their defaults, `overrides` replace given ones).

    Raises:
      InputError: naming `--config.NAME.FIELD` for an unknown field or a value `cls` refuses.
    """
    given = {} if values is None else dict(values.items())
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(given) - set(fields))
    if unknown:
        raise InputError(
            f"--config.{name}.{unknown[0]}: unknown field; expected one of {sorted(fields)}"
        )
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items()}
    try:
        return cls(**{**values, **overrides})
    except (TypeError, ValueError) as e:  # the settings' own checks (`__post_init__`)
        field = str(e).split(" ", 1)[0]
        flag = f"{name}.{field}" if field in fields else name
        raise InputError(f"--config.{flag}: {e}") from e


def tail_settings(config) -> TailSettings:
    """Returns the `TailSettings` of `config.evt`."""
    return block(TailSettings, config.get("evt"), "evt")


def metric_names(value) -> tuple[str, ...]:
    """Returns the metric names of `config.metrics`: a tuple ("('map','recall')") or one
    comma-separated string ("map,recall,map_at_r,r_precision", which the flag parser passes as
    a tuple of that one string)."""
    items = (value,) if isinstance(value, str) else tuple(value)
    return tuple(n.strip() for item in items for n in str(item).split(",") if n.strip())


def predict_settings(config) -> PredictSettings:
    """Returns the `PredictSettings` of a job config: `estimator`, `k`, `metrics`, `evt`,
    `protocol` and `intervals` (the last three optional blocks), each checked (`InputError`
    naming the flag)."""
    check(config, "estimator", one_of(ESTIMATORS), f"one of {sorted(ESTIMATORS)}")
    check(config, "k", lambda k: at_least(1)(k) and k <= MAX_K, f"1 <= k <= {MAX_K:,}")
    names = metric_names(config.get("metrics", PredictSettings.metrics))
    known = core_metrics.METRICS  # read now: a metric registered after import counts
    check(
        config,
        "metrics",
        lambda v: v is None or all(n in known for n in names),
        f"names of {sorted(known)}, e.g. map,recall,map_at_r,r_precision",
    )
    protocol = config.get("protocol")
    blocks = () if protocol is None else tuple(protocol.get("blocks", ()))
    return PredictSettings(
        estimator=str(config.estimator),
        k=int(config.k),
        tail=tail_settings(config),
        protocol=block(ProtocolSettings, protocol, "protocol", blocks=blocks),
        intervals=block(IntervalSettings, config.get("intervals"), "intervals"),
        metrics=names,
    )


def check_predict(config) -> PredictSettings:
    """Checks the predict job's config; returns its settings."""
    scores, art = config.get("scores", ""), config.get("artifact", "")
    if bool(scores) == bool(art):
        raise InputError(
            "--config.scores / --config.artifact: expected exactly one: a sampled-scores .npz "
            "file or a hardness artifact .npz"
        )
    check(config, "n_target", at_least(1), "the target gallery size N >= 1")
    settings = predict_settings(config)
    for i, block_file in enumerate(settings.protocol.blocks):
        existing_file(f"protocol.blocks[{i}]", block_file, "a sampled-scores .npz file")
    if scores:
        existing_file("scores", scores, "a sampled-scores .npz file")
    else:
        existing_file("artifact", art, "a hardness artifact .npz (a predict job's hardness.npz)")
        if config.get("reference", ""):
            raise InputError("--config.reference: needs --config.scores, not an artifact")
    check_reference(config)
    metadata(config)
    return settings


def check_reference(config) -> None:
    """Checks the reference flags: both files or neither, and replicates >= 2."""
    ref, ref_scores = config.get("reference", ""), config.get("reference_scores", "")
    if bool(ref) != bool(ref_scores):
        raise InputError(
            "--config.reference / --config.reference_scores: expected both: a reference-counts "
            ".npz (an exact ILIAS run's reference_counts.npz) and that model's sampled-scores "
            ".npz of the same sample"
        )
    if ref:
        existing_file("reference", ref, "a reference-counts .npz file")
        existing_file("reference_scores", ref_scores, "a sampled-scores .npz file")
        check(config, "reference_replicates", at_least(2), "replicates >= 2")


def reference_inputs(config, scores, settings: PredictSettings, n_target: int):
    """Returns the reference's checked inputs (`reference.load_inputs`), or None without one."""
    if not config.get("reference", ""):
        return None
    return reference.load_inputs(
        config.reference,
        config.reference_scores,
        scores,
        k=settings.k,
        n_target=n_target,
        settings=reference.ReferenceSettings(
            replicates=int(config.reference_replicates), seed=int(config.get("seed", 0))
        ),
    )


def check_ilias(config, queries, backends) -> PredictSettings:
    """Checks the ILIAS job's config (`queries`: the query sets, `backends`: the scoring
    backends); returns its settings."""
    existing_folder("features", config.get("features", ""), "an ILIAS-format feature folder")
    check(config, "queries", one_of(queries), f"one of {sorted(queries)}")
    check(config, "sample_fraction", fraction, "a share of the distractors in (0, 1]")
    check(config, "min_sample", at_least(0), "a number of sampled distractors >= 0 (0: any)")
    check(config, "n_target", at_least(0), "N >= 1, or 0 for the number of distractors")
    check(config, "backend", one_of(("auto", *backends)), f"'auto' or one of {list(backends)}")
    dtypes = ("float16", "bfloat16", "float32")
    check(config, "matmul_dtype", one_of(dtypes), f"one of {list(dtypes)}")
    check(config, "block_size", at_least(1), "rows per block >= 1")
    check(config, "expected_shards", at_least(0), "a number of shards >= 0 (0: any)")
    check(config, "checkpoint_every_s", at_least(0.0), "seconds >= 0")
    check(config, "seed", at_least(0), "a seed >= 0")
    check_reference(config)
    check_proxy(config)
    for flag, what in (
        ("positive_info", "positive_ids.txt, CSV id,scale,clutter"),
        ("taxonomy", "a taxonomy JSON: category -> subcategory -> sub-subcategory -> [names]"),
    ):
        if config.get(flag, ""):
            existing_file(flag, config.get(flag), what)
    settings = predict_settings(config)
    metadata(config)
    return settings


# What `--config.proxy` names, for messages.
PROXY = "a similarity file (.pkl or .json, the official layout) or an ILIAS-format feature folder"


def proxy_paths(config) -> list[str]:
    """Returns `config.proxy`'s similarity files and feature folders (comma-separated), in order."""
    return [p.strip() for p in str(config.get("proxy", "")).split(",") if p.strip()]


def check_proxy(config) -> None:
    """Checks the census flags: the proxies exist, a sampled run, the depth rule's inputs and,
    for a feature folder, its list depth."""
    paths = proxy_paths(config)
    if not paths:
        return
    if float(config.sample_fraction) >= 1.0:
        raise fail("proxy", "a sampled run (sample_fraction < 1); an exact run needs no census")
    for path in paths:
        if not os.path.isdir(path):
            existing_file("proxy", path, PROXY)
    share, depth = census_options(config)
    if not 0.0 <= share < 1.0:
        raise fail("census_share", "a share of the budget in [0, 1)", share)
    if depth < 0:
        raise fail("census_depth", "a rank >= 1, or 0 for the rule", depth)
    if any(os.path.isdir(p) for p in paths):
        k = check(config, "proxy_depth", at_least(1), "a list depth >= 1")
        if depth > k:
            raise fail("proxy_depth", f"at least --config.census_depth = {depth}", k)


def census_options(config) -> tuple[float, int]:
    """Returns (census_share, census_depth), with configs/ilias.py's defaults (0.5, 0)."""
    return float(config.get("census_share", 0.5)), int(config.get("census_depth", 0))


def check_compare(config) -> None:
    """Checks the compare job's config (its inputs and the paired bootstrap)."""
    for name in ("a", "b"):
        path = config.get(name, "")
        if not path:
            raise fail(name, "a prediction.json or hardness.npz (the predict job's)")
        existing_file(name, path, "a prediction.json or hardness.npz (the predict job's)")
        if path.endswith(".npz") and not reference_counts.looks_like(path):
            check(config, "n_target", at_least(1), "N >= 1, the N to compare hardness artifacts at")
    check(config, "replicates", at_least(1), "bootstrap replicates >= 1")
    predict_settings(config)


def check_demo(config) -> TailSettings:
    """Checks the demo's config (its synthetic benchmark); returns its tail settings."""
    for name in ("n_instances", "queries_per_instance", "positives_per_instance"):
        check(config, f"demo.{name}", at_least(1), "an integer >= 1")
    check(config, "demo.n_distractors", at_least(1), "an integer >= 1")
    check(config, "demo.dim", at_least(2), "a dimension >= 2")
    check(config, "demo.sample_fraction", fraction, "a share of the distractors in (0, 1]")
    check(
        config,
        "demo.sizes",
        lambda v: len(v) > 0 and all(at_least(1)(s) for s in v),
        "a tuple of gallery sizes >= 1",
    )
    check(config, "k", lambda k: at_least(1)(k) and k <= MAX_K, f"1 <= k <= {MAX_K:,}")
    check(config, "seed", at_least(0), "a seed >= 0")
    return tail_settings(config)


def check_embed(config, sources, families) -> None:
    """Checks the embed job's config (`sources`: the checkpoint name tables, `families`: the
    backbone families)."""
    inputs = ("ilias_core", "folder", "tars", "tfds")
    kind = check(config, "embed.input", one_of(inputs), f"one of {list(inputs)}")
    if kind in ("ilias_core", "folder"):
        existing_folder("embed.folder", config.embed.folder, "the folder of the images")
    if kind == "tars":
        check(config, "embed.tars", lambda v: bool(v), "a glob of webdataset tar shards")
    check(config, "embed.sample_fraction", fraction, "a share of the ids in (0, 1]")
    for name in ("batch_size", "tars_per_file", "num_buckets", "workers"):
        check(config, f"embed.{name}", at_least(1), "an integer >= 1")
    check(config, "embed.first_file", at_least(0), "a shard number >= 0")
    check(config, "embed.log_every_s", at_least(0.0), "seconds >= 0")
    check(config, "model.source", one_of(sources), f"one of {sorted(sources)}")
    check(config, "model.family", one_of(families), f"one of {sorted(families)}")
    check(config, "model.resolution", at_least(1), "pixels >= 1")
    dtypes = ("auto", "float32", "bfloat16", "float16")
    check(config, "model.dtype", one_of(dtypes), f"one of {list(dtypes)}")
    if config.model.checkpoint:
        existing_file("model.checkpoint", config.model.checkpoint, "a .safetensors/.bin/.pth file")
    if kind == "ilias_core" and config.text.checkpoint:
        existing_file("text.checkpoint", config.text.checkpoint, "the text tower's weights")
        existing_file("text.tokenizer", config.text.tokenizer, "its tokenizer.json")
        check(config, "text.max_len", at_least(1), "tokens >= 1")


def metadata(config) -> dict:
    """Returns `config.metadata`, a JSON object kept in the hardness artifact ({} when unset)."""
    text = config.get("metadata", "")
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"--config.metadata: not JSON ({e}): {text!r}") from e
    if not isinstance(value, dict):
        raise InputError(f"--config.metadata: expected a JSON object, got {text!r}")
    return value
