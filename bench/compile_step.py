"""Compile-only seconds and FLOPs of `train_step` (and `init_train_state`) at the Llama-3-8B
production shape (`llama8b_full`) on 8 simulated CPU devices, over a number of layers — the pull
request's `jit_step` attribution, reproduced on CPU. Nothing is allocated.

    python bench/compile_step.py [--layers 4,8,32] [--count-flops-at 4]

The step scans one layer body over layer-stacked weights, so its compile should not grow with
depth (`docs/performance.md`, "Compile time and FLOPs").

FLOPs are XLA's cost analysis of the compiled program, per device. XLA counts a `while` loop's
body once and a conditional as its most expensive branch, so the `TFLOP/dev` column of the
scanned program is the work of one iteration of each loop. The work a step really does is
counted at `--count-flops-at` layers by compiling the same step with every loop unrolled
(`pd.loops.unrolled`): each iteration is then counted and each per-site `lax.cond`, whose
predicate is then a constant, folds to the branch that runs.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

import argparse
import time
from collections.abc import Callable

import jax

from pd import loops
from pd.train.compile_only import compile_only
from pd.train.config import load_config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", default="4,8,32")
    parser.add_argument("--count-flops-at", type=int, default=4, help="0: skip")
    args = parser.parse_args()
    print(f"{jax.device_count()} simulated devices; llama8b_full, 7 sites and 1 CI chunk per layer")
    print(
        f"{'layers':>6} {'sites':>5}  {'jit':<17} {'trace s':>8} {'lower s':>8} "
        f"{'compile s':>9} {'TFLOP/dev':>10}"
    )
    clear_caches: Callable[[], None] = jax.clear_caches  # unannotated upstream
    for n in (int(v) for v in args.layers.split(",")):
        clear_caches()  # each shape compiles from scratch
        t0 = time.perf_counter()
        report = compile_only(load_config("llama8b_full", [f"target.n_layers={n}"]))
        times, flops = report.times, report.flops
        wall = time.perf_counter() - t0
        for name in ("init_train_state", "train_step"):
            r = times.by_name[name]
            print(
                f"{n:>6} {7 * n:>5}  {name:<17} {r['trace_s']:8.2f} {r['lower_s']:8.2f} "
                f"{r['compile_s']:9.2f} {flops[name] / 1e12:10.3f}",
                flush=True,
            )
        print(f"{'':>6} {'':>5}  {'(wall, all)':<17} {wall:8.2f}", flush=True)
    if args.count_flops_at:
        n = args.count_flops_at
        clear_caches()
        with loops.unrolled():
            report = compile_only(load_config("llama8b_full", [f"target.n_layers={n}"]))
            times, flops = report.times, report.flops
        print(
            f"every loop unrolled at {n} layers: train_step {flops['train_step'] / 1e12:.3f} "
            f"TFLOP per device per step ({times.by_name['train_step']['compile_s']:.1f} s compile)"
        )


if __name__ == "__main__":
    main()
