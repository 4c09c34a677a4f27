"""The averaged tail model (`evt_averaged`, the default): the posterior over the GPD shape.

Each query's tail is a posterior over a grid of shapes xi, one hardness atom per xi weighted by
the likelihood with the scale integrated out, under the benchmark's empirical-Bayes prior, at a
threshold selected by a goodness-of-fit test (`evt.posterior`). A positive's point hardness is
the atoms' posterior mean; its threshold reruns rerun the whole posterior
(`evt.threshold_reruns`), and its prior term re-weights the atoms under a flatter and a
steeper prior (`evt.prior_weights`).
"""

import jax
import jax.numpy as jnp

from tailaware.core.results import TailFit
from tailaware.tail import evt
from tailaware.tail.functional import Core
from tailaware.tail.models import Excesses, TailAtoms, TailEstimate, TailModel
from tailaware.tail.settings import TailSettings, averaged_share


def fit(
    c: Core,
    settings: TailSettings,
    default: Excesses,
    *,
    factor: float | jax.Array = 1.0,
    width: int | None = None,
) -> TailAtoms:
    """Returns the posterior's atoms [Q, P, X] and weights [Q, X] at `averaged_share` of the
    default threshold's excesses (`evt.posterior_atoms`; it selects its own threshold); they
    converged where every shape's profile solve did; under `c.prior` where one is given."""
    del default
    return evt.posterior_atoms(
        evt.nan_padded(c),
        c.tail,
        c.s,
        settings,
        factor=factor,
        width=width,
        eb_prior=c.prior,
    )


def reruns(
    c: Core, settings: TailSettings, *, reruns: bool
) -> tuple[TailFit[jax.Array], TailEstimate, TailEstimate | None]:
    """Returns (the fit diagnostics with the posterior's fields, the estimate, its reruns or
    None), traced (`evt.threshold_reruns`)."""
    share = averaged_share(settings)
    diag, main, rest = evt.threshold_reruns(c, settings, AVERAGED, reruns=reruns, share=share)
    q = settings.threshold_quantile
    factors = (1.0, *evt.STABILITY_FACTORS) if reruns else (1.0,)
    width = evt.rerun_width(c.tail, settings, factors, share)
    _, _, default_mask = evt.excesses(c.tail, q, share, width)
    ad, prior = main.atoms.ad, main.atoms.prior
    assert ad is not None and prior is not None  # `evt.posterior_atoms` sets both
    diag = diag._replace(
        n_exceed_posterior=jnp.sum(default_mask, axis=1).astype(c.tail.dtype),
        n_exceed_selected=main.atoms.n_selected,
        ad=ad[0],
        prior_mean=jnp.full_like(diag.u, prior[0]),  # the benchmark's, on every row
        prior_sd=jnp.full_like(diag.u, prior[1]),
    )
    return diag, main, rest


AVERAGED = TailModel("evt_averaged", fit, evt.log_mean, reruns, evt.prior_weights)
