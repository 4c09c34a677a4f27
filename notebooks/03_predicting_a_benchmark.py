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
# # 3. Predicting a benchmark from a distractor sample
#
# [Open in Colab](https://colab.research.google.com/github/tailaware/tailaware/blob/main/notebooks/03_predicting_a_benchmark.ipynb)
#
# The protocol of paper Sec. 4: score the queries against a uniform sample of the distractors,
# estimate each positive's hardness (tail-aware where the sample is blind), and report mAP@k at
# the full gallery size with an interval, next to the baselines, and the whole mAP-versus-N
# curve. First on the synthetic benchmark, whose truth is known at every size; then from an
# ILIAS-format feature folder, the layout the official ILIAS code writes (point `FEATURES` at
# yours, or let the notebook write a small synthetic one).

# %%
import importlib
import json
import os
import sys

if "google.colab" in sys.modules:  # install the package (it ships the configs it runs)
    # %pip install -q git+https://github.com/tailaware/tailaware
    importlib.invalidate_caches()  # for the imports below to find the fresh install

# %%
# %matplotlib inline
import tempfile

import matplotlib.pyplot as plt
import numpy as np

import tailaware as ta
from tailaware.configs import ilias as ilias_config
from tailaware.core import evaluate, metrics
from tailaware.io import features
from tailaware.jobs import ilias
from tailaware.protocol import comparison, reference, schema
from tailaware.sim import paired, synthetic
from tailaware.tail import estimators

# %% [markdown]
# ## Sampled scores
#
# 60 queries with 5 positives each against 200k distractors; `synthetic.score` scores every
# distractor once, recording the truth at three gallery sizes and, on the way, the sampled
# scores of a uniform 5% id-hash sample: the top scores per query, each positive's score and
# how many sampled distractors beat it (`tailaware.io.scores.SampledScores`).

# %%
# The paper keeps the top 4000 of 5M sampled scores per query; here 1000. No nested bootstrap
# (it also resamples the distractor sample and refits every tail; about a minute on 2 CPU
# cores with `nested_replicates=100`), to keep the notebook fast.
settings = ta.PredictSettings(
    estimator="evt",
    tail=ta.TailSettings(top_m=1000),
    protocol=ta.ProtocolSettings(nested_replicates=0),
)
k, n_full = settings.k, 200_000
sizes = [10_000, 50_000, n_full]
bench = synthetic.make_benchmark(
    n_instances=60, queries_per_instance=1, positives_per_instance=5, n_distractors=n_full, dim=64
)
truth_counts, scores = synthetic.score(bench, sizes, fraction=0.05, top_m=1000, seed=0)
truth = [metrics.map_from_counts(truth_counts[s], k, scores.fixed_counts) for s in sizes]
print(f"S = {scores.n_sample:,} sampled of N = {n_full:,}; true mAP@{k} at N: {truth[-1]:.4f}")

# %% [markdown]
# ## The prediction, its interval and the budget verdict
#
# `ta.predict` returns what `python launch.py --config=configs/predict.py` writes to
# `prediction.json` (`schema.prediction_json`): the tail-aware estimate at the target N with
# its interval (query bootstrap, widened by the tail model's own error: how far the prediction
# moves when the tail threshold keeps half or twice the excesses, and under a flatter or a
# steeper prior on the tail shape), the baselines (count, evaluate-at-S, power-law and
# log-uniform curve fits), the predicted curve from 10^3 to 10^9 and the sufficient-budget
# verdict: predictions from nested sub-samples S/8 .. S should have stopped moving by more than
# query noise.

# %%
result = ta.predict(scores, settings, n_full)
print(schema.format_table(result))
print(f"{'truth':<24}{truth[-1]:>10.4f}")
print()
print("\n".join(result.diagnostics.summary))
budget = result.diagnostics.budget
print(budget.message)
for size, value in zip(budget.sizes, budget.predictions, strict=True):
    print(f"  S = {size:>6,}: {value:.4f}")

# %% [markdown]
# ## The full curve
#
# The same hardness gives mAP@k at every gallery size, here with its 90% band. The truth is
# measured on nested galleries of the full pool; evaluate-at-S is the sample's own metric, and
# the count estimator's curve shows what the tail adds.

# %%
curve = result.curve
band = np.asarray(curve.ci90)
count_curve = evaluate.per_query_aps(
    estimators.count(scores), np.asarray(curve.n), k, scores.fixed_counts, scores
)[0].mean(axis=1)
fig, ax = plt.subplots(figsize=(7, 4))
ax.fill_between(curve.n, band[:, 0], band[:, 1], color="C1", alpha=0.2, label="evt, 90% band")
ax.plot(curve.n, curve.values, color="C1", label="evt (from the sample)")
ax.plot(curve.n, count_curve, color="C0", label="count (from the sample)")
ax.plot(sizes, truth, "ko", label="truth")
ax.plot([scores.n_sample], [result.baselines["at_sample"]], "r^", label="evaluate-at-S")
ax.axvline(scores.n_sample, color="grey", ls=":", lw=0.8)
ax.set(xscale="log", xlabel="gallery size N", ylabel=f"mAP@{k}")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## From an ILIAS-format feature folder
#
# The scoring job reads `features_image_queries.hdf5`, `features_positives.hdf5` and
# `features_distractors_{idx:05d}.hdf5` (datasets `features` [n, d] float16 and `index` ids;
# a query's positives share its `<instance>/` id prefix), scores a uniform sample of the
# distractors and predicts at the folder's full size. Set `FEATURES` to a real folder (for
# ILIAS, the official extraction's output); left empty, the synthetic benchmark is written in
# that layout first (ids as in ILIAS, float16 descriptors as in ILIAS). The numbers differ a
# little from the in-memory run above: float16 descriptors, and the job draws its own sample.

# %%
FEATURES = ""
workdir = tempfile.mkdtemp(prefix="tailaware_")
if not FEATURES:
    FEATURES = os.path.join(workdir, "features")
    os.makedirs(FEATURES)
    inst = lambda i: f"{i:04d}"
    query_ids = [f"{inst(i)}/query/Q{i:04d}_00.jpg" for i in bench.query_instance]
    pos_ids = [
        f"{inst(i)}/pos/P{i:04d}_{j % 5:02d}.jpg" for j, i in enumerate(bench.positive_instance)
    ]
    features.write_features(
        os.path.join(FEATURES, features.IMAGE_QUERIES), bench.queries, query_ids
    )
    features.write_features(os.path.join(FEATURES, features.POSITIVES), bench.positives, pos_ids)
    for start, block in synthetic.distractor_blocks(bench, block=100_000):
        ids = bench.distractor_ids(start, start + len(block))
        features.write_features(
            os.path.join(FEATURES, features.distractor_name(start // 100_000)), block, ids
        )

    # The official report's inputs: each positive's scale and clutter (positive_ids.txt, CSV
    # id,scale,clutter; random here), and a taxonomy of the instances (ILIAS's own is shipped and
    # used for ILIAS's instances; this synthetic benchmark gets three made-up categories).
    rng = np.random.default_rng(0)
    with open(os.path.join(FEATURES, "positive_ids.txt"), "w") as f:
        for pid in pos_ids:
            f.write(f"{pid},{rng.uniform(0.01, 0.5):.4f},{rng.integers(0, 80)}\n")
    kinds = ("animal", "object", "place")
    tree = {c: {"misc": {"all": []}} for c in kinds}
    for i in sorted(set(bench.query_instance)):
        tree[kinds[i % 3]]["misc"]["all"].append(inst(i))
    with open(os.path.join(workdir, "taxonomy.json"), "w") as f:
        json.dump(tree, f)

job = ilias_config.get_config()
job.features = FEATURES
job.sample_fraction = 0.05
job.estimator = "evt"
job.evt.top_m = 1000
if os.path.exists(os.path.join(workdir, "taxonomy.json")):
    job.taxonomy = os.path.join(workdir, "taxonomy.json")
folder_result = ilias.run(job, os.path.join(workdir, "run"))
print(f"wrote {sorted(os.listdir(os.path.join(workdir, 'run')))} to {workdir}/run")

# %% [markdown]
# The job also predicted the **official ILIAS report** at N, in percent: `map`, `oracle`
# (recall@k), mAP@k per scale and clutter group of the positives (the positives of other groups
# deleted from each query's list) and per category and subcategory, every value with its 90%
# interval (`report` in prediction.json; docs/outputs.md, "The ILIAS report").

# %%
for value in folder_result.report.values:
    lo, hi = value.ci90
    key = f"{value.section} {value.key}".strip()
    print(f"{key:<52}{value.value:7.2f}  [{lo:6.2f}, {hi:6.2f}]  ({value.num_queries} queries)")

# %% [markdown]
# ## A pooled census from another model's top lists
#
# A uniform sample sees what sits above a query's sampled tail only by luck. At web scale
# another model's per-query top lists over the same gallery usually exist (an ILIAS similarity
# file, a production index); `--config.proxy` plans a **census** from them: every item some
# proxy list ranks high is embedded and counted exactly, the rest is hash-sampled at the rate
# that keeps the total embedded share at `sample_fraction`, and each positive's count is the
# census's exact count plus the rest's estimate: the sample's estimate of the whole gallery
# less the census (never below the census's count; docs/estimators.md, "Census"). Here the
# proxy is a related model, the benchmark's descriptors moved by noise, written as a feature
# folder of the same ids; the job finds its top lists by an exact search. Uniform and census
# designs at the same 10% budget (20,000 items: the census takes half, and its sample of the
# whole gallery, the one the tail is fitted to, keeps the job's floor of 10,000), three hash
# seeds each, against the exact run of the folder (`sample_fraction = 1`).

# %%
PROXY = os.path.join(workdir, "proxy")
os.makedirs(PROXY, exist_ok=True)
noise = np.random.default_rng(1)


def related(x):
    """The proxy model's descriptors: x moved by noise, L2-normalised again (float16 stored)."""
    y = np.asarray(x, np.float32) + noise.normal(0.0, 0.1, x.shape).astype(np.float32)
    return y / np.linalg.norm(y, axis=1, keepdims=True)


for name in (features.IMAGE_QUERIES, features.POSITIVES):
    x, ids = features.read_features(os.path.join(FEATURES, name))
    features.write_features(os.path.join(PROXY, name), related(x), ids)
for i, shard in enumerate(sorted(f for f in os.listdir(FEATURES) if f.startswith("features_d"))):
    x, ids = features.read_features(os.path.join(FEATURES, shard))
    features.write_features(os.path.join(PROXY, features.distractor_name(i)), related(x), ids)


def run(name, **options):
    """Runs the ILIAS job on FEATURES at mAP@100 with `options`; returns its prediction."""
    c = ilias_config.get_config()
    c.features, c.k, c.estimator, c.evt.top_m = FEATURES, 100, "evt", 1000
    c.protocol.nested_replicates = 10
    c.update(options)
    return ilias.run(c, os.path.join(workdir, name))


exact_map = run("exact", sample_fraction=1.0).map
designs = {"uniform": {}, "census": {"proxy": PROXY}}
runs = {
    (design, seed): run(f"{design}_{seed}", sample_fraction=0.1, seed=seed, **extra)
    for design, extra in designs.items()
    for seed in range(3)
}
fig, ax = plt.subplots(figsize=(7, 3))
for (design, seed), p in runs.items():
    lo, hi = p.interval.ci90.reported
    x = seed + (0.15 if design == "census" else -0.15)
    color = "C1" if design == "census" else "C0"
    ax.errorbar(x, p.map, [[p.map - lo], [hi - p.map]], fmt="o", color=color, capsize=3)
    print(f"{design:<8} seed {seed}: mAP@100 {p.map:.4f} [{lo:.4f}, {hi:.4f}]")
print(f"exact run: mAP@100 {exact_map:.4f}")
ax.axhline(exact_map, color="k", lw=1, label=f"exact run: {exact_map:.4f}")
ax.plot([], [], "o", color="C0", label="uniform 10%")
ax.plot([], [], "o", color="C1", label="census + rest, 10% in all")
ax.set(xticks=range(3), xlabel="hash seed", ylabel="mAP@100, 90% interval")
ax.legend(fontsize=8)
plt.show()
print("\n".join(line for line in runs["census", 0].diagnostics.summary if "census" in line))

# %% [markdown]
# ## Correcting with a reference model's exact run
#
# The common question is "is B better than A", where A (the baseline, the last checkpoint) has
# already been run over the whole gallery. Its exact counts, and its scores of the items in B's
# sample, then correct B's prediction. The correction takes today's known error on A off B's
# prediction, scaled by a weight lambda tuned on the sample (docs/estimators.md, "Correcting
# with a reference model's exact run"). Here the gallery is the first 50k distractors. B is the
# benchmark's 64-d embedding and A keeps its top 63 principal directions (an ablation).
# `paired.System` scores each model against every distractor, which gives the brute-force truth
# and A's exact run. `paired.draw` gives both models' sampled scores of one 5% sample, paired
# item by item by distractor id.

# %%
_, distractors = next(synthetic.distractor_blocks(bench, block=50_000))
q = len(bench.queries)
emb_b = np.concatenate([bench.queries, bench.positives, distractors])
slots = np.stack([q + np.flatnonzero(bench.positive_instance == i) for i in bench.query_instance])
rows = (np.arange(q), slots, np.arange(q + len(bench.positives), len(emb_b)))
_, _, vt = np.linalg.svd(distractors, full_matrices=False)
emb_a = emb_b @ vt[:63].T
emb_a /= np.linalg.norm(emb_a, axis=1, keepdims=True)
system_b = paired.System.from_embeddings(emb_b, *rows)
system_a = paired.System.from_embeddings(emb_a, *rows)
sampled_b = paired.draw(system_b, 0.05, seed=0, top_m=1000)
sampled_a = paired.draw(system_a, 0.05, seed=0, top_m=1000)
run_a = system_a.reference_counts(k)  # what A's exact ILIAS run writes (reference_counts.npz)

correction = reference.correct(
    sampled_b, sampled_a, run_a, settings, reference.ReferenceSettings(replicates=20)
)
m = correction.metrics[f"map@{k}"]
true_b, true_a = system_b.exact_map(k), system_a.exact_map(k)
print(f"B, mAP@{k} at N = {run_a.n_distractors:,}: true {true_b:.4f}")
print(f"  today's prediction (sample only)  {m.uncorrected:.4f}")
print(
    f"  corrected by A (lambda {m.lam:.2f})      {m.value:.4f}  [{m.ci90[0]:.4f}, {m.ci90[1]:.4f}]"
)
print(f"  today's error on A, known exactly {m.reference_error:+.4f} (A's exact {true_a:.4f})")

# %% [markdown]
# Comparing B with A's run needs no prediction of A: A's value is exact, so B - A is B's
# corrected value minus it, and its interval is the corrected estimate's alone (the
# compare job given B's prediction.json and A's reference_counts.npz:
# `python launch.py --config=configs/compare.py --config.a=B/prediction.json
# --config.b=A/reference_counts.npz --workdir=DIR`). The correction removes only the part of
# today's error that A shares; when the two models' errors differ, some remains, and the
# interval, which measures sampling noise alone, does not hold it. How well this works on real
# text pairs: docs/validation.md, "Correcting with a reference model's exact run".

# %%
diff = comparison.against_reference(correction, k=k).ap
lo, hi = diff.ci90
print(f"B - A: true {true_b - true_a:+.4f}; from the correction {diff.difference:+.4f}")
print(f"  90% interval, these queries [{lo:+.4f}, {hi:+.4f}]; resolved: {diff.resolved}")
