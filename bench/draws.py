"""A toy preset's step with pd's written-out draws (`pd.rng`) against the same step drawing with
`jax.random`, timed in one process with the windows interleaved (this machine is shared: runs
minutes apart differ by more than the effect).

    python bench/draws.py [PRESET] [--batch N] [--set key=value ...] [--windows N]

Both programs draw the same numbers (`tests/test_rng.py`); only their speed differs.
"""

import argparse
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Key

from pd import rng
from pd.init import key_tree
from pd.state import TrainState
from pd.train.config import load_config
from pd.train.init_state import init_train_state
from pd.train.kinds import as_toy, kind_of
from pd.train.objective import Metrics
from pd.train.run import make_recipe
from pd.train.step import ToySampler, steps_fn
from pd.xla import compiler_options

Steps = Callable[..., tuple[TrainState, Metrics]]


def _jax_uniform(
    key: Key[Array, ""], shape: tuple[int, ...], minval: float = 0.0, maxval: float = 1.0
) -> Float[Array, "..."]:
    return jax.random.uniform(key, shape, minval=minval, maxval=maxval)


def _jax_bernoulli(key: Key[Array, ""], p: float, shape: tuple[int, ...]) -> Bool[Array, "..."]:
    return jax.random.bernoulli(key, p, shape)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", nargs="?", default="tms_5-2")
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--windows", type=int, default=10, help="timed windows of 50 steps each")
    args = parser.parse_args()
    overrides = [*args.overrides, *([f"train.batch={args.batch}"] if args.batch else [])]
    config = load_config(args.preset, overrides)
    kind = kind_of(config.target)
    recipe = make_recipe(config, kind)
    frozen = kind.load_frozen(recipe.target).params
    init_key, src_key, run_key = key_tree(config.seed)
    n = jnp.asarray(50, jnp.int32)
    ours = rng.uniform, rng.bernoulli
    draws = {"jax.random": (_jax_uniform, _jax_bernoulli), "pd.rng": ours}
    programs: dict[str, tuple[Steps, TrainState]] = {}
    for name, (uniform, bernoulli) in draws.items():
        rng.uniform, rng.bernoulli = uniform, bernoulli  # read when the step is traced, below
        steps: Steps = jax.jit(
            steps_fn(recipe, ToySampler(as_toy(recipe.target), config.train.batch)),
            compiler_options=compiler_options(recipe.ci_fn),
        )
        state, metrics = steps(init_train_state(recipe, init_key, src_key), frozen, run_key, n)
        metrics["loss/total"].block_until_ready()
        programs[name] = steps, state
    rng.uniform, rng.bernoulli = ours
    times: dict[str, list[float]] = {name: [] for name in programs}
    for _ in range(args.windows):
        for name, (steps, state) in programs.items():
            t0 = time.perf_counter()
            state, metrics = steps(state, frozen, run_key, n)
            metrics["loss/total"].block_until_ready()
            times[name].append((time.perf_counter() - t0) / 50 * 1e3)
            programs[name] = steps, state
    base = statistics.median(times["jax.random"])
    print(
        f"{args.preset}, batch {config.train.batch}: medians of {args.windows} windows of 50 steps"
    )
    for name, ts in times.items():
        ms = statistics.median(ts)
        print(f"{name:<11} {ms:7.3f} ms/step  (min {min(ts):.3f})  {ms / base:.2f}×")


if __name__ == "__main__":
    main()
