"""Hardness estimators: from a distractor sample to per-positive hardness x = P(score > s).

Each estimator maps a `SampledScores` and the `TailSettings` to a `Hardness`; the law then turns
it into mAP@k at any gallery size. The simple ones live here; the tail-aware (EVT) ones in
`evt.py`.

- `count`: x = K / S, the Krichene-Rendle count estimator specialised to top rank. Blind below
  1 / S: every positive that no sampled distractor beats gets x = 0 (paper Sec. 4).
- `homogeneous`: one x per query, the pooled fraction sum_j K_j / (n_pos S) for every positive
  (the single-x model the paper shows collapsing at large N, Fig. 2).
- `evt`, `evt_averaged`: the tail-aware estimators (`evt.evt`, `evt.evt_averaged`).
"""

from collections.abc import Callable

import numpy as np

from tailaware.core.results import Hardness
from tailaware.io.scores import SampledScores
from tailaware.tail import evt
from tailaware.tail.settings import TailSettings


def count(scores: SampledScores, settings: TailSettings | None = None) -> Hardness:
    """Returns x = K / S (the count estimator)."""
    del settings
    mask = scores.mask
    x = np.where(mask, scores.pos_counts, 0) / float(scores.n_sample)
    return Hardness(x, mask, np.zeros_like(mask), {})


def homogeneous(scores: SampledScores, settings: TailSettings | None = None) -> Hardness:
    """Returns one pooled hardness per query, sum_j K_j / (n_pos S), for all its positives."""
    del settings
    mask = scores.mask
    k = np.where(mask, scores.pos_counts, 0).sum(axis=1)
    xq = k / (mask.sum(axis=1) * float(scores.n_sample))
    x = np.where(mask, xq[:, None], 0.0)
    return Hardness(x, mask, np.zeros_like(mask), {})


ESTIMATORS: dict[str, Callable[[SampledScores, TailSettings], Hardness]] = {
    "count": count,
    "homogeneous": homogeneous,
    "evt": evt.evt,
    "evt_averaged": evt.evt_averaged,
}


def get(name: str) -> Callable[[SampledScores, TailSettings], Hardness]:
    """Returns the estimator called `name`."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r}; choose one of {sorted(ESTIMATORS)}")
    return ESTIMATORS[name]


def tail_method(name: str) -> str | None:
    """Returns the tail model (`evt.METHODS`) behind an estimator name, None without one (count,
    homogeneous): the estimators whose intervals have threshold and distractor terms."""
    get(name)
    return evt.ESTIMATOR_METHODS.get(name)


def estimate(scores: SampledScores, name: str, settings: TailSettings) -> Hardness:
    """Returns estimator `name`'s `Hardness`, with its threshold reruns (and prior terms) when it
    has a tail model (one compiled program, `evt.estimate`): what the reported interval needs."""
    method = tail_method(name)
    if method is None:
        return get(name)(scores, settings)
    return evt.estimate(scores, settings, method, reruns=True)
