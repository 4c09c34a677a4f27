"""tailaware: predict web-scale retrieval metrics from a small uniform distractor sample.

The package is layered, each subpackage one idea, imports only pointing down
(docs/architecture.md; `make lint` checks it):

  jobs      the launch modes: `run(config, workdir)` turns a config into settings and calls down
  protocol  a prediction with its interval, curve, checks and comparison; validation; outputs
  embed     images and text to descriptors with the Flax backbones
  search | models | data | sim   scoring a feature folder; the backbones; image inputs; the
            simulators with exact truth (siblings: none imports another)
  tail      the hardness estimators: GPD fits, the tail-aware (EVT) estimators, sensitivity
  io        files: sampled scores, hardness artifacts, ILIAS feature folders, atomic writes
  core      the law (expected-rank map, E[AP]), exact metrics, the typed results

The names below are the public API for scripts and notebooks.

Each is imported on first use (PEP 562): `import tailaware`, and the `tailaware` command's
first progress line, come before JAX's import.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tailaware.core.results import Comparison, Hardness, Interval, Prediction
    from tailaware.io.artifact import HardnessArtifact
    from tailaware.io.artifact import load as load_artifact
    from tailaware.io.scores import SampledScores, load_scores, make_scores, save_scores
    from tailaware.protocol.comparison import compare
    from tailaware.protocol.from_artifact import predict as predict_from_artifact
    from tailaware.protocol.prediction import predict
    from tailaware.protocol.schema import prediction_json
    from tailaware.protocol.settings import IntervalSettings, PredictSettings, ProtocolSettings
    from tailaware.tail.estimators import ESTIMATORS
    from tailaware.tail.estimators import estimate as estimate_hardness
    from tailaware.tail.settings import TailSettings

# {public name: (module, name there)}.
_EXPORTS = {
    "Comparison": ("tailaware.core.results", "Comparison"),
    "Hardness": ("tailaware.core.results", "Hardness"),
    "Interval": ("tailaware.core.results", "Interval"),
    "Prediction": ("tailaware.core.results", "Prediction"),
    "HardnessArtifact": ("tailaware.io.artifact", "HardnessArtifact"),
    "load_artifact": ("tailaware.io.artifact", "load"),
    "SampledScores": ("tailaware.io.scores", "SampledScores"),
    "load_scores": ("tailaware.io.scores", "load_scores"),
    "make_scores": ("tailaware.io.scores", "make_scores"),
    "save_scores": ("tailaware.io.scores", "save_scores"),
    "compare": ("tailaware.protocol.comparison", "compare"),
    "predict_from_artifact": ("tailaware.protocol.from_artifact", "predict"),
    "predict": ("tailaware.protocol.prediction", "predict"),
    "prediction_json": ("tailaware.protocol.schema", "prediction_json"),
    "IntervalSettings": ("tailaware.protocol.settings", "IntervalSettings"),
    "PredictSettings": ("tailaware.protocol.settings", "PredictSettings"),
    "ProtocolSettings": ("tailaware.protocol.settings", "ProtocolSettings"),
    "ESTIMATORS": ("tailaware.tail.estimators", "ESTIMATORS"),
    "estimate_hardness": ("tailaware.tail.estimators", "estimate"),
    "TailSettings": ("tailaware.tail.settings", "TailSettings"),
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tailaware' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "ESTIMATORS",
    "Comparison",
    "Hardness",
    "HardnessArtifact",
    "Interval",
    "IntervalSettings",
    "PredictSettings",
    "Prediction",
    "ProtocolSettings",
    "SampledScores",
    "TailSettings",
    "compare",
    "estimate_hardness",
    "load_artifact",
    "load_scores",
    "make_scores",
    "predict",
    "predict_from_artifact",
    "prediction_json",
    "save_scores",
]
