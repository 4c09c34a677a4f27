"""Speed and quality of the vmapped GPD fitter against scipy's `genpareto.fit`, in the same run.

Usage: `python benchmarks/gpd_fit.py [--problems 100000] [--excesses 200] [--scipy 100]`
(about 1-2 minutes on 2 CPU cores). Fits `--problems` random GPD samples (shape uniform in
[-1, 0], some with coefficient of variation > 1) with `tailaware.tail.gpd.fit_batch` (float32, one
jit-compiled vmapped call, compilation excluded) and a subset of `--scipy` of them in a Python
loop of `scipy.stats.genpareto.fit(y, floc=0)`; prints fits/s of both and the ratio (the bar:
>= 300x), and, on the shared subset, the mean and worst log-likelihood difference (ours minus
scipy's, both scored in float64 by scipy; scipy fits with xi outside [-1, 0] or excesses
outside their own support are counted apart, since they leave the constrained problem).
"""

import argparse
import os
import sys
import time

import numpy as np
from scipy import stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from tailaware.tail import gpd  # noqa: E402


def problems(q, n, seed=0):
    """Returns [q, n] float32 excesses: GPD with xi ~ U[-1, 0], every 10th lognormal (CV > 1)."""
    rng = np.random.default_rng(seed)
    xi = rng.uniform(-1.0, 0.0, q)
    sigma = rng.lognormal(0.0, 1.0, q)
    y = stats.genpareto.rvs(xi[:, None], scale=sigma[:, None], size=(q, n), random_state=rng)
    heavy = np.arange(q) % 10 == 9
    y[heavy] = rng.lognormal(0.0, 1.2, (heavy.sum(), n))
    return y.astype(np.float32)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=100_000)
    parser.add_argument("--excesses", type=int, default=200)
    parser.add_argument("--scipy", type=int, default=100, help="problems fitted by scipy")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    y = problems(args.problems, args.excesses)
    y_dev = jax.device_put(jnp.asarray(y))
    mask = jax.device_put(jnp.ones(y.shape, bool))
    jax.block_until_ready(gpd.fit_batch(y_dev, mask))  # compile
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        fit = jax.block_until_ready(gpd.fit_batch(y_dev, mask))
        times.append(time.perf_counter() - t0)
    ours_rate = args.problems / min(times)
    fit = jax.device_get(fit)

    sub = np.linspace(0, args.problems - 1, args.scipy).astype(int)
    params = []
    t0 = time.perf_counter()
    for i in sub:
        c, _, scale = stats.genpareto.fit(y[i], floc=0)
        params.append((c, scale))
    scipy_rate = len(sub) / (time.perf_counter() - t0)

    y64 = y[sub].astype(np.float64)
    ll_ours = np.array(
        [
            stats.genpareto.logpdf(y64[j], fit.xi[i], scale=fit.sigma[i]).sum()
            for j, i in enumerate(sub)
        ]
    )
    ll_scipy = np.array(
        [stats.genpareto.logpdf(y64[j], c, scale=s).sum() for j, (c, s) in enumerate(params)]
    )
    c_scipy = np.array([c for c, _ in params])
    # scipy's logpdf is -inf exactly at the endpoint of a uniform (xi = -1) fit; score those by
    # the uniform density.
    unif = fit.xi[sub] == -1.0
    ll_ours[unif] = -args.excesses * np.log(fit.sigma[sub][unif].astype(np.float64))
    comparable = (c_scipy <= 0) & (c_scipy >= -1) & np.isfinite(ll_scipy)
    diff = ll_ours[comparable] - ll_scipy[comparable]

    print(
        f"problems: {args.problems} x {args.excesses} excesses (float32), scipy subset: {len(sub)}"
    )
    print(f"tailaware.tail.gpd.fit_batch: {ours_rate:12,.0f} fits/s  (best of {args.repeats})")
    print(f"scipy genpareto.fit:     {scipy_rate:12,.1f} fits/s")
    print(f"speed-up: {ours_rate / scipy_rate:,.0f}x  (bar: >= 300x)")
    print(
        f"log-likelihood, ours - scipy, on {comparable.sum()} fits where scipy's xi is in [-1, 0] "
        f"and its fit is feasible: mean {diff.mean():+.4f}, min {diff.min():+.4f}, "
        f"max {diff.max():+.4f}"
    )
    print(
        f"scipy left the constrained problem on {np.sum(c_scipy > 0)} fits (xi > 0) and "
        f"{np.sum(c_scipy < -1)} (xi < -1, where the likelihood is unbounded), and put "
        f"excesses outside its own support on {np.sum(~np.isfinite(ll_scipy))}; ours: "
        f"{np.sum(~np.isfinite(ll_ours))} infeasible, {np.isnan(fit.xi).sum()} NaN, "
        f"{np.mean(fit.converged):.4f} converged"
    )


if __name__ == "__main__":
    main()
