# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 2. Tail fits: pricing what the sample cannot see
#
# [Open in Colab](https://colab.research.google.com/github/tailaware/tailaware/blob/main/notebooks/02_tail_fits.ipynb)
#
# A positive that no sampled distractor beats has hardness below about 1 / S, and the count
# estimator prices it at 0. The tail-aware estimator (paper App. B) fits a generalized Pareto
# distribution (GPD, shape xi <= 0 because cosine scores are bounded) to each query's top
# sampled scores over a threshold u and prices such a positive at
# x = (n_u / S) P(Y > s - u). This notebook looks at those fits on a synthetic benchmark with
# known truth: the per-query fits, their stability under a moved threshold, the immune-positive
# problem (fits whose endpoint falls below a real positive) and the variant that averages over
# the shape instead of plugging in the maximum-likelihood fit, so it returns a hard 0 only at a
# score of 1 (the cosine bound).

# %%
import os
import sys

if "google.colab" in sys.modules:  # fetch and install the repository, then work from its root
    # !git clone -q --depth 1 https://github.com/tailaware/tailaware
    # %pip install -q -e tailaware
    os.chdir("tailaware")
elif os.path.basename(os.getcwd()) == "notebooks":
    os.chdir("..")  # the configs live at the repository root

# %%
# %matplotlib inline
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import tailaware as ta
from tailaware.core import evaluate, metrics
from tailaware.protocol import baselines
from tailaware.sim import simulate, synthetic
from tailaware.tail import estimators, evt, gpd

# %% [markdown]
# ## The benchmark, its sample and the truth
#
# 60 queries with 5 positives each against 200k distractors; a uniform 5% sample (10k). The
# truth hardness of a positive is the share of all 200k distractors above it.

# %%
settings = ta.TailSettings(top_m=1000)  # kept scores per query (the paper keeps 4000 of 5M)
k, n_full = 1000, 200_000
bench = synthetic.make_benchmark(
    n_instances=60, queries_per_instance=1, positives_per_instance=5, n_distractors=n_full, dim=64
)
truth_counts, scores = synthetic.score(bench, [n_full], fraction=0.05, top_m=1000, seed=0)
mask = scores.mask
x_true = np.where(mask, truth_counts[n_full], 0) / n_full
s = scores.n_sample
print(
    f"S = {s:,}; positives no sampled distractor beats: {(scores.pos_counts[mask] == 0).mean():.0%}"
)

# %% [markdown]
# ## Per-query GPD fits
#
# `evt.diagnostics` fits every query at once (a vmapped, pure-JAX maximum-likelihood fit,
# `gpd.fit`). Many fits land on a boundary of the constraint set: xi = 0 (an exponential tail)
# or xi = -1 (a uniform one).

# %%
tail = np.asarray(scores.tail_scores[:, : settings.top_m])
q = settings.threshold_quantile
fit = evt.diagnostics(tail, q)
print(
    f"excesses per fit: {int(np.median(fit.n_exceed))}; xi = 0: {fit.at_xi0.mean():.0%}, "
    f"xi = -1: {fit.at_xi_minus1.mean():.0%}, converged: {fit.converged.mean():.0%}"
)
plt.figure(figsize=(5, 3))
plt.hist(fit.xi, bins=20)
plt.xlabel("fitted xi")
plt.ylabel("queries")
plt.show()

# %% [markdown]
# Three queries: the sampled scores' empirical survival (rank / S), the fitted tail
# (n_u / S) P(Y > s - u), and the positives at their true hardness. Positives to the right of
# the last sampled score are the ones only the tail can price.

# %%
fig, axes = plt.subplots(1, 3, figsize=(13, 3.5), sharey=True)
# Three queries with positives in the tail, from the most negative fitted xi to the least.
in_tail = mask & (scores.pos_counts < settings.min_count) & (x_true > 0)
candidates = np.flatnonzero(in_tail.sum(axis=1) >= 2)
candidates = candidates[np.argsort(fit.xi[candidates])]
examples = candidates[[0, len(candidates) // 2, -1]]
for ax, qi in zip(axes, examples, strict=True):
    kept = tail[qi][np.isfinite(tail[qi])]
    ax.plot(kept, np.arange(1, len(kept) + 1) / s, ".", ms=2, label="sample")
    grid = np.linspace(fit.u[qi], max(kept.max(), np.nanmax(scores.pos_scores[qi])) + 0.02, 200)
    log_s = gpd.log_survival(jnp.asarray(grid - fit.u[qi]), fit.xi[qi], fit.sigma[qi])
    ax.plot(grid, fit.n_exceed[qi] / s * np.exp(np.asarray(log_s)), label="fitted tail")
    real = mask[qi] & (x_true[qi] > 0)
    ax.plot(scores.pos_scores[qi][real], x_true[qi][real], "k*", ms=9, label="positives (truth)")
    ax.axvline(fit.u[qi], color="gray", lw=0.5)
    ax.set(yscale="log", ylim=(0.1 / n_full, 0.2), xlabel="score")
    ax.set_title(f"q{qi}: xi = {fit.xi[qi]:.2f}")
axes[0].set_ylabel("P(distractor score > s)")
axes[0].legend(fontsize=8)
plt.show()

# %% [markdown]
# ## Threshold stability
#
# Refit with half and twice as many excesses (a higher and a lower threshold) and flag the
# fits whose xi moves by more than two standard errors of the difference. The paper reports
# that moving the threshold quantile over 0.90-0.99 changes the 100M error only by
# 0.006-0.009; here we look at the fits themselves.

# %%
se = fit.xi_se
plt.figure(figsize=(5, 4))
plt.errorbar(fit.xi, fit.xi_half, yerr=2 * se, fmt="o", ms=3, label="half the excesses")
plt.errorbar(fit.xi, fit.xi_double, yerr=2 * se, fmt="s", ms=3, label="twice the excesses")
plt.plot([-1, 0], [-1, 0], "k:", lw=0.8)
plt.xlabel("xi at the default threshold")
plt.ylabel("xi refitted")
plt.title(f"{fit.stable.mean():.0%} of fits stable")
plt.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## The immune-positive problem and the no-hard-zero variant
#
# A plug-in fit with xi < 0 has a finite endpoint u + sigma / -xi. A positive above it gets
# hardness exactly 0: immune at every gallery size. The paper sees this in 20-30% of fits and
# leaves it open. `evt_averaged` keeps the tail's posterior over xi in [-0.95, 0] (scale
# integrated out) as hardness atoms and predicts by averaging E[AP] over them; shapes near 0
# keep the tail open up to the cosine bound 1, so only a positive at 1 gets a hard 0. Its
# reported x is the posterior mean.
# Against the truth, for the tail-priced positives:

# %%
hard = {name: estimators.get(name)(scores, settings) for name in ("count", "evt", "evt_averaged")}
tp = hard["evt"].tail_priced & (x_true > 0)
floor = 0.3 / n_full  # estimates below it (exact zeros included) are drawn on it
fig, ax = plt.subplots(figsize=(5, 4.5))
for name in ("evt", "evt_averaged"):
    est = hard[name].x[tp]
    ax.plot(x_true[tp], np.maximum(est, floor), "o", ms=4, alpha=0.7, label=name)
lim = [floor, 1e-3]
ax.plot(lim, lim, "k:", lw=0.8)
ax.axhline(floor, color="gray", lw=0.5)
ax.set(
    xscale="log",
    yscale="log",
    xlabel="true hardness",
    ylabel="estimated (below the grey floor: on it)",
)
ax.legend()
plt.show()
for name in ("evt", "evt_averaged"):
    zero = (hard[name].x == 0) & hard[name].tail_priced
    print(
        f"{name}: tail-priced positives at exactly 0: {zero.sum()} "
        f"of {hard[name].tail_priced.sum()}"
    )

# %% [markdown]
# What it does to the prediction at N = 200k, with evaluate-at-S for scale:

# %%
truth = metrics.map_from_counts(truth_counts[n_full], k, scores.fixed_counts)
print(f"{'truth':<16}{truth:.4f}")
print(f"{'evaluate-at-S':<16}{baselines.at_sample_map(scores, k):.4f}")
for name, h in hard.items():
    pred = evaluate.per_query_ap(h, n_full, k, scores.fixed_counts, scores).mean()
    print(f"{name:<16}{pred:.4f}  ({pred - truth:+.4f})")

# %% [markdown]
# ## When the excesses are not GPD: threshold selection
#
# A fixed threshold assumes the excesses over it follow a GPD. Take the score-level simulator's
# `mixture` law (a Gaussian bulk plus a 0.1% near-duplicate cluster 4-5.5 sd above it) at a
# 0.05% sample of 10^8: about 50 cluster scores sit far above the other 150 excesses of the
# paper's threshold, and a GPD reads the gap as a long tail. `evt_averaged` tests each query's
# excesses with the Anderson-Darling statistic against the GPD fitted to them and, where
# A^2 > 2, moves the threshold up to keep half, then a quarter of them
# (`evt.select_threshold`). The plug-in `evt` keeps the paper's threshold.

# %%
mix = simulate.make_benchmark(40, family="mixture", seed=0, **simulate.REGIMES["paper"])
draw = simulate.draw(mix, 0.0005, 4000, seed=0)
tail = draw.scores.tail_scores
critical = ta.TailSettings().ad_critical
select = jax.jit(evt.select_threshold, static_argnums=(1, 2))
_, _, m_sel, ad = (np.asarray(a) for a in select(jnp.asarray(tail), 0.95, critical))
kept = m_sel.sum(axis=1)
failed = (ad[0] > critical).mean()
print(f"default threshold fails the test for {failed:.0%} of queries")
sizes, counts = np.unique(kept, return_counts=True)
print("excesses kept (count: queries):", dict(zip(sizes.tolist(), counts.tolist(), strict=True)))

# %% [markdown]
# One query: the sampled scores' empirical survival (rank / S) and the GPD tails fitted at the
# default and at the selected threshold.

# %%
q = int(np.argmax(ad[0]))
s_mix = draw.scores.n_sample
top = tail[q, :400].astype(np.float64)
fig, ax = plt.subplots(figsize=(5, 4))
ax.plot(top, np.arange(1, top.size + 1) / s_mix, ".", ms=3, color="gray", label="sampled")
for n_exc, label in ((200, "default threshold"), (int(kept[q]), "selected threshold")):
    u_q = tail[q, n_exc]
    exc = jnp.asarray(tail[q, :n_exc] - u_q)
    xi_q, sig_q = gpd.grid_fit(exc, exc > 0)
    grid = np.linspace(u_q, top[0] + 0.05, 200)
    surv = (
        n_exc / s_mix * np.exp(np.asarray(gpd.log_survival(jnp.asarray(grid - u_q), xi_q, sig_q)))
    )
    ax.plot(grid, surv, label=f"{label}: {n_exc} excesses, xi = {float(xi_q):.2f}")
ax.set(yscale="log", xlabel="score", ylabel="share of the sample above", ylim=(1e-8, 1e-2))
ax.legend(fontsize=7)
plt.show()

# %% [markdown]
# And the predicted mAP@1000 at N = 10^8 against the realized truth (M = 4000 kept scores):

# %%
settings_mix = ta.TailSettings()
truth_mix = metrics.map_from_counts(draw.truth_counts, k)
print(f"{'truth':<16}{truth_mix:.4f}")
for name in ("count", "evt", "evt_averaged"):
    h = estimators.get(name)(draw.scores, settings_mix)
    pred = evaluate.per_query_ap(h, mix.n_pool, k, draw.scores.fixed_counts, draw.scores)
    print(f"{name:<16}{pred.mean():.4f}  ({pred.mean() - truth_mix:+.4f})")

# %% [markdown]
# Selection finds the cluster, but it does not make the cluster a tail: the ~50 selected scores
# are a whole small Gaussian sample, which fits as a short tail. Since the shape grid of
# `evt_averaged` reaches xi = -0.95 (it stopped at -1/2 before, which happened to price this
# case within 0.02), the cluster's fitted endpoint sits near its sample maximum and
# the prediction comes out too high. README, "Other tail shapes and gallery sizes", has the
# trade-off across tail families and gallery sizes.
