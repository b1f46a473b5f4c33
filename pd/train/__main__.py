"""`python -m pd.train PRESET_OR_FILE [--set key=value ...] [--out DIR] [--overwrite] [--resume]`;
`python -m pd.train sweep PRESET_OR_FILE --seeds 0-15 ...` trains many at once (`pd.train.sweep`);
`python -m pd.train show-config PRESET_OR_FILE [--set key=value ...]` lists every config key with
its value, default and meaning (`pd.train.show_config`).

Exit status: 0 done; 2 a bad input (one sentence, before anything is compiled or written) or a
run too large for the memory (one sentence with the size that failed); 3 non-finite numbers (a NaN
or an infinity in the target's weights, or training diverged); 130 / 143 stopped by Ctrl-C /
SIGTERM (with a checkpoint to resume from, once one was saved).
"""

import argparse
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import jax

from pd.log import setup_logging
from pd.train.config import ConfigError, RunConfig, load_config, preset_names
from pd.train.out_of_memory import byte_size, out_of_memory
from pd.train.run import Diverged, run, summary_table
from pd.train.rundir import check_destination, checkpoint_steps, partial_dir
from pd.train.show_config import SET_HELP
from pd.train.show_config import main as show_config_main
from pd.train.signals import Terminated, stopped, stops_raise


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["sweep"]:
        from pd.train.sweep import main as sweep_main

        return sweep_main(given[1:])
    if given[:1] == ["show-config"]:
        return show_config_main(given[1:])
    args = _parser().parse_args(argv)
    try:
        config = load_config(args.config, args.overrides)
        if args.compile_only:
            return _compile_only(config)
        out = args.out if args.out is not None else Path("runs") / config.name
        check_destination(out, args.overwrite, args.resume)
        _check_creatable(out)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    setup_logging()
    jax.devices()  # (a run's step in flight finishes, with a checkpoint: pd.train.signals)
    try:
        with stops_raise():
            result = run(config, out, overwrite=args.overwrite, resume=args.resume)
    except ConfigError as err:  # found once the target or data is opened, before any compile
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Diverged as err:  # nothing was written; an earlier run in the folder is kept
        print(f"error: {err}", file=sys.stderr)
        return 3
    except (jax.errors.JaxRuntimeError, MemoryError) as err:
        if (oom := out_of_memory(err, "a smaller C, train.batch or target")) is None:
            raise
        print(f"error: {oom}; {_kept(out)}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Terminated) as err:
        how, status = stopped(err)
        print(f"error: stopped {how}; {_kept(out, given)}", file=sys.stderr)
        return status
    print(summary_table(result.summary))
    print(result.compile_times.table())
    print(f"run folder: {result.run_dir}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pd.train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the usage lines as written
    )
    parser.add_argument("config", help=f"a preset ({', '.join(preset_names())}) or a .toml file")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=SET_HELP
    )
    parser.add_argument("--out", type=Path, default=None, help="run folder (default runs/NAME)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing run folder")
    parser.add_argument(
        "--resume", action="store_true", help="continue an interrupted run from its checkpoint"
    )
    parser.add_argument(
        "--compile-only",
        action="store_true",
        help="only lower and compile init and step on abstract inputs, over simulated CPU "
        "devices as many as the mesh asks for, and print the compile table",
    )
    return parser


def _kept(out: Path, resume_with: list[str] | None = None) -> str:
    """What a stopped or failed run left: its partial folder and latest checkpoint (with the
    command that continues it, given the arguments it was started with), or nothing."""
    steps = checkpoint_steps(partial_dir(out))
    if not steps:
        return f"no run folder was written ({out} is as it was)"
    kept = f"the run is kept in {partial_dir(out)} (checkpoint at step {steps[-1]})"
    if resume_with is None:
        return kept
    again = " ".join(map(shlex.quote, resume_with)).replace(" --resume", "")
    return f"{kept}; continue it with: {shlex.quote(sys.executable)} -m pd.train {again} --resume"


def _check_creatable(out: Path) -> None:
    """Refuse a run folder that cannot be made (a file on its path, or a folder pd may not
    write), before the target is loaded or anything compiled."""
    existing = out.absolute().parent  # the partial folder is made beside the run folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(
            f"run folder '{out}' cannot be created ('{existing}' is a file, not a folder), "
            "expected a folder to create it in"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"run folder '{out}' cannot be created ('{existing}' is not writable), expected a "
            "writable folder"
        )


def _compile_only(config: RunConfig) -> int:
    """Simulate the configured mesh on CPU devices (before jax starts a backend) and compile."""
    set_option: Callable[[str, object], None] = jax.config.update  # unannotated upstream
    if "JAX_PLATFORMS" not in os.environ:
        set_option("jax_platforms", "cpu")
    set_option("jax_num_cpu_devices", config.mesh.data * config.mesh.model)
    setup_logging()
    from pd.train.compile_only import compile_only

    report = compile_only(config)
    print(report.times.table(written=""))  # (compiling only writes nothing)
    for name, value in report.flops.items():
        tflop = value / 1e12
        print(f"{name}: {tflop:.3f} TFLOP per device (XLA cost analysis, loop bodies once)")
    m = report.step_memory
    if m is not None:
        size = byte_size
        print(
            f"train_step memory per device: {size(m.peak)} (arguments {size(m.arguments)}, "
            f"temporaries {size(m.temporaries)}, outputs {size(m.outputs)} of which "
            f"{size(m.aliased)} reuse the arguments' buffers)"
        )
    return 0


if __name__ == "__main__":
    status = main()
    if status != 0:
        # A stopped or failed run can leave XLA's threads inside the interrupted step, or
        # orbax's inside a write that failed (a full disk), and the interpreter's teardown then
        # crashes or prints their errors; everything the run keeps is already on disk.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)
