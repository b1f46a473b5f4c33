"""Wall time and throughput of N decompositions as one sweep against N runs one after another.

    python bench/sweep.py [PRESET] [--n 16] [--set key=value ...] [--per-program K ...]
        [--cpu-devices D] [--sequential {process,cli,both,none}]

Both sides start from an empty target cache of their own (the target is trained once on each
side: the sequential runs after the first read it from the cache) and include every compile.
The sequential runs are `pd.train.run` calls in this one process (`process`: no interpreter
start-up or import per run, and jax's in-process caches shared, which favours them) or
`python -m pd.train PRESET --set seed=S` commands one after another (`cli`: what a researcher
types). Both write their run folders under a temporary folder, with the same config (`--set`
applies to both). `--per-program K` (repeatable) also times the sweep
with K members per program; `--cpu-devices D` starts jax with D CPU devices, as
`python -m pd.train sweep` does with one per core. Prints the sweep's table, one row per side
(wall seconds, member-steps per second, speedup over the sequential runs) and whether each
member's verdict (recovered or not) is the one its run alone reached.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import jax

from pd.log import setup_logging
from pd.train import load_config, run
from pd.train.sweep import default_members_per_program, recovered, seed_sweep, sweep


def timed_sequential(
    preset: str, overrides: list[str], n: int, folder: Path
) -> tuple[float, list[bool | None]]:
    """The wall time of `n` runs, seeds 0 … n − 1, and whether each recovered the answer."""
    os.environ["PD_CACHE_DIR"] = str(folder / "cache-sequential")
    t0, verdicts = time.perf_counter(), []
    for seed in range(n):
        config = load_config(preset, [*overrides, f"seed={seed}"])
        summary = run(config, folder / f"run-{seed}").summary
        verdicts.append(recovered(summary))
    return time.perf_counter() - t0, verdicts


def timed_cli(
    preset: str, overrides: list[str], n: int, folder: Path
) -> tuple[float, list[bool | None]]:
    """The wall time of `n` commands `python -m pd.train`, seeds 0 … n − 1, one after another,
    and whether each recovered the answer."""
    env = {**os.environ, "PD_CACHE_DIR": str(folder / "cache-cli")}
    sets = [a for o in overrides for a in ("--set", o)]
    t0, verdicts = time.perf_counter(), []
    for seed in range(n):
        out = folder / f"cli-{seed}"
        command = [sys.executable, "-m", "pd.train", preset, *sets, "--set", f"seed={seed}"]
        subprocess.run([*command, "--out", str(out)], env=env, check=True, capture_output=True)
        summary = json.loads((out / "summary.json").read_text())
        verdicts.append(recovered(summary))
    return time.perf_counter() - t0, verdicts


def timed_sweep(
    preset: str, overrides: list[str], n: int, folder: Path, per_program: int | None
) -> tuple[float, list[bool | None], str]:
    """The wall time of the sweep of seeds 0 … n − 1, each member's verdict and the table."""
    os.environ["PD_CACHE_DIR"] = str(folder / f"cache-sweep-{per_program}")
    t0 = time.perf_counter()
    result = sweep(
        seed_sweep(load_config(preset, overrides), range(n)),
        folder / f"sweep-{per_program}",
        members_per_program=per_program,
    )
    wall = time.perf_counter() - t0
    return wall, [m.recovered for m in result.members], result.table()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("preset", nargs="?", default="tms_5-2")
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--per-program", type=int, action="append", default=[])
    parser.add_argument(
        "--sequential", choices=("process", "cli", "both", "none"), default="process"
    )
    parser.add_argument(
        "--cpu-devices", type=int, default=0, help="simulated CPU devices (0: jax's default)"
    )
    args = parser.parse_args()
    if args.cpu_devices:  # before anything starts the backend
        set_option: Callable[[str, object], None] = jax.config.update  # unannotated upstream
        set_option("jax_num_cpu_devices", args.cpu_devices)
    setup_logging()
    steps = load_config(args.preset, args.overrides).train.steps
    member_steps = args.n * steps
    print(f"{args.preset}, {args.n} members x {steps} steps, {jax.devices()}", flush=True)
    rows: list[tuple[str, float]] = []
    swept: list[bool | None] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for per_program in [None, *args.per_program]:
            wall, verdicts, table = timed_sweep(
                args.preset, args.overrides, args.n, folder, per_program
            )
            per = per_program or default_members_per_program(jax.devices()) or args.n
            label = f"sweep, {min(per, args.n)} per program"
            rows.append((label, wall))
            swept = swept or verdicts
            print(f"{label}: {wall:.1f} s\n{table}", flush=True)
        alone: dict[str, tuple[float, list[bool | None]]] = {}
        if args.sequential in ("process", "both"):
            alone["runs in one process"] = timed_sequential(
                args.preset, args.overrides, args.n, folder
            )
        if args.sequential in ("cli", "both"):
            alone["python -m pd.train runs"] = timed_cli(
                args.preset, args.overrides, args.n, folder
            )
        for label, (wall, _) in alone.items():
            rows.append((label, wall))
            print(f"{label}: {wall:.1f} s", flush=True)
    sweep_wall = rows[0][1]
    print(f"\n{'side':<28} {'wall s':>8} {'member-steps/s':>15} {'sweep speedup':>14}")
    for label, wall in rows:
        print(f"{label:<28} {wall:8.1f} {member_steps / wall:15.1f} {wall / sweep_wall:14.2f}")
    for label, (_, verdicts) in alone.items():
        same = sum(a == b for a, b in zip(swept, verdicts, strict=True))
        print(f"{label}: {verdicts.count(True)} of {args.n} recovered (sweep {swept.count(True)});")
        print(f"  the same verdict as the sweep's member: {same} of {args.n}")


if __name__ == "__main__":
    main()
