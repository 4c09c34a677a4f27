"""Hardness estimators: a registry of small objects, each estimator defined once.

An estimator turns one sample's inputs (`functional.Core`: each query's top stored scores, the
positives' scores and sampled counts, S) into a posterior over every positive's hardness
x = P(distractor score > s), as weighted atoms (a point estimate is one atom of weight 1). That
traced function (`Estimator.traced`) is the estimator: the nested bootstrap and the budget
check rerun it on resampled and sub-sampled inputs, and the estimate on a sampled-scores file
(`estimate`) runs the same definition, the tail-aware ones with their fit diagnostics and
threshold reruns (`evt.estimate`, built on the same `evt.tail_hardness`).

- `count`: x = K / S, the Krichene-Rendle count estimator specialised to top rank. Blind below
  1 / S: every positive that no sampled distractor beats gets x = 0 (paper Sec. 4).
- `homogeneous`: one x per query, the pooled fraction sum_j K_j / (n_pos S) for every positive
  (the single-x model the paper shows collapsing at large N, Fig. 2).
- `evt`: the paper's tail-aware estimator, the plug-in GPD fit (Appendix B; `tail/plug_in.py`).
- `evt_averaged`: the tail-aware posterior over the GPD shape (the default; `tail/averaged.py`).

To add one, write its traced function and `register` an `Estimator`; a tail-aware one is a tail
model (`tailaware.tail.models.TailModel`) registered with `register(tail_aware(MODEL))`
(docs/architecture.md, "Recipes").
"""

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tailaware.core.results import Hardness
from tailaware.io.scores import SampledScores
from tailaware.tail import averaged, evt, functional, plug_in
from tailaware.tail.models import TailModel
from tailaware.tail.settings import TailSettings

# An estimator's traced definition: (inputs, settings) -> (atoms [Q, P, A], weights [Q, A]).
Traced = Callable[[functional.Core, TailSettings], tuple[jax.Array, jax.Array]]


class Estimator(NamedTuple):
    """A registered hardness estimator.

    Attributes:
      name: its registry key.
      traced: (core: `functional.Core`, settings: `TailSettings`) -> (atoms [Q, P, A], weights
        [Q, A]), pure JAX: the estimator itself, 0 at padding.
      tail: the tail model behind it (`tail_aware`), or None. An estimator with a tail also has
        threshold reruns, the interval's threshold term; one whose model has a prior
        (`TailModel.prior_weights`) also the prior term.
    """

    name: str
    traced: Traced
    tail: TailModel | None = None

    def __call__(self, scores: SampledScores, settings: TailSettings | None = None) -> Hardness:
        """Returns the estimate on `scores` (`estimate`, without reruns)."""
        return estimate(scores, self.name, settings or TailSettings(), reruns=False)


def _one_atom(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    return x[:, :, None], jnp.ones((x.shape[0], 1), x.dtype)


def _count(c: functional.Core, settings: TailSettings) -> tuple[jax.Array, jax.Array]:
    del settings
    return _one_atom(jnp.where(c.mask, c.counts / c.s, 0.0))


def _homogeneous(c: functional.Core, settings: TailSettings) -> tuple[jax.Array, jax.Array]:
    del settings
    k = jnp.sum(jnp.where(c.mask, c.counts, 0.0), axis=1, keepdims=True)
    n = jnp.maximum(jnp.sum(c.mask, axis=1, keepdims=True), 1).astype(c.counts.dtype)
    return _one_atom(jnp.where(c.mask, k / (n * c.s), 0.0))


def _tail(model: TailModel) -> Traced:
    """Returns the traced tail-aware estimator with tail model `model` (`evt.tail_hardness`)."""

    def traced(c: functional.Core, settings: TailSettings) -> tuple[jax.Array, jax.Array]:
        # The threshold at q' of this (sub-)sample's kept scores (`functional.core`).
        est = evt.tail_hardness(c, functional.tail_settings(c, settings), model)
        atoms = evt.priced_atoms(est.atoms.log_atoms, est.priced, c.counts, c.s, c.mask)
        return jnp.where(c.mask[..., None], atoms, 0.0), est.atoms.weights

    return traced


def tail_aware(model: TailModel) -> Estimator:
    """Returns the tail-aware estimator of the tail model `model`, named as the model."""
    return Estimator(model.name, _tail(model), tail=model)


ESTIMATORS: dict[str, Estimator] = {
    e.name: e
    for e in (
        Estimator("count", _count),
        Estimator("homogeneous", _homogeneous),
        tail_aware(plug_in.PLUG_IN),
        tail_aware(averaged.AVERAGED),
    )
}


def register(estimator: Estimator) -> Estimator:
    """Registers `estimator` under its name (the estimate, the nested bootstrap, the budget
    check, the artifact and every job then take it by that name); returns it."""
    ESTIMATORS[estimator.name] = estimator
    return estimator


def get(name: str) -> Estimator:
    """Returns the estimator called `name`."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r}; choose one of {sorted(ESTIMATORS)}")
    return ESTIMATORS[name]


def tail_model(name: str) -> TailModel | None:
    """Returns the tail model behind an estimator name, None without one (count, homogeneous):
    the estimators whose intervals have threshold terms."""
    return get(name).tail


def tail_models() -> tuple[TailModel, ...]:
    """Returns the registered tail models, in registration order."""
    return tuple(e.tail for e in ESTIMATORS.values() if e.tail is not None)


count, homogeneous = ESTIMATORS["count"], ESTIMATORS["homogeneous"]


@functools.partial(jax.jit, static_argnames=("traced", "settings"))
def _run(c: functional.Core, traced: Traced, settings: TailSettings) -> tuple[jax.Array, jax.Array]:
    atoms, weights = traced(c, settings)
    return functional.deplete(atoms, c.depleted), weights


def estimate(
    scores: SampledScores,
    name: str,
    settings: TailSettings,
    reruns: bool = True,
    prior: np.ndarray | None = None,
) -> Hardness:
    """Returns estimator `name`'s `Hardness` on `scores`.

    A tail-aware estimator returns its fit diagnostics and, with `reruns`, its threshold reruns
    and prior terms (`evt.estimate`: what the reported interval needs); the others run their
    traced definition on the whole sample. `prior`: an empirical-Bayes prior's (mean, sd) to use
    instead of the one the sample fits (the averaged estimator's; the others have none).
    """
    est = get(name)
    if est.tail is not None:
        return evt.estimate(scores, settings, est.tail, reruns=reruns, prior=prior)
    atoms, _ = jax.device_get(_run(functional.core(scores, settings), est.traced, settings))
    mask = scores.mask
    return Hardness(
        x=np.where(mask, np.asarray(atoms[..., 0], np.float64), 0.0),
        mask=mask,
        tail_priced=np.zeros_like(mask),
    )
