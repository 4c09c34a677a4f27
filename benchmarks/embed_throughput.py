"""Images/s of the jit-compiled Flax ViT-B/16 against the same model in PyTorch, same run.

The reference is transformers' `CLIPVisionModelWithProjection` (ViT-B/16, random weights,
SDPA attention) converted with `models.convert`, so both compute the same function (checked).
Both sides use the same threads (`torch.set_num_threads`; XLA's Eigen pool is sized by the
process's CPU affinity, so `--threads` pins the process) on the same batch and resolution.
Timings alternate Flax and PyTorch batches so a busy machine slows both alike; the median of
each side is reported.

Command (CPU, ~2 min on 2 cores):
  python benchmarks/embed_throughput.py --batch=8 --resolution=224
Prints one JSON line: images/s of each side and `ratio` = Flax / PyTorch. With an accelerator,
pass `--device` to time only Flax (bfloat16) and report the share of peak FLOP/s.

Needs the `convert` extra (torch, transformers) for the reference side.
"""

import argparse
import json
import os
import sys
import time

# Extra XLA flags for the CPU side. Measured on 2 cores (ViT-B/16, batch 8, 224 px), none
# helped reliably: --xla_cpu_use_onednn=true 0.74x, --xla_cpu_enable_fast_math=true 0.83x,
# --xla_cpu_use_xnnpack=true 0.99..1.27x, against 1.05..1.18x with none. What made Flax match
# PyTorch was computing the patch embedding as a matmul (`models.vit.PatchEmbed`).
CPU_XLA_FLAGS = ""


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--variant", default="B/16")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="0 = every CPU of this process")
    p.add_argument("--xla_flags", default=None, help=f"default: {CPU_XLA_FLAGS!r}")
    p.add_argument("--device", action="store_true", help="accelerator: Flax only, bfloat16")
    p.add_argument("--peak_tflops", type=float, default=0.0, help="accelerator peak (bf16)")
    return p.parse_args()


def main():
    args = _parse()
    if args.threads:
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: args.threads]))
    threads = len(os.sched_getaffinity(0))
    flags = CPU_XLA_FLAGS if args.xla_flags is None else args.xla_flags
    if not args.device:
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
        os.environ.setdefault("JAX_PLATFORMS", "cpu")

    import jax
    import jax.numpy as jnp
    import numpy as np

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tailaware.models import vit

    size, patch = args.variant.split("/")
    width, depth, mlp_dim, heads = vit.SIZES[size]
    grid = args.resolution // int(patch)
    spec = vit.vit_spec("clip", args.variant, pos_grid=grid, proj_dim=512)
    b, r = args.batch, args.resolution
    x = np.random.default_rng(0).standard_normal((b, 3, r, r), dtype=np.float32)
    flops = vit.flops_per_image(spec, (grid, grid))

    if args.device:
        module = vit.ViT(spec, dtype=jnp.bfloat16)
        params = vit.random_variables(module, jnp.zeros((1, r, r, 3), jnp.float32))
        flax_fn = _flax_runner(module, params, x)
        times = [_time(flax_fn) for _ in range(args.iters + 2)][2:]
        ips = b / float(np.median(times))
        out = dict(
            device=str(jax.devices()[0]),
            batch=b,
            resolution=r,
            flax_images_per_s=ips,
            tflops=ips * flops / 1e12,
        )
        if args.peak_tflops:
            out["share_of_peak"] = out["tflops"] / args.peak_tflops
        print(json.dumps(out))
        return

    import torch
    import transformers

    from tailaware import models

    torch.set_num_threads(threads)
    cfg = transformers.CLIPVisionConfig(
        hidden_size=width,
        num_hidden_layers=depth,
        intermediate_size=mlp_dim,
        num_attention_heads=heads,
        image_size=r,
        patch_size=int(patch),
        projection_dim=512,
    )
    ref = transformers.CLIPVisionModelWithProjection(cfg).eval()
    state = {k: v.numpy() for k, v in ref.state_dict().items()}
    params = models.convert(state, "hf_clip", spec)
    module = vit.ViT(spec)
    flax_fn = _flax_runner(module, params, x)
    xt = torch.from_numpy(x)

    def torch_fn():
        with torch.inference_mode():
            return ref(xt).image_embeds.numpy()

    diff = float(np.abs(flax_fn() - torch_fn()).max())  # also the warm-up / compile
    torch_fn()
    flax_fn()
    flax_t, torch_t = [], []
    for _ in range(args.iters):
        flax_t.append(_time(flax_fn))
        torch_t.append(_time(torch_fn))
    flax_ips, torch_ips = b / float(np.median(flax_t)), b / float(np.median(torch_t))
    print(
        json.dumps(
            dict(
                variant=args.variant,
                batch=b,
                resolution=r,
                threads=threads,
                xla_flags=flags,
                torch=torch.__version__,
                jax=jax.__version__,
                max_abs_diff=diff,
                flax_images_per_s=round(flax_ips, 3),
                torch_images_per_s=round(torch_ips, 3),
                ratio=round(flax_ips / torch_ips, 3),
                flax_gflops=round(flax_ips * flops / 1e9, 1),
            )
        )
    )


def _flax_runner(module, params, x_nchw):
    import jax
    import numpy as np

    apply = jax.jit(lambda p, x: module.apply(p, x)[0])
    x = jax.device_put(np.ascontiguousarray(x_nchw.transpose(0, 2, 3, 1)))
    params = jax.device_put(params)
    return lambda: np.asarray(apply(params, x))


def _time(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
