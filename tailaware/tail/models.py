"""Tail models: how a query's excesses over its threshold price the positives beyond the sample.

A tail model is a `TailModel`, a small NamedTuple of functions, one per role, each role typed by
its own Protocol (after optax's `GradientTransformation` of `init` and `update`):

- `fit` (`FitFn`): traced, the tail of one (sub-)sample at one threshold as hardness atoms: each
  positive's log hardness under every atom and the atoms' weights (`TailAtoms`; one atom of
  weight 1 for a point fit). The estimate, its reruns, the nested bootstrap and the budget check
  all run it, through `evt.tail_hardness`.
- `price` (`PriceFn`): the point log hardness [Q, P] of those atoms: `evt.log_tail_prob`, what
  the sensitivities differentiate.
- `reruns` (`RerunsFn`, optional): traced, the estimate of a whole sample with its fit
  diagnostics and, when asked, its threshold reruns (the interval's threshold term); by default
  `evt.threshold_reruns`, which reruns `fit` at each threshold.
- `prior_weights` (`PriorFn`, optional): the atoms' weights under a flatter and a steeper prior
  (the interval's prior term); None for a model without a prior.

A tail model becomes an estimator by registration (`tailaware.tail.estimators.tail_aware`):
`evt` (`tail/plug_in.py`) and `evt_averaged` (`tail/averaged.py`); docs/architecture.md,
"Recipes", adds one.

Shapes: Q queries, P positives (padded), A atoms, W excess slots, F threshold reruns.
"""

from typing import NamedTuple, Protocol

import jax
import numpy as np

from tailaware.core.results import TailFit
from tailaware.tail.functional import Core
from tailaware.tail.settings import TailSettings


class Excesses(NamedTuple):
    """A threshold and the excesses over it (`evt.excesses`): u [Q], y [Q, W], mask [Q, W]."""

    u: jax.Array
    y: jax.Array
    mask: jax.Array


class TailAtoms(NamedTuple):
    """A tail model's fit of one sample at one threshold (`FitFn`).

    Attributes:
      log_atoms: [Q, P, A] each positive's log hardness under each atom (-inf at padding).
      weights: [Q, A] the atoms' weights (rows sum to 1).
      converged: [Q] every iterative solve behind the atoms converged (`gpd.NewtonState`; True
        where none was needed).
      n_selected, ad, prior: the averaged model's selected excess count [Q], its threshold
        candidates' Anderson-Darling statistics [F, Q] and its empirical-Bayes prior's (mean,
        sd); None for other models.
    """

    log_atoms: jax.Array
    weights: jax.Array
    converged: jax.Array
    n_selected: jax.Array | None = None
    ad: jax.Array | None = None
    prior: jax.Array | None = None


class TailEstimate(NamedTuple):
    """`evt.tail_hardness`' traced result: the model's atoms and which positives they price.

    Attributes:
      atoms: the model's `TailAtoms`.
      priced: [Q, P] which positives the tail prices (`evt.tail_priced`); the others keep their
        counts (`evt.priced_atoms`).
      u: [Q] the default threshold (it decides which positives the tail prices).
      fitted: [Q] some stored score lies above u.
    """

    atoms: TailAtoms
    priced: jax.Array
    u: jax.Array
    fitted: jax.Array


class FitFn(Protocol):
    """`fit(c, settings, default, *, factor, width) -> TailAtoms`, traced.

    `c`: the sample's inputs (`functional.Core`; its threshold quantile already in `settings`);
    `default`: the excesses over the default threshold (`evt.excesses` at `factor`, in `width`
    slots), which a model may fit or replace by its own threshold's.
    """

    def __call__(
        self,
        c: Core,
        settings: TailSettings,
        default: Excesses,
        *,
        factor: float | jax.Array,
        width: int | None,
    ) -> TailAtoms: ...


class PriceFn(Protocol):
    """`price(log_atoms [Q, P, A], weights [Q, A]) -> log hardness [Q, P]`, traced."""

    def __call__(self, log_atoms: jax.Array, weights: jax.Array) -> jax.Array: ...


class RerunsFn(Protocol):
    """`reruns(c, settings, *, reruns) -> (fit diagnostics, the estimate, its reruns)`, traced.

    The reruns are the estimate with the excess count scaled by each of `evt.STABILITY_FACTORS`,
    stacked on a leading [F] axis, or None when `reruns` is False.
    """

    def __call__(
        self, c: Core, settings: TailSettings, *, reruns: bool
    ) -> tuple[TailFit[jax.Array], TailEstimate, TailEstimate | None]: ...


class PriorFn(Protocol):
    """`prior_weights(weights [Q, A], settings) -> [T, Q, A]`, float64 on the host."""

    def __call__(self, weights: np.ndarray, settings: TailSettings) -> np.ndarray: ...


class TailModel(NamedTuple):
    """A tail model, one function per role (the module docstring). Hashable: jitted functions
    take it as a static argument.

    Attributes:
      name: the name of the estimator it registers as.
      fit, price, reruns, prior_weights: its roles (`reruns` None: `evt.threshold_reruns`).
    """

    name: str
    fit: FitFn
    price: PriceFn
    reruns: RerunsFn | None = None
    prior_weights: PriorFn | None = None
