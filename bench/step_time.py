"""Steady-state ms/step, samples/s and the step program's compile seconds of presets.

    python bench/step_time.py [PRESET ...] [--batch N] [--set key=value ...]
    (default presets: tms_5-2 resid_mlp1 tiny_llama)
    python bench/step_time.py PRESET --random-target [--peak-tflops T] [--set key=value ...]
    python bench/step_time.py PRESET --count-flops [--set key=value ...]

Prints a table; the median of 5 timed windows of 50 steps each is the ms/step. `--batch`
overrides `train.batch` (samples/s counts examples, not tokens). Steps are taken as a run
takes them: a toy's 50 steps are one call of `train_steps`, drawing their batches on device; a
language model's are 50 calls of `train_step` on token windows moved from the host. The
target is trained first if it is not cached.

`--random-target` times a language-model preset at any shape without training or loading a
target: random bf16 frozen weights (as a run holds a loaded checkpoint), random tokens, the
preset's mesh. It prints ms/step (the median of 5 windows of 5 steps), the step's FLOPs, the
rate and the MFU against `--peak-tflops`, and the device's peak memory where the backend
reports it. The FLOPs are XLA's cost analysis of the same step compiled for CPU with every
loop unrolled (`pd.loops.unrolled`), in a subprocess: a GPU's cost analysis does not count the
library GEMMs. The default peak is 790 TFLOP/s (an H200's large bf16 matmul) on a GPU, and on
a CPU the rate this machine measures on a 2048³ matmul in the step's compute dtype.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from pd.compile_times import recording
from pd.init import key_tree
from pd.state import TrainState
from pd.targets.configs import LlamaConfig
from pd.targets.llama import Llama
from pd.train.config import RunConfig, load_config
from pd.train.init_state import init_train_state
from pd.train.kinds import kind_of
from pd.train.objective import Metrics
from pd.train.run import make_batches, make_recipe
from pd.train.step import make_train_step, make_train_steps


def measure(
    preset: str, overrides: list[str], windows: int = 5, steps_per_window: int = 50
) -> tuple[float, int, dict[str, float]]:
    config = load_config(preset, overrides)
    kind = kind_of(config.target)
    recipe = make_recipe(config, kind)
    frozen = kind.load_frozen(recipe.target).params
    init_key, src_key, run_key = key_tree(config.seed)
    state = init_train_state(recipe, init_key, src_key)
    sample = kind.sampler(recipe.target, config.train.batch)
    if sample is not None:  # as a run takes them: the steps between logged steps in one call
        steps = make_train_steps(recipe, sample)
        name = "train_steps"

        def window(state: TrainState, first: int) -> tuple[TrainState, Metrics]:
            return steps(state, frozen, run_key, jnp.asarray(steps_per_window, jnp.int32))
    else:
        step, batches = make_train_step(recipe), make_batches(config, recipe, run_key)
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


def language_model(config: RunConfig) -> LlamaConfig:
    if not isinstance(config.target, LlamaConfig):
        sys.exit(f"--random-target needs a language-model preset, not '{config.target.kind}'")
    return config.target


def step_flops(preset: str, overrides: list[str]) -> float:
    """The step's FLOPs per device, counted on CPU with every loop unrolled (in this process:
    call it where the CPU is the default backend)."""
    from pd import loops
    from pd.train.compile_only import compile_only

    with loops.unrolled():
        report = compile_only(load_config(preset, overrides))
    return report.flops["train_step"]


def counted_flops(preset: str, overrides: list[str], devices: int) -> float:
    """`step_flops` in a CPU-only subprocess with `devices` simulated devices."""
    env = os.environ | {
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
    }
    argv = [sys.executable, __file__, preset, "--count-flops"]
    argv += [a for o in overrides for a in ("--set", o)]
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
    return float(json.loads(out.strip().splitlines()[-1])["flops"])


def matmul_tflops(dtype: str) -> float:
    """This device's rate on a 2048³ matmul in `dtype` (median of 5)."""
    n = 2048
    dt = jnp.bfloat16 if dtype == "bf16" else jnp.float32
    a = jnp.ones((n, n), dt)
    f = jax.jit(lambda x: jnp.matmul(x, x, preferred_element_type=jnp.float32))
    f(a).block_until_ready()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        f(a).block_until_ready()
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e12


def measure_random_target(
    preset: str, overrides: list[str], windows: int = 5, steps_per_window: int = 5
) -> tuple[float, dict[str, float], float | None]:
    """ms/step of `train_step` on random frozen weights and tokens, its compile seconds, and
    the device's peak bytes in use (None where the backend does not say)."""
    from pd.train.kinds import FROZEN_DTYPE
    from pd.train.placement import placement_of

    config = load_config(preset, overrides)
    recipe = make_recipe(config)
    placement = placement_of(config)
    init_key, src_key, run_key = key_tree(config.seed)
    assert isinstance(recipe.target, Llama)
    frozen = jax.jit(recipe.target.init)(jax.random.key(1))
    frozen = jax.tree.map(lambda a: a.astype(FROZEN_DTYPE), frozen)
    frozen = placement.frozen(recipe.target, frozen)
    state = placement.init(recipe, init_key, src_key)
    step = make_train_step(recipe, placement.shardings(recipe))
    B, T = config.train.batch, recipe.seq_len
    rng = np.random.default_rng(0)
    vocab = language_model(config).vocab

    def batch() -> jax.Array:
        tokens = rng.integers(0, vocab, size=(B, T), dtype=np.int32)
        return placement.batches(lambda step: tokens)(0)

    with recording() as compile_times:
        state, metrics = step(state, frozen, batch(), run_key)
        metrics["loss/total"].block_until_ready()
    times = []
    for _ in range(windows):
        xs = [batch() for _ in range(steps_per_window)]
        t0 = time.perf_counter()
        for x in xs:
            state, metrics = step(state, frozen, x, run_key)
        metrics["loss/total"].block_until_ready()
        times.append((time.perf_counter() - t0) / steps_per_window * 1e3)
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return statistics.median(times), compile_times.by_name["train_step"], peak


def random_target_row(preset: str, overrides: list[str], peak_tflops: float) -> None:
    config = load_config(preset, overrides)
    language_model(config)
    devices = config.mesh.data * config.mesh.model
    flops = counted_flops(preset, overrides, devices)
    ms, c, peak = measure_random_target(preset, overrides)
    if peak_tflops <= 0:
        peak_tflops = (
            790.0 if jax.default_backend() == "gpu" else matmul_tflops(config.train.compute_dtype)
        )
    rate = flops / (ms / 1e3) / 1e12
    memory = "n/a" if peak is None else f"{peak / 2**30:.1f}"
    print(
        f"{'preset':<14} {'layers':>6} {'ms/step':>9} {'TFLOP':>8} {'TFLOP/s':>8} {'MFU':>6} "
        f"{'peak TFLOP/s':>12} {'peak GiB':>8} {'compile s':>9}"
    )
    layers = language_model(config).n_layers
    print(
        f"{preset:<14} {layers:>6} {ms:9.1f} {flops / 1e12:8.2f} {rate:8.2f} "
        f"{rate / peak_tflops:6.1%} {peak_tflops:12.2f} {memory:>8} {c['compile_s']:9.2f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("presets", nargs="*", default=["tms_5-2", "resid_mlp1", "tiny_llama"])
    parser.add_argument("--batch", type=int, default=0, help="train.batch (default: the preset's)")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument(
        "--random-target", action="store_true", help="a language model on random frozen weights"
    )
    parser.add_argument(
        "--peak-tflops", type=float, default=0.0, help="the MFU's peak (default: see above)"
    )
    parser.add_argument(
        "--count-flops",
        action="store_true",
        help="print only the step's FLOPs (CPU-compiled, every loop unrolled) as JSON",
    )
    args = parser.parse_args()
    overrides = [*args.overrides, *([f"train.batch={args.batch}"] if args.batch else [])]
    if args.count_flops:  # (also the subprocess of `counted_flops`)
        print(json.dumps({"flops": step_flops(args.presets[0], overrides)}))
        return
    if args.random_target:
        for preset in args.presets:
            random_target_row(preset, overrides, args.peak_tflops)
        return
    head = f"{'preset':<12} {'batch':>6} {'ms/step':>8} {'samples/s':>10}"
    print(f"{head} {'trace s':>8} {'lower s':>8} {'compile s':>10}")
    for preset in args.presets:
        ms, batch, c = measure(preset, overrides)
        stages = f"{c['trace_s']:8.2f} {c['lower_s']:8.2f} {c['compile_s']:10.2f}"
        print(f"{preset:<12} {batch:6d} {ms:8.2f} {batch / ms * 1e3:10.0f} {stages}", flush=True)


if __name__ == "__main__":
    main()
