"""Speed of the scoring pass against the bare matmul and faiss, measured in the same run.

Usage: `python benchmarks/scoring.py [--queries 1200] [--dim 768] [--distractors 393216]`
(about 3-4 minutes on 2 CPU cores). Prints GFLOP/s (2 Q D N flops per pass) and the ratios:

- host pass / numpy matmul: the full scoring pass (top-M with ids + exact counts) of the CPU
  backend against numpy's bare float32 matmul of the same blocks (the bar: >= 0.85).
- host pass / faiss: against faiss `IndexFlatIP` search with k = M on the same data, run with
  its bundled OpenBLAS as installed and with `OPENBLAS_CORETYPE` naming this CPU (the best of
  the two is the bar: >= 1).
- jax pass / jax matmul: the on-device backend (`tailaware.search.device_topk`) against JAX's own
  matmul of the same blocks, already on the device (the bar: >= 0.3 on CPU, >= 0.7 on a GPU;
  `benchmarks/device_check.py` measures it there). The pass also reads, pads and copies each
  block to the device, as a search does; the first blocks of this data hold most of the top
  scores (see `data`), so they exercise the pass's fallbacks.

threadpoolctl reports the OpenBLAS kernel ("architecture") each library ran.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def data(q, d, n, seed=0, base=65536):
    """Unit-norm float16 queries [Q, D] and distractors [N, D] from 64 clusters.

    Beyond `base` rows the distractors repeat with their dimensions permuted (a fresh
    permutation per repeat), which makes N cheap to generate. The copies score lower against
    the queries than the first `base` rows (the cluster directions are scrambled), so the stream
    is not in random score order: a threshold guessed from the first block would be too high.
    """
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((64, d)).astype(np.float32)

    def sample(k):
        a = centers[rng.integers(0, 64, k)] * 0.3 + rng.standard_normal((k, d)).astype(np.float32)
        return (a / np.linalg.norm(a, axis=1, keepdims=True)).astype(np.float16)

    queries, first = sample(q), sample(min(n, base))
    x = np.empty((n, d), np.float16)
    for s in range(0, n, base):
        x[s : s + base] = first[: n - s][:, rng.permutation(d)]
    return queries, x


def best_of(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def shards_of(x, shard_rows):
    """In-memory shards of `shard_rows` rows (sample fraction 1 never hashes their ids).

    They read rows as the library's readers do (`ilias_folder.memory_shard`, `take_rows`): a
    contiguous range as one slice (here a view, as from a memory-mapped `.npy` shard), other rows
    by gather.
    """
    from tailaware.io import ilias_folder

    def shard(i, start):
        part = x[start : start + shard_rows]
        return ilias_folder.memory_shard(i, part, np.arange(part.shape[0]).astype(str), f"mem{i}")

    return [shard(i, s) for i, s in enumerate(range(0, x.shape[0], shard_rows))]


def scoring_pass(backend_name, queries, x, m, block, n_pos=6):
    """Seconds for the full pass (top-M + counts) over x; returns (seconds, state, backend)."""
    from tailaware.search import scoring

    rng = np.random.default_rng(1)
    pos = rng.uniform(0.2, 0.6, (queries.shape[0], n_pos)).astype(np.float32)
    pos[:10, 0] = -0.2  # a few very hard positives: counts far beyond the top-M
    backend = scoring.make_backend(backend_name, queries, m, block, "float16")
    spec = scoring.SearchSpec(1.0, 0, m, "bench")
    shards = shards_of(x, 4 * block)
    t0 = time.perf_counter()
    state, _ = scoring.score_shards(backend, pos, shards, spec, block_size=block)
    return time.perf_counter() - t0, state, backend


def numpy_matmul(queries, x, block):
    q32 = queries.astype(np.float32)
    blocks = [x[s : s + block].astype(np.float32) for s in range(0, x.shape[0], block)]

    def run():
        for b in blocks:
            q32 @ b.T

    return run


def faiss_child(q, d, n, m, block):
    """Runs in a subprocess (OPENBLAS_CORETYPE is read at load time): faiss search, k = M."""
    import faiss
    from threadpoolctl import threadpool_info

    queries, x = data(q, d, n)
    q32 = queries.astype(np.float32)
    shard = 4 * block
    indexes = []
    for s in range(0, n, shard):
        index = faiss.IndexFlatIP(d)
        index.add(x[s : s + shard].astype(np.float32))
        indexes.append(index)
    seconds = best_of(lambda: [ix.search(q32, m) for ix in indexes], 2)
    arch = [
        i.get("architecture")
        for i in threadpool_info()
        if "faiss" in i["filepath"] and i["internal_api"] == "openblas"
    ]
    print(json.dumps({"seconds": seconds, "kernel": arch[0] if arch else None}))


def run_faiss(args, coretype):
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    cmd = [
        sys.executable,
        __file__,
        "--faiss-child",
        *map(str, (args.queries, args.dim, args.distractors, args.m, args.block)),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--queries", type=int, default=1200)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--distractors", type=int, default=393_216)
    p.add_argument("--m", type=int, default=4000)
    p.add_argument("--block", type=int, default=32_768)
    p.add_argument("--jax-distractors", type=int, default=262_144, help="0 skips the jax pass")
    p.add_argument("--coretype", default="Haswell", help="OPENBLAS_CORETYPE for faiss")
    p.add_argument("--faiss-child", nargs=5, type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.faiss_child:
        return faiss_child(*args.faiss_child)

    import jax
    import jax.numpy as jnp
    from threadpoolctl import threadpool_info

    q, d, n = args.queries, args.dim, args.distractors
    queries, x = data(q, d, n)
    gflop = 2 * q * d * n / 1e9
    print(
        f"{q} queries x {d} dims x {n:,} distractors, M = {args.m}, block {args.block}; "
        f"{gflop:.0f} GFLOP per pass; jax on {jax.default_backend()}; "
        f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}"
    )
    t_np = best_of(numpy_matmul(queries, x, args.block), 2)
    t_host, _, host = min(
        (scoring_pass("host", queries, x, args.m, args.block) for _ in range(2)), key=lambda r: r[0]
    )
    t_np = min(t_np, best_of(numpy_matmul(queries, x, args.block), 1))  # again, after
    numpy_kernel = [
        i.get("architecture")
        for i in threadpool_info()
        if "numpy" in i["filepath"] and i["internal_api"] == "openblas"
    ]
    rows = [
        ("numpy matmul (float32)", t_np, f"OpenBLAS {numpy_kernel[0] if numpy_kernel else '?'}"),
        ("host pass: top-M + counts", t_host, "numpy matmul + tailaware.search.topk"),
    ]
    faiss_runs = [(c, run_faiss(args, c)) for c in ("", args.coretype)]
    for coretype, r in faiss_runs:
        label = f"OPENBLAS_CORETYPE={coretype}" if coretype else "as installed"
        rows.append((f"faiss IndexFlatIP k={args.m}", r["seconds"], f"{label}: {r['kernel']}"))
    t_faiss = min(r["seconds"] for _, r in faiss_runs)

    t_jax_mm = t_jax = None
    if args.jax_distractors:
        nj = min(args.jax_distractors, n)
        xj = x[:nj]
        qd = jnp.asarray(queries)
        blocks = [jnp.asarray(xj[s : s + args.block]) for s in range(0, nj, args.block)]
        dot = jax.jit(
            lambda a, b: jax.lax.dot_general(
                a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
            )
        )
        for b in blocks:
            dot(qd, b).block_until_ready()
        t_jax_mm = best_of(lambda: [dot(qd, b).block_until_ready() for b in blocks], 2)
        # Compiles: the same data, as the pass's slots are sized by what the pilot sees.
        scoring_pass("jax", queries, xj, args.m, args.block)
        t_jax, _, jax_backend = scoring_pass("jax", queries, xj, args.m, args.block)
        t_jax_mm = min(
            t_jax_mm, best_of(lambda: [dot(qd, b).block_until_ready() for b in blocks], 1)
        )
        scale = n / nj
        rows.append((f"jax matmul (f16 in, f32 acc) [{nj:,}]", t_jax_mm * scale, "XLA"))
        rows.append((f"jax pass (on device) [{nj:,}]", t_jax * scale, "device_topk"))

    print(f"\n{'':44}{'seconds':>9}{'GFLOP/s':>9}  kernel")
    for name, t, note in rows:
        print(f"{name:44}{t:9.2f}{gflop / t:9.1f}  {note}")
    buffered = sum(top.buffered for top in host.tops) / q
    floor = "a guessed floor" if np.isfinite(host.tops[0].floor).all() else "no floor"
    print(f"\nhost pass buffered {buffered:,.0f} scores per query (M = {args.m}; {floor})")
    print("\nratios (higher is better; bars: host/numpy >= 0.85, host/faiss >= 1)")
    print(f"  host pass / numpy matmul   {t_np / t_host:6.3f}")
    print(f"  host pass / best faiss     {t_faiss / t_host:6.3f}")
    if t_jax:
        print(f"  jax pass / jax matmul      {t_jax_mm / t_jax:6.3f}  (bar on CPU: >= 0.3)")
        b = jax.device_get(jax_backend.buf)
        print(
            f"  jax pass: {jax_backend.num_devices} device(s), {int(b.dense.sum())} dense blocks, "
            f"{int(b.heavy.sum())} queries cut alone, {int(b.cuts.sum())} buffer cuts"
        )


if __name__ == "__main__":
    main()
