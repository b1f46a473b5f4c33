"""`python -m pd.train sweep ...`."""

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import jax

from pd.log import setup_logging
from pd.train.config import ConfigError
from pd.train.out_of_memory import out_of_memory
from pd.train.rundir import check_destination
from pd.train.show_config import SET_HELP
from pd.train.signals import Terminated, stopped, stops_raise
from pd.train.sweep.run import sweep
from pd.train.sweep.spec import load_sweep, parse_seeds


def _one_cpu_device_per_core() -> None:
    """On a CPU, one jax device per core for the members to spread over, unless the device
    count is set already (environment, config) or the backend has started."""
    if "JAX_NUM_CPU_DEVICES" in os.environ or "device_count" in os.environ.get("XLA_FLAGS", ""):
        return
    if jax.config.values.get("jax_num_cpu_devices", -1) != -1:
        return
    set_option: Callable[[str, object], None] = jax.config.update  # unannotated upstream
    try:
        set_option("jax_num_cpu_devices", os.cpu_count() or 1)
    except RuntimeError:  # the backend runs already: its devices stay as they are
        pass


# What an out-of-memory sweep should make smaller.
_SMALLER = "fewer members a call (--members-per-program), a smaller C, train.batch or target"


def _nothing_written(out: Path) -> str:
    return f"no sweep folder was written ({out} is as it was)"


def main(argv: Sequence[str]) -> int:
    """`python -m pd.train sweep ...`; the exit statuses of `python -m pd.train`."""
    args = _parser().parse_args(list(argv))
    try:
        seeds = parse_seeds(args.seeds)
        spec = load_sweep(args.config, seeds, args.overrides, args.grid, args.vary_target_seed)
        out = args.out if args.out is not None else Path("runs") / f"{spec.name}-sweep"
        check_destination(out, args.overwrite)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    _one_cpu_device_per_core()
    setup_logging()
    jax.devices()  # starting the backend replaces an earlier SIGTERM handler
    try:
        with stops_raise():
            result = sweep(spec, out, args.overwrite, args.members_per_program)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (jax.errors.JaxRuntimeError, MemoryError) as err:
        if (oom := out_of_memory(err, _SMALLER)) is None:
            raise
        print(f"error: {oom}; {_nothing_written(out)}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Terminated) as err:
        how, status = stopped(err)
        print(f"error: stopped {how}; {_nothing_written(out)}", file=sys.stderr)
        return status
    print(result.table())
    print(result.compile_times.table())
    print(f"sweep folder: {result.sweep_dir}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pd.train sweep",
        description="Train N decompositions of one recipe as one vmapped program.",
    )
    parser.add_argument("config", help="a preset or a .toml file")
    parser.add_argument("--seeds", required=True, help="the members' seeds: 0-15, 0,3,7 or 0-3,8")
    parser.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=[V1,V2,...]",
        help="one group (one program) per value of KEY; several --grid make their product",
    )
    parser.add_argument(
        "--vary-target-seed",
        action="store_true",
        help="each member's target is trained with the member's seed (default: one target)",
    )
    parser.add_argument(
        "--members-per-program",
        type=int,
        default=None,
        metavar="K",
        help="vmap K members in each call (default: all of a group on accelerators; one on CPU, "
        "in a lane per CPU device)",
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=SET_HELP
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="sweep folder (default runs/NAME-sweep)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing sweep folder")
    return parser
