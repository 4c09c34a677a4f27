"""From a job's config (an `ml_collections.ConfigDict`) to the library's settings objects.

The library never reads a config: a job turns its config into frozen settings here, once, and
passes them in. Unknown fields in a settings block are errors that name the field.
"""

import dataclasses
import json

from tailaware.protocol.settings import IntervalSettings, PredictSettings, ProtocolSettings
from tailaware.tail.settings import TailSettings


def block(cls, values, name: str, **overrides):
    """Returns the settings dataclass `cls` built from the config block `values` (named `name`
    in errors; absent fields keep their defaults, `overrides` replace given ones)."""
    given = {} if values is None else dict(values.items())
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(given) - set(fields))
    if unknown:
        raise ValueError(
            f"--config.{name}.{unknown[0]}: unknown field; expected one of {sorted(fields)}"
        )
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items()}
    return cls(**{**values, **overrides})


def tail_settings(config) -> TailSettings:
    """Returns the `TailSettings` of `config.evt`."""
    return block(TailSettings, config.get("evt"), "evt")


def predict_settings(config) -> PredictSettings:
    """Returns the `PredictSettings` of a job config: `estimator`, `k`, `evt`, `protocol` and
    `intervals` (the last three optional blocks)."""
    protocol = config.get("protocol")
    blocks = () if protocol is None else tuple(protocol.get("blocks", ()))
    return PredictSettings(
        estimator=str(config.estimator),
        k=int(config.k),
        tail=tail_settings(config),
        protocol=block(ProtocolSettings, protocol, "protocol", blocks=blocks),
        intervals=block(IntervalSettings, config.get("intervals"), "intervals"),
    )


def metadata(config) -> dict:
    """Returns `config.metadata`, a JSON object kept in the hardness artifact ({} when unset)."""
    text = config.get("metadata", "")
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--config.metadata: not JSON ({e}): {text!r}") from e
    if not isinstance(value, dict):
        raise ValueError(f"--config.metadata: expected a JSON object, got {text!r}")
    return value
