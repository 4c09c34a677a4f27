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
# # 1. The scaling law of retrieval under distractors
#
# [Open in Colab](https://colab.research.google.com/github/tailaware/tailaware/blob/main/notebooks/01_scaling_law.ipynb)
#
# For one query, the number of distractors that outrank its j-th positive is
# K_j ~ Binomial(N, x_j), where the **hardness** x_j = P(distractor score > positive score) does
# not depend on the gallery size N (paper Sec. 3). This notebook checks the law by simulation,
# shows the expected-rank map that turns hardness into mAP@k at any N, the logarithmic decay
# of mAP@k under log-uniform hardness, the rare-event regime exp(-N x), and why evaluating on a
# small sample is optimistic. Runs in well under a minute on a laptop CPU.

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

from tailaware.core import evaluate, law, metrics
from tailaware.protocol import baselines
from tailaware.sim import synthetic
from tailaware.tail import estimators

# %% [markdown]
# ## The Binomial rank law
#
# Draw N distractor scores from a fixed distribution, put a positive at a score that a share x
# of them beats, and count. Repeated over many galleries, the count follows Binomial(N, x):
# `law.binomial_log_pmf` against the simulation.

# %%
rng = np.random.default_rng(0)
n, x = 5_000, 1.6e-3  # N x = 8 distractors above the positive on average
positive_score = 1.0 - x  # distractor scores are uniform on [0, 1]
counts = (rng.random((1000, n), dtype=np.float32) > positive_score).sum(axis=1)
m = jnp.arange(30, dtype=jnp.float32)
pmf = jnp.exp(law.binomial_log_pmf(m, float(n), jnp.float32(x)))

fig, ax = plt.subplots(figsize=(6, 3.5))
ax.hist(counts, bins=np.arange(31) - 0.5, density=True, alpha=0.5, label="1000 simulated galleries")
ax.plot(np.asarray(m), np.asarray(pmf), "k.-", label=f"Binomial(N={n:,}, x={x:g})")
ax.set_xlabel("distractors above the positive, K")
ax.set_ylabel("probability")
ax.legend()
plt.show()

# %% [markdown]
# ## From hardness to mAP@k: the expected-rank map
#
# The j-th positive's rank is j + K_j. Replacing K_j by its mean N x_j gives the expected-rank
# map `law.map_at_k`; fed a gallery's realised fractions K_j / N it is that gallery's exact
# mAP@k, fed population hardness it predicts mAP@k at any N. The exact expectation
# E[AP@k] under the Binomial law (`law.expected_ap_binomial`) sits slightly above it (Jensen:
# j / r is convex in r); the paper targets the realised metric, which the map tracks.

# %%
x_query = jnp.array([2e-7, 1e-6, 5e-6, 3e-5, 1e-4], jnp.float32)  # one query, five positives
mask = jnp.ones(5, bool)
sizes = np.geomspace(1e3, 1e8, 26)
k = 100
plug_in_fn = jax.jit(lambda n: law.ap_at_k(x_query, mask, n, float(k)))
binomial_fn = jax.jit(lambda n: law.expected_ap_binomial(x_query, mask, n, k))
plug_in = [float(plug_in_fn(jnp.float32(s))) for s in sizes]
binomial = [float(binomial_fn(jnp.float32(s))) for s in sizes]

fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(sizes, plug_in, label="expected-rank map")
ax.plot(sizes, binomial, "--", label="exact Binomial E[AP@k]")
ax.set_xscale("log")
ax.set_xlabel("gallery size N")
ax.set_ylabel(f"AP@{k}")
ax.legend()
plt.show()

# %% [markdown]
# ## Log-uniform hardness: mAP decays logarithmically in N
#
# Let hardness be log-uniform on [a, b] across queries (the measured hardness is roughly a
# power law, paper Sec. 3-5). For one positive per query AP = 1 / (1 + N x), and between
# 1 / b and 1 / a every decade of N costs the same accuracy, about 1 / log10(b / a): no
# plateau in sight, only a slow bleed per decade.

# %%
a, b = 1e-9, 1e-3
hard = jnp.asarray(10.0 ** rng.uniform(np.log10(a), np.log10(b), (4000, 1)), jnp.float32)
one = jnp.ones_like(hard, bool)
grid = np.geomspace(10, 1e11, 41)
map_at = jax.jit(lambda n: law.map_at_k(hard, one, n, 1000.0)[0])
curve = np.array([float(map_at(jnp.float32(s))) for s in grid])
inside = (grid > 10 / b) & (grid < 0.1 / a)
slope = np.polyfit(np.log10(grid[inside]), curve[inside], 1)[0]

fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(grid, curve)
ax.axvspan(1 / b, 1 / a, alpha=0.1, label="1/b < N < 1/a")
ax.set_xscale("log")
ax.set_xlabel("gallery size N")
ax.set_ylabel("mAP@1000")
ax.set_title(f"slope {slope:+.3f} per decade; 1 / log10(b/a) = {1 / np.log10(b / a):.3f}")
ax.legend()
plt.show()

# %% [markdown]
# ## The rare-event regime: P(rank 1) = exp(-N x)
#
# A positive ranks first when no distractor beats it: (1 - x)^N, which for small x and
# N x = O(1) is exp(-N x) (`law.top1_survival`). The response to hardness is exponential, in
# contrast with the rational j / (j + N x) of AP (notebook 4 shows why that matters).

# %%
nx = np.geomspace(1e-3, 20, 60)
for n in (100, 10_000):
    xs = jnp.asarray(nx / n, jnp.float32)
    exact = law.top1_survival(xs, float(n), exact=True)
    plt.plot(nx, np.asarray(exact), label=f"(1 - x)^N, N = {n:,}")
plt.plot(nx, np.exp(-nx), "k--", label="exp(-N x)")
plt.plot(nx, 1 / (1 + nx), ":", label="AP of a single positive, 1 / (1 + N x)")
plt.xscale("log")
plt.xlabel("N x (expected distractors above the positive)")
plt.ylabel("probability / precision")
plt.legend()
plt.show()

# %% [markdown]
# ## Why evaluating on the sample is optimistic
#
# A synthetic ILIAS-like benchmark (`tailaware.sim.synthetic`) scored against 200k distractors,
# with a uniform 5% sample. mAP@k never increases with N, so the metric measured on the
# 10k-image sample is an upper bound on the full-gallery value, often far off. The law,
# fed even the simplest (count) hardness from the same sample, moves most of the way.

# %%
bench = synthetic.make_benchmark(
    n_instances=60, queries_per_instance=1, positives_per_instance=5, n_distractors=200_000, dim=64
)
sizes = [10_000, 50_000, 200_000]
truth_counts, scores = synthetic.score(bench, sizes, fraction=0.05, top_m=1000, seed=0)
k = 1000
truth = [metrics.map_from_counts(truth_counts[s], k, scores.fixed_counts) for s in sizes]
at_sample = baselines.at_sample_map(scores, k)
count = estimators.count(scores)
grid = np.geomspace(scores.n_sample, 200_000, 12)
predicted = evaluate.per_query_aps(count, grid, k, scores.fixed_counts, scores)[0].mean(axis=1)

fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(sizes, truth, "ko", label="truth (full gallery)")
ax.plot([scores.n_sample], [at_sample], "r^", label=f"evaluate-at-S (S = {scores.n_sample:,})")
ax.plot(grid, predicted, label="law with count hardness from the sample")
ax.set_xscale("log")
ax.set_xlabel("gallery size N")
ax.set_ylabel(f"mAP@{k}")
ax.legend()
plt.show()
print(
    f"truth at N = 200k: {truth[-1]:.4f}; evaluate-at-S: {at_sample:.4f}; "
    f"count law: {predicted[-1]:.4f}"
)
