"""The accelerator check (issue #24): embedding throughput and MFU, the scoring pass against the
bare matmul, and the pass's exactness against the host.

Command (one H200, ~5 minutes; --budget_s stops starting new parts past 7 minutes):
  python benchmarks/device_check.py
CPU smoke run (tiny sizes, ~2 minutes on 2 cores): python benchmarks/device_check.py --smoke

Prints three tables:
1. Embedding: ViT-B/16 (CLIP layout) and ViT-L/14 (DINOv2 layout), random weights, bfloat16,
   at 224 and 518 px, batches on the device: images/s, TFLOP/s and model-FLOPs utilisation =
   `models.vit.flops_per_image` x images/s / peak. The peak is --peak_tflops (default 989:
   H100/H200 SXM bf16 dense, without sparsity). Also which attention kernel XLA compiled
   (cuDNN's fused one or XLA's own).
2. Scoring at D = 768, Q = 1,232, N = 10M float16 rows generated on the device in blocks: GF/s
   (2 Q D N flops) of the bare matmul (float32 scores of every block), of the device pass
   (`tailaware.search.device_topk`: top-M = 4,000 with ids and exact counts above 8 positives per
   query, with a floor guessed from a pilot as the engine does), its ratio to the matmul (the
   bar: >= 0.7), the whole JAX backend on --engine_rows rows read from host memory (as a search
   does, transfers included), and faiss-gpu's flat inner-product search at k = min(M, 2048)
   over --faiss_rows rows already on the GPU (float32 and float16 storage).
3. Exactness: the JAX backend against the host backend on descriptors whose dot products are
   exact in any summation order (ids, scores and counts equal), with the default sizes and with
   tiny ones that take every path of the pass.

Whatever the machine lacks (a GPU, faiss-gpu, time) is skipped with a line saying so.
"""

import argparse
import functools
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

H200_BF16_TFLOPS = 989.0  # dense bf16 tensor-core peak of an H100/H200 SXM (NVIDIA datasheet)


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes: proves the script runs")
    p.add_argument("--peak_tflops", type=float, default=H200_BF16_TFLOPS)
    p.add_argument("--budget_s", type=float, default=420.0, help="start no part after this")
    p.add_argument(
        "--vit",
        default="B/16:clip:224:256,B/16:clip:518:64,L/14:dinov2:224:128,L/14:dinov2:518:32",
        help="variant:family:resolution:batch,...",
    )
    p.add_argument("--vit_iters", type=int, default=10)
    p.add_argument("--queries", type=int, default=1232)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--block", type=int, default=131_072)
    p.add_argument("--m", type=int, default=4000)
    p.add_argument("--positives", type=int, default=8)
    p.add_argument("--engine_rows", type=int, default=1_048_576)
    p.add_argument("--faiss_rows", type=int, default=2_097_152)
    args = p.parse_args()
    if args.smoke:
        args.vit = "mu/16:clip:64:4,mu/14:dinov2:56:4"
        args.vit_iters = 2
        args.queries, args.dim, args.rows, args.block, args.m = 64, 64, 65_536, 8192, 400
        args.engine_rows, args.faiss_rows = 16_384, 16_384
    return args


class Clock:
    """Seconds since start; whether there is time left to start a part."""

    def __init__(self, budget_s):
        self.t0, self.budget_s = time.perf_counter(), budget_s

    def left(self, part: str) -> bool:
        elapsed = time.perf_counter() - self.t0
        if elapsed > self.budget_s:
            print(f"[skipped {part}: {elapsed:.0f} s elapsed, budget {self.budget_s:.0f} s]")
            return False
        return True


def _timed(fn, iters):
    """Returns the best seconds per call of `fn` (which blocks) over `iters` calls, after one."""
    fn()
    best = float("inf")
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def embedding(args, clock):

    from tailaware.models import vit

    print(f"\n1. Embedding (bfloat16, random weights; MFU against {args.peak_tflops:.0f} TFLOP/s)")
    print(
        f"{'model':14}{'px':>5}{'tokens':>7}{'batch':>6}{'images/s':>10}{'TFLOP/s':>9}"
        f"{'MFU':>7}  attention"
    )
    for item in filter(None, args.vit.split(",")):  # "" skips the part
        variant, family, res, batch = item.split(":")
        res, batch = int(res), int(batch)
        if not clock.left(f"ViT-{variant} at {res} px"):
            continue
        try:
            _one_vit(args, vit, variant, family, res, batch)
        except Exception as e:  # report and go on: the other parts still say something
            print(f"ViT-{variant} at {res} px failed: {type(e).__name__}: {e}"[:400])


def _one_vit(args, vit, variant, family, res, batch):
    """Prints one row of the embedding table."""
    import jax
    import jax.numpy as jnp

    patch = int(variant.split("/")[1])
    grid = res // patch
    spec = vit.vit_spec(family, variant, pos_grid=grid)
    module = vit.ViT(spec, dtype=jnp.bfloat16)
    params = jax.device_put(
        vit.random_variables(module, jnp.zeros((1, patch, patch, 3), jnp.float32))
    )
    images = jax.random.normal(jax.random.key(0), (batch, res, res, 3), jnp.float32)
    grids = jnp.full((batch, 2), grid, jnp.int32)  # the padded path, as `embed` runs it
    apply = jax.jit(lambda p, x, g, m=module: m.apply(p, x, g)[0])
    compiled = apply.lower(params, images, grids).compile()
    attention = "cuDNN fused" if "cudnn$fmha" in compiled.as_text() else "XLA"
    run = lambda c=compiled, a=(params, images, grids): c(*a).block_until_ready()
    seconds = _timed(run, args.vit_iters)
    ips = batch / seconds
    flops = vit.flops_per_image(spec, (grid, grid))
    tokens = grid * grid + int(spec.class_token) + spec.num_registers
    tflops = ips * flops / 1e12
    print(
        f"ViT-{variant:10}{res:>5}{tokens:>7}{batch:>6}{ips:>10.1f}{tflops:>9.1f}"
        f"{tflops / args.peak_tflops:>7.1%}  {attention}"
    )


def _blocks(key, n_rows, block, dim, centers):
    """Yields float16 unit rows [block, D] from 64 clusters (as benchmarks/scoring.py's data)."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def make(k):
        ka, kb = jax.random.split(k)
        a = 0.3 * centers[jax.random.randint(ka, (block,), 0, centers.shape[0])]
        a = a + jax.random.normal(kb, (block, dim), jnp.float32)
        return (a / jnp.linalg.norm(a, axis=1, keepdims=True)).astype(jnp.float16)

    for i in range(-(-n_rows // block)):
        yield make(jax.random.fold_in(key, i))


def search(args, clock):
    import jax
    import jax.numpy as jnp

    from tailaware.search import backends, device_topk, topk

    q, d, n, b, m = args.queries, args.dim, args.rows, args.block, args.m
    n = -(-n // b) * b
    gflop = 2 * q * d * n / 1e9
    print(
        f"\n2. Scoring: Q = {q}, D = {d}, N = {n:,} float16 rows in blocks of {b:,}, "
        f"M = {m}, P = {args.positives}; {gflop:,.0f} GFLOP per pass"
    )
    key = jax.random.key(1)
    centers = jax.random.normal(jax.random.key(2), (64, d), jnp.float32)
    queries = next(_blocks(jax.random.key(3), q, q, d, centers))
    blocks = list(_blocks(key, n, b, d, centers))  # N D 2 bytes on the device (15 GB at 10M)
    jax.block_until_ready(blocks)
    rows_out = []

    dot = jax.jit(device_topk.dot)

    def matmul():
        for x in blocks:  # each [Q, B] result is dropped (freed) once computed
            out = dot(queries, x)
        out.block_until_ready()

    t_mm = _timed(matmul, 2)
    rows_out.append(("bare matmul (f16 in, f32 scores)", n, t_mm, "XLA"))

    # Positives at a spread of quantiles of each query's pilot scores: some beyond the top-M.
    pilot = np.asarray(dot(queries, blocks[0][:4096]))
    levels = np.linspace(0.5, 1.0, args.positives)
    pos = np.quantile(pilot, levels, axis=1).T.astype(np.float32)  # [Q, P]
    floor = topk.guess_floor(pilot, m, n)  # as the engine does (`scoring._pilot_floor`)
    share = 1.0 if floor is None else float(np.mean(pilot >= floor[:, None], axis=1).max())
    floor = np.full(q, -np.inf, np.float32) if floor is None else floor
    settings = device_topk.Settings(m, capacity=device_topk.capacity_for(share, b))
    step = jax.jit(functools.partial(device_topk.step, settings=settings), donate_argnums=0)
    pos_d, floor_d = jnp.asarray(pos), jnp.asarray(floor)
    row = jnp.arange(b, dtype=jnp.int32)
    shard_of = [jnp.full(b, i, jnp.int32) for i in range(len(blocks))]

    def run_pass():
        buf = device_topk.empty(q, args.positives, settings, jnp)  # made on the device
        for i, x in enumerate(blocks):
            buf = step(buf, queries, x, shard_of[i], row, pos_d, floor_d)
        return jax.block_until_ready(buf)

    t_pass = _timed(run_pass, 1)
    buf = jax.device_get(run_pass())
    rows_out.append(
        (
            "device pass: top-M + counts",
            n,
            t_pass,
            f"C = {settings.capacity}: {int(buf.dense)} dense blocks, "
            f"{int(buf.heavy)} queries cut alone, {int(buf.cuts)} cuts",
        )
    )

    if clock.left("the JAX backend from host memory"):
        ne = min(args.engine_rows, n)
        host_x = np.concatenate([np.asarray(x) for x in blocks[: -(-ne // b)]])[:ne]
        backend = backends.JaxBackend(np.asarray(queries), m, b, "float16")
        backend.expect_share(share)

        def engine():
            backend.start(pos, topk.empty_state(q, m, args.positives)._replace(floor=floor))
            for s in range(0, ne, b):
                backend.add(host_x[s : s + b], backends.global_ids(0, np.arange(s, min(s + b, ne))))
            return backend.state()

        t_engine = _timed(engine, 1)
        rows_out.append(
            ("JaxBackend (host rows, transfers)", ne, t_engine, f"{backend.num_devices} device(s)")
        )

    rows_out += _faiss(args, clock, blocks, queries, n)
    print(f"{'':38}{'rows':>12}{'seconds':>9}{'GFLOP/s':>10}  notes")
    for name, rows, t, note in rows_out:
        print(f"{name:38}{rows:>12,}{t:>9.3f}{2 * q * d * rows / t / 1e9:>10.0f}  {note}")
    print(f"device pass / bare matmul: {t_mm / t_pass:.3f} (bar: >= 0.7 on a GPU)")


def _faiss(args, clock, blocks, queries, n):
    try:
        import faiss
    except ImportError:
        print("[skipped faiss: not installed]")
        return []
    if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() == 0:
        print("[skipped faiss-gpu: this faiss has no GPU]")
        return []
    if not clock.left("faiss-gpu"):
        return []
    nf = min(args.faiss_rows, n)
    per = blocks[0].shape[0]
    x = np.concatenate([np.asarray(b) for b in blocks[: -(-nf // per)]])[:nf]
    q32 = np.asarray(queries, np.float32)
    k = min(args.m, 2048)
    res = faiss.StandardGpuResources()
    out = []
    for half in (False, True):
        config = faiss.GpuIndexFlatConfig()
        config.device, config.useFloat16 = 0, half
        index = faiss.GpuIndexFlatIP(res, x.shape[1], config)
        index.add(x.astype(np.float32))
        t = _timed(lambda index=index: index.search(q32, k), 2)
        out.append(
            (
                f"faiss-gpu IndexFlatIP k={k}",
                nf,
                t,
                "float16 storage" if half else "float32 storage",
            )
        )
        del index
    return out


def exactness(args, clock):
    if not clock.left("the exactness check"):
        return
    import jax

    from tailaware.io import ilias_folder
    from tailaware.search import device_topk, scoring

    print("\n3. Exactness: JAX backend against the host backend (ternary descriptors, ties)")
    rng = np.random.default_rng(0)
    q, d, m = 64, 64, 200
    ternary = lambda *s: (rng.integers(-1, 2, size=s) * 0.25).astype(np.float16)
    queries = ternary(q, d)
    shard_x = [ternary(n, d) for n in (20_000, 0, 13_000, 7_001)]
    pos = rng.integers(-24, 40, size=(q, 5)).astype(np.float32) / 16
    pos[:, 4] = np.nan  # a padding slot
    shards = [ilias_folder.memory_shard(i, x) for i, x in enumerate(shard_x)]
    spec = scoring.SearchSpec(1.0, 0, m, "check")
    host, _ = scoring.score_shards(
        scoring.HostBackend(queries, m), pos, shards, spec, block_size=8192
    )
    tiny = device_topk.Settings(m, capacity=32, chunk=4, spare=1, heavy_rows=16)
    for name, settings in [("default sizes", None), ("tiny sizes (fallbacks)", tiny)]:
        backend = scoring.JaxBackend(queries, m, 8192, "float16", settings)
        state, _ = scoring.score_shards(backend, pos, shards, spec, block_size=8192)
        equal = all(np.array_equal(a, b) for a, b in zip(state[:3], host[:3], strict=True))
        buf = jax.device_get(backend.buf)
        print(
            f"  {name:26} ids, scores, counts equal: {equal}  ({int(buf.dense.sum())} dense, "
            f"{int(buf.heavy.sum())} cut alone, {int(buf.cuts.sum())} cuts; "
            f"{int((host.counts > m).sum())} counts beyond M)"
        )


def main():
    args = _parse()
    if args.smoke:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    if args.smoke:  # two CPU devices: the JAX backend splits its blocks as on several GPUs
        jax.config.update("jax_num_cpu_devices", 2)

    clock = Clock(args.budget_s)
    devices = jax.local_devices()
    print(
        f"jax {jax.__version__} on {devices[0].platform}: {len(devices)} x "
        f"{devices[0].device_kind}"
        + ("" if devices[0].platform == "gpu" else "  [no GPU: sizes and rates are not the GPU's]")
    )
    embedding(args, clock)
    if clock.left("scoring"):
        try:
            search(args, clock)
        except Exception as e:  # report and go on to the exactness check
            print(f"scoring failed: {type(e).__name__}: {e}"[:400])
    exactness(args, clock)
    print(f"\ntotal {time.perf_counter() - clock.t0:.0f} s")


if __name__ == "__main__":
    main()
