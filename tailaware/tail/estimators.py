"""Hardness estimators: from a distractor sample to per-positive hardness x = P(score > s).

Each estimator maps a `SampledScores` and the config to a `Hardness`; the law then turns it into
mAP@k at any gallery size. The simple ones live here; the tail-aware (EVT) ones in `hardness.py`.

- `count`: x = K / S, the Krichene-Rendle count estimator specialised to top rank. Blind below
  1 / S: every positive that no sampled distractor beats gets x = 0 (paper Sec. 4).
- `homogeneous`: one x per query, the pooled fraction sum_j K_j / (n_pos S) for every positive
  (the single-x model the paper shows collapsing at large N, Fig. 2).
"""

import importlib
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from tailaware.io.scores import SampledScores


class Hardness(NamedTuple):
    """Per-positive hardness with its provenance.

    Attributes:
      x: [Q, P] float64 hardness in [0, 1]; 0 at padding.
      mask: [Q, P] bool, real positives.
      tail_priced: [Q, P] bool, positives priced by a fitted tail rather than by the count.
      info: per-query diagnostics, name -> [Q] array.
      atoms: None, or [Q, P, A] float64 atoms of a posterior over each positive's hardness
        (the law's predictions average over them, `law.expected_map`); `x` is then its mean.
      weights: [Q, A] atom weights (rows sum to 1) when `atoms` is set.
      reruns: the estimate rerun at other tail thresholds, when asked for
        (`tailaware.tail.evt.estimate`); empty otherwise.
      prior_weights: None, or [T, Q, A] the weights of `atoms` under other priors on the tail
        shape (`tailaware.tail.evt.prior_weights`), asked for with the reruns.
    """

    x: np.ndarray
    mask: np.ndarray
    tail_priced: np.ndarray
    info: dict
    atoms: np.ndarray | None = None
    weights: np.ndarray | None = None
    reruns: tuple = ()
    prior_weights: np.ndarray | None = None


def count(scores: SampledScores, config=None) -> Hardness:
    """Returns x = K / S (the count estimator)."""
    del config
    mask = scores.mask
    x = np.where(mask, scores.pos_counts, 0) / float(scores.n_sample)
    return Hardness(x, mask, np.zeros_like(mask), {})


def homogeneous(scores: SampledScores, config=None) -> Hardness:
    """Returns one pooled hardness per query, sum_j K_j / (n_pos S), for all its positives."""
    del config
    mask = scores.mask
    k = np.where(mask, scores.pos_counts, 0).sum(axis=1)
    xq = k / (mask.sum(axis=1) * float(scores.n_sample))
    x = np.where(mask, xq[:, None], 0.0)
    return Hardness(x, mask, np.zeros_like(mask), {})


# Name -> function, or "module:function" imported on first use.
ESTIMATORS: dict[str, Callable | str] = {
    "count": count,
    "homogeneous": homogeneous,
    "evt": "tailaware.tail.evt:evt",
    "evt_averaged": "tailaware.tail.evt:evt_averaged",
}


def get(name: str) -> Callable[..., Hardness]:
    """Returns the estimator called `name`."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r}; choose one of {sorted(ESTIMATORS)}")
    fn = ESTIMATORS[name]
    if isinstance(fn, str):
        module, attr = fn.split(":")
        fn = getattr(importlib.import_module(module), attr)
    return fn


def available() -> list[str]:
    """Returns the registered estimators that import (the EVT ones need `tailaware.tail.evt`)."""
    names = []
    for name in ESTIMATORS:
        try:
            get(name)
        except (ImportError, AttributeError):
            continue
        names.append(name)
    return names
