"""Steady-state ms/step, samples/s and the step program's compile seconds of presets.

    python bench/step_time.py [PRESET ...] [--batch N] [--set key=value ...]
    (default presets: tms_5-2 resid_mlp1 tiny_llama)

Prints a table; the median of 5 timed windows of 50 steps each is the ms/step. `--batch`
overrides `train.batch` (samples/s counts examples, not tokens). Steps are taken as a run
takes them: a toy's 50 steps are one call of `train_steps`, drawing their batches on device; a
language model's are 50 calls of `train_step` on token windows moved from the host. The
target is trained first if it is not cached.
"""

import argparse
import statistics
import time

import jax.numpy as jnp

from pd.compile_times import recording
from pd.init import key_tree
from pd.state import TrainState
from pd.train.config import load_config
from pd.train.init_state import init_train_state
from pd.train.kinds import kind_of
from pd.train.run import make_batches, make_recipe
from pd.train.step import Metrics, make_train_step, make_train_steps


def measure(
    preset: str, overrides: list[str], windows: int = 5, steps_per_window: int = 50
) -> tuple[float, int, dict[str, float]]:
    config = load_config(preset, overrides)
    kind = kind_of(config.target)
    recipe = make_recipe(config, kind)
    frozen = kind.load_frozen(recipe.target).params
    init_key, src_key, run_key = key_tree(config.seed)
    state = init_train_state(recipe, init_key, src_key)
    if kind.sampler is not None:  # as a run takes them: the steps between logged steps in one call
        steps = make_train_steps(recipe, kind.sampler(recipe.target, config.train.batch))
        name = "train_steps"

        def window(state: TrainState, first: int) -> tuple[TrainState, Metrics]:
            return steps(state, frozen, run_key, jnp.asarray(steps_per_window, jnp.int32))
    else:
        step, batches = make_train_step(recipe), make_batches(config, recipe, run_key, None)
        name = "train_step"

        def window(state: TrainState, first: int) -> tuple[TrainState, Metrics]:
            for s in range(first, first + steps_per_window):
                state, metrics = step(state, frozen, batches(s), run_key)
            return state, metrics

    with recording() as compile_times:
        state, metrics = window(state, 0)
        metrics["loss/total"].block_until_ready()
    compile_s = compile_times.by_name[name]
    times = []
    for w in range(windows):
        t0 = time.perf_counter()
        state, metrics = window(state, (1 + w) * steps_per_window)
        metrics["loss/total"].block_until_ready()
        times.append((time.perf_counter() - t0) / steps_per_window * 1e3)
    return statistics.median(times), config.train.batch, compile_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("presets", nargs="*", default=["tms_5-2", "resid_mlp1", "tiny_llama"])
    parser.add_argument("--batch", type=int, default=0, help="train.batch (default: the preset's)")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    overrides = [*args.overrides, *([f"train.batch={args.batch}"] if args.batch else [])]
    head = f"{'preset':<12} {'batch':>6} {'ms/step':>8} {'samples/s':>10}"
    print(f"{head} {'trace s':>8} {'lower s':>8} {'compile s':>10}")
    for preset in args.presets:
        ms, batch, c = measure(preset, overrides)
        stages = f"{c['trace_s']:8.2f} {c['lower_s']:8.2f} {c['compile_s']:10.2f}"
        print(f"{preset:<12} {batch:6d} {ms:8.2f} {batch / ms * 1e3:10.0f} {stages}", flush=True)


if __name__ == "__main__":
    main()
