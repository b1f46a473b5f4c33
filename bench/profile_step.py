"""Where a preset's training step spends its time: a `jax.profiler` trace of steady-state steps,
read back with `jax.profiler.ProfileData`, summed by XLA operation.

    python bench/profile_step.py [PRESET] [--batch N] [--set key=value ...] [--steps N] [--top N]

Prints the ms per step of each of the `--top` costliest operations (fusions, dots, loops; a loop's
time includes its body's operations, and the two CPU threads overlap, so the rows do not add up
to the wall time), plus the compiled step's `cost_analysis` FLOPs and bytes. The trace is kept under
`--trace-dir` for TensorBoard's profile plugin where that is installed.
"""

import argparse
import collections
import tempfile
import time
from pathlib import Path

import jax

from pd.init import key_tree
from pd.train.config import load_config
from pd.train.init_state import init_train_state
from pd.train.kinds import kind_of
from pd.train.recipe import make_batches, make_recipe
from pd.train.step import make_train_step, step_fn
from pd.xla import compiler_options


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", nargs="?", default="tms_5-2")
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--trace-dir", default="")
    args = parser.parse_args()
    overrides = [*args.overrides, *([f"train.batch={args.batch}"] if args.batch else [])]
    config = load_config(args.preset, overrides)
    recipe = make_recipe(config)
    frozen = kind_of(config.target).load_frozen(recipe.target).params
    init_key, src_key, run_key = key_tree(config.seed)
    state = init_train_state(recipe, init_key, src_key)
    step, batches = make_train_step(recipe), make_batches(config, recipe, run_key)
    x = batches(0)
    traced = jax.jit(step_fn(recipe), compiler_options=compiler_options(recipe.ci_fn))
    cost = traced.lower(state, frozen, x, run_key).compile().cost_analysis() or {}
    for i in range(5):  # compile and warm up
        state, metrics = step(state, frozen, batches(i), run_key)
    metrics["loss/total"].block_until_ready()
    trace_dir = Path(args.trace_dir or tempfile.mkdtemp(prefix="pd-profile-"))
    with jax.profiler.trace(str(trace_dir)):
        t0 = time.perf_counter()
        for i in range(args.steps):
            state, metrics = step(state, frozen, batches(5 + i), run_key)
        metrics["loss/total"].block_until_ready()
    wall_ms = (time.perf_counter() - t0) / args.steps * 1e3
    xplane = next(trace_dir.rglob("*.xplane.pb"))
    totals: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    for plane in jax.profiler.ProfileData.from_file(str(xplane)).planes:
        for line in plane.lines:
            for event in line.events:
                if plane.name.startswith("/host:CPU") and _is_op(event):
                    totals[event.name] += event.duration_ns
                    counts[event.name] += 1
    print(f"batch {config.train.batch}: {args.steps} steps, trace in {trace_dir}")
    print(
        f"cost_analysis: {cost.get('flops', 0) / 1e6:.1f} MFLOP, "
        f"{cost.get('bytes accessed', 0) / 1e6:.1f} MB per step"
    )
    print(f"{'ms/step':>8} {'calls/step':>10}  operation")
    for name, ns in totals.most_common(args.top):
        print(f"{ns / args.steps / 1e6:8.3f} {counts[name] / args.steps:10.1f}  {name[:100]}")
    print(f"{wall_ms:8.3f} {'':>10}  (wall time per step, while tracing)")


def _is_op(event: jax.profiler.ProfileEvent) -> bool:
    """An XLA operation, not the runtime's own spans around a whole program."""
    return not event.name.startswith(("Pjit", "Thunk", "$", "jit_", "CommonPjRt", "Allocate"))


if __name__ == "__main__":
    main()
