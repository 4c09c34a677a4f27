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
# # 4. Sensitivity of the prediction, with `jax.grad`
#
# [Open in Colab](https://colab.research.google.com/github/tailaware/tailaware/blob/main/notebooks/04_sensitivity.ipynb)
#
# The predicted mAP@k is a differentiable function of every positive's hardness, of the gallery
# size and of each query's tail fit (`tailaware.core.law`). `tailaware.tail.sensitivity`
# differentiates it to answer what a researcher acts on: how much accuracy each decade of
# gallery growth costs, which queries and positives drive the prediction and its uncertainty,
# how far a given relative error in hardness moves mAP, and where a larger distractor sample
# would help most.
#
# Gradients use the smooth top-k truncation (the metric's hard cut-off has zero gradient across
# the k boundary); exact responses use the hard one, the metric itself. Each cell says which.

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
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import tailaware as ta
from tailaware.core import law, metrics
from tailaware.sim import synthetic
from tailaware.tail import estimators, sensitivity

# %% [markdown]
# ## A benchmark and its prediction
#
# A synthetic ILIAS-like benchmark (`tailaware.sim.synthetic`): 60 queries, 200k distractors, a
# uniform 5% sample. We predict mAP@1000 at N = 200k from the sample with the tail-aware
# estimator (`evt`, paper App. B) and with the count estimator.

# %%
settings = ta.TailSettings(top_m=1000)  # kept scores per query (the paper keeps 4000 of 5M)
k, n_full = 1000, 200_000
bench = synthetic.make_benchmark(
    n_instances=60, queries_per_instance=1, positives_per_instance=5, n_distractors=n_full, dim=64
)
truth_counts, scores = synthetic.score(bench, [n_full], fraction=0.05, top_m=1000, seed=0)
truth = metrics.map_from_counts(truth_counts[n_full], k, scores.fixed_counts)
hard = {name: estimators.get(name)(scores, settings) for name in ("count", "evt")}
report = {name: sensitivity.analyze(scores, h, n_full, k) for name, h in hard.items()}
for name, rep in report.items():
    print(f"--- {name} (truth {truth:.4f})")
    print(sensitivity.format_report(rep))

# %% [markdown]
# ## Accuracy lost per decade of gallery growth
#
# `gradients(...).per_decade` is d mAP / d log10 N, differentiated through N = exp(log N). Each
# query's own decay rate comes free: hardness enters only through N x, so
# N d/dN = sum_j x_j d/dx_j. Below, the slope against a finite difference of the predicted
# curve, and the queries that lose most per decade.

# %%
h = hard["evt"]
x, mask = jnp.asarray(h.x, jnp.float32), jnp.asarray(h.mask)
fixed = jnp.asarray(np.where(h.mask, scores.fixed_counts, 0), jnp.float32)
grid = np.geomspace(1e4, 1e8, 17)
g = [sensitivity.gradients(x, mask, float(n), float(k), fixed=fixed) for n in grid]
curve = np.array([float(r.map) for r in g])
slope = np.array([float(r.per_decade) for r in g])
fd = np.gradient(curve, np.log10(grid))

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.5))
ax1.plot(grid, curve)
ax1.plot([n_full], [truth], "ko", label="truth")
ax1.set(xscale="log", xlabel="gallery size N", ylabel=f"predicted mAP@{k} (smooth)")
ax1.legend()
ax2.plot(grid, slope, label="jax.grad: d mAP / d log10 N")
ax2.plot(grid, fd, "--", label="finite difference of the curve")
ax2.set(xscale="log", xlabel="gallery size N", ylabel="mAP per decade")
ax2.legend()
plt.show()

rep = report["evt"]
decay = np.log(10) * np.asarray(rep.gradients.aps_d_log_n)
worst = np.argsort(decay)[:10]
plt.figure(figsize=(8, 3))
plt.bar([f"q{i}" for i in worst], decay[worst])
plt.ylabel("d AP / d log10 N")
plt.title("the ten queries that lose most per decade at N = 200k")
plt.show()

# %% [markdown]
# ## A relative error in hardness, and why the metric damps it
#
# Multiplying every hardness by e^delta is the same as moving the gallery from N to N e^delta,
# so the first-order response is delta times d mAP / d ln N. A positive's precision term
# p = j / (j + F + N x) has elasticity -p N x / r, never more than 1/4 in size, and an
# overshoot by a factor c shrinks it like 1 / c; the top-1 probability exp(-N x) falls like
# exp(-c N x). Exact responses here use the hard truncation (the metric itself). Summed over a
# benchmark whose hardness spans decades, both responses look alike (left); the damping shows
# per positive, where a tenfold overshoot costs AP a factor 5.5 and top-1 a factor e^9 (right).

# %%
deltas = jnp.linspace(-np.log(10), np.log(10), 41)
resp = sensitivity.uniform_response(x, mask, float(n_full), float(k), deltas, fixed=fixed)

c = np.geomspace(0.1, 10, 81)
one = jnp.ones((1,), bool)
ap_one = [
    float(law.ap_at_k(jnp.array([1.0 / n_full]) * ci, one, float(n_full), 1000.0)) for ci in c
]
top1_one = np.exp(-c)  # law.top1_survival at N x = c

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.5))
ax1.plot(np.exp(deltas), resp.map, label="mAP@k, exact")
ax1.plot(np.exp(deltas), resp.map_first_order, "--", label="mAP@k, first order")
ax1.plot(np.exp(deltas), resp.top1, label="top-1 accuracy, exact")
ax1.set(
    xscale="log", xlabel="every hardness multiplied by e^delta", ylabel="change from the prediction"
)
ax1.axhline(0, color="k", lw=0.5)
ax1.legend()
ax2.plot(c, ap_one, label="AP of one positive, 1 / (1 + c)")
ax2.plot(c, top1_one, label="top-1 survival, exp(-c)")
ax2.set(xscale="log", yscale="log", xlabel="N x (c times the true N x = 1)", ylim=(1e-5, 1.5))
ax2.legend()
plt.show()

# %% [markdown]
# Per positive: the exact change of mAP when only that positive's hardness doubles, against the
# first-order delta * d mAP / d log x (both with the smooth truncation, where they should agree
# up to the curvature of the rational response).

# %%
exact, first = sensitivity.positive_response(
    x, mask, float(n_full), float(k), np.log(2.0), fixed=fixed, truncation="smooth"
)
m = np.asarray(mask)
plt.figure(figsize=(4.5, 4))
plt.scatter(-np.asarray(first)[m], -np.asarray(exact)[m], s=8)
lim = float(-np.asarray(first)[m].min()) * 1.1 + 1e-9
plt.plot([0, lim], [0, lim], "k:", lw=0.8)
plt.xlabel("mAP lost, first order")
plt.ylabel("mAP lost, exact")
plt.title("one positive's hardness doubled")
plt.show()

# %% [markdown]
# ## Which queries drive the uncertainty, and where a larger sample helps
#
# The delta method: Var(mAP) = sum_q g_q^T C_q g_q with g = d mAP / d log x and C the
# covariance of log hardness: nested Binomial counts for counted positives
# (Cov = (1 - x_max) / K_max, relative sd 1 / sqrt(K)) and the GPD fit's asymptotic covariance
# for tail-priced ones. Both shrink like 1 / S, so the queries with the largest variance share
# are where a larger sample pays; the per-positive value |g| * sd(log x) ranks single
# positives. Positives priced at exactly 0 (no sampled distractor above them, or beyond a
# fitted tail's endpoint) carry no gradient; `blind` says what they would cost at x = 1 / S.

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
for ax, (name, rep) in zip(axes, report.items(), strict=True):
    share = np.asarray(rep.uncertainty.query_var) / float(rep.uncertainty.sd) ** 2
    top = np.argsort(-share)[:10]
    ax.bar([f"q{i}" for i in top], share[top])
    ax.set_title(f"{name}: sd {float(rep.uncertainty.sd):.4f}, ten largest variance shares")
    ax.tick_params(axis="x", labelrotation=60)
plt.show()

factors = np.array([1, 2, 4, 8, 16])
for name, rep in report.items():
    plt.plot(
        factors * scores.n_sample, float(rep.uncertainty.sd) / np.sqrt(factors), "o-", label=name
    )
plt.xscale("log")
plt.xlabel("sample size S")
plt.ylabel("hardness-noise sd of mAP")
plt.legend()
plt.show()

value = np.asarray(report["evt"].uncertainty.value)
tail_priced = np.asarray(report["evt"].tail_priced)
order = np.argsort(-value, axis=None)[:8]
print("positives whose hardness error moves mAP most (one standard error):")
for qi, pj in zip(*np.unravel_index(order, value.shape), strict=True):
    priced = "tail" if tail_priced[qi, pj] else "count"
    print(
        f"  q{qi} positive {pj}: {value[qi, pj]:.5f} ({priced}, sampled count "
        f"{scores.pos_counts[qi, pj]}, x = {h.x[qi, pj]:.2e})"
    )

# %% [markdown]
# ## Through the tail fits
#
# `tail_gradients` differentiates mAP with respect to each query's fitted (log rate, threshold,
# xi, log sigma), holding the fit fixed (a stop-gradient at the fitted parameters).
# `score_gradients` goes through the fitter itself: `evt.log_tail_prob` carries the GPD
# maximum-likelihood fit's implicit-function-theorem derivatives, so d mAP / d sampled score
# says how hard the prediction leans on each kept distractor score. The spike is the threshold
# u itself (every excess is measured from it); which order statistic is u carries no gradient.

# %%
d_tail = report["evt"].tail
d_xi = np.asarray(d_tail.xi)
top = np.argsort(-np.abs(d_xi))[:10]
d_pos, d_scores = sensitivity.score_gradients(
    np.asarray(scores.pos_scores),
    np.asarray(scores.tail_scores),
    float(scores.n_sample),
    x,
    jnp.asarray(h.tail_priced),
    mask,
    float(n_full),
    float(k),
    fixed=fixed,
    settings=settings,
)
q_star = int(top[0])
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.5))
ax1.bar([f"q{i}" for i in top], d_xi[top])
ax1.set(ylabel="d mAP / d xi", title="queries most sensitive to their tail shape")
ax1.tick_params(axis="x", labelrotation=60)
ax2.plot(np.arange(1, 1 + d_scores.shape[1]), np.asarray(d_scores[q_star]))
ax2.set(
    xscale="log",
    xlabel="rank of the kept sampled score",
    ylabel="d mAP / d score",
    title=f"q{q_star}: which sampled scores the prediction leans on",
)
plt.show()
