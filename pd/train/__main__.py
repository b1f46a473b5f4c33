"""`python -m pd.train PRESET_OR_FILE [--set key=value ...] [--out DIR] [--overwrite]`."""

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

import jax

from pd.log import setup_logging
from pd.train.config import ConfigError, RunConfig, load_config, preset_names
from pd.train.run import Diverged, run, summary_table
from pd.train.rundir import check_destination


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pd.train", description=__doc__)
    parser.add_argument("config", help=f"a preset ({', '.join(preset_names())}) or a .toml file")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, default=None, help="run folder (default runs/NAME)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing run folder")
    parser.add_argument(
        "--compile-only",
        action="store_true",
        help="only lower and compile init and step on abstract inputs, over simulated CPU "
        "devices as many as the mesh asks for, and print the compile table",
    )
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, args.overrides)
        if args.compile_only:
            return _compile_only(config)
        out = args.out if args.out is not None else Path("runs") / config.name
        check_destination(out, args.overwrite)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    setup_logging()
    try:
        result = run(config, out, overwrite=args.overwrite)
    except ConfigError as err:  # found once the target or data is opened, before any compile
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Diverged as err:  # nothing was written; an earlier run in the folder is kept
        print(f"error: {err}", file=sys.stderr)
        return 3
    print(summary_table(result.summary))
    print(result.compile_times.table())
    print(f"run folder: {result.run_dir}")
    return 0


def _compile_only(config: RunConfig) -> int:
    """Simulate the configured mesh on CPU devices (before jax starts a backend) and compile."""
    set_option: Callable[[str, object], None] = jax.config.update  # unannotated upstream
    if "JAX_PLATFORMS" not in os.environ:
        set_option("jax_platforms", "cpu")
    set_option("jax_num_cpu_devices", config.mesh.data * config.mesh.model)
    setup_logging()
    from pd.train.compile_only import compile_only

    times, flops = compile_only(config)
    print(times.table())
    for name, value in flops.items():
        tflop = value / 1e12
        print(f"{name}: {tflop:.3f} TFLOP per device (XLA cost analysis, loop bodies once)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
