"""The plug-in tail model (`evt`, the paper's Appendix B): one GPD fit per query.

Each query's excesses over its threshold at the q-quantile are fitted by maximum likelihood
(`gpd.fit`, xi in [-1, 0]) and a positive priced by that one fit (`evt.gpd_log_x`, eq. B.1):
one atom of weight 1, 0 beyond the fitted endpoint. Its threshold reruns are the fit
diagnostics' threshold-stability refits (`evt.stability_fits`), so they cost no fit of their
own. It has no prior, so no prior term.
"""

import jax
import jax.numpy as jnp

from tailaware.core.results import TailFit
from tailaware.tail import evt, gpd
from tailaware.tail.functional import Core
from tailaware.tail.models import Excesses, TailAtoms, TailEstimate, TailModel
from tailaware.tail.settings import TailSettings


def fit(
    c: Core,
    settings: TailSettings,
    default: Excesses,
    *,
    factor: float | jax.Array = 1.0,
    width: int | None = None,
) -> TailAtoms:
    """Returns the plug-in's one atom [Q, P, 1] of weight 1: the GPD fitted to `default`,
    converged where its Newton refinement did (`gpd.GPDFit.newton_converged`)."""
    del settings, factor, width  # the default threshold's excesses are all it reads
    g = jax.vmap(gpd.fit)(default.y, default.mask)
    log_x = evt.plug_in_log_x(evt.nan_padded(c), default.u, default.mask, c.s, g.xi, g.sigma)
    ones = jnp.ones((c.tail.shape[0], 1), c.tail.dtype)
    return TailAtoms(log_x[..., None], ones, g.newton_converged)


def price(log_atoms: jax.Array, weights: jax.Array) -> jax.Array:
    """Returns the one atom's log hardness [Q, P]."""
    del weights
    return log_atoms[..., 0]


def reruns(
    c: Core, settings: TailSettings, *, reruns: bool
) -> tuple[TailFit[jax.Array], TailEstimate, TailEstimate | None]:
    """Returns (the fit diagnostics, the estimate, its reruns or None), traced.

    The main fit stays unpadded, bit for bit the one `evt.tail_hardness` makes (a padded one may
    differ by float rounding, which can tip a flat profile); the reruns price with the
    threshold-stability refits.
    """
    u, fit_main, others, refits = evt.stability_fits(
        c.tail, settings.threshold_quantile, stack_main=False
    )
    diag = evt.tail_fit(u, fit_main, refits)
    main = evt.tail_hardness(c, settings, PLUG_IN)
    if not reruns:
        return diag, main, None
    pos_nan = evt.nan_padded(c)
    reps = []
    for (u_f, _, mask_f), refit in zip(others, refits, strict=True):
        log_f = evt.plug_in_log_x(pos_nan, u_f, mask_f, c.s, refit.xi, refit.sigma)
        fitted = jnp.any(mask_f, axis=1)
        priced = evt.tail_priced(c.mask, c.pos, c.counts, u_f, fitted, settings.min_count)
        atoms = TailAtoms(log_f[..., None], main.atoms.weights, refit.newton_converged)
        reps.append(TailEstimate(atoms, priced, u_f, fitted))
    return diag, main, jax.tree.map(lambda *a: jnp.stack(a), *reps)


PLUG_IN = TailModel("evt", fit, price, reruns)
