"""Run folders that appear whole or not at all, and interrupted runs that can be resumed.

A run writes into `.NAME.partial`, a sibling of its folder, and renames it into place only once
it has finished, so a failing run leaves no half-written folder and never destroys the run it
was asked to `--overwrite`. An interrupted run that has saved a checkpoint keeps its partial
folder, which `--resume` continues; one with nothing worth keeping leaves nothing. pd only ever
deletes a folder that holds its marker file (or a partial folder it made, without checkpoints).
"""

import fcntl
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from pd.train.config import ConfigError

MARKER = ".pd-run"  # written into every finished run folder; pd deletes no folder without it
CHECKPOINTS = "checkpoints"


def mark_finished(folder: Path) -> None:
    """Write the marker that lets pd replace `folder` later (with --overwrite)."""
    (folder / MARKER).write_text("a pd run folder: pd may replace it with --overwrite\n")


def partial_dir(run_dir: Path) -> Path:
    """Where the run of `run_dir` is written until it finishes."""
    return run_dir.parent / f".{run_dir.name}.partial"


def checkpoint_steps(run_dir: Path) -> list[int]:
    """The steps of the complete checkpoints in a run folder (orbax names each by its step;
    a save in flight has a temporary name)."""
    folder = run_dir / CHECKPOINTS
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def check_destination(run_dir: Path, overwrite: bool, resume: bool = False) -> None:
    """Refuse a destination the run may not replace, or an interrupted run it would ignore,
    before anything is compiled or written."""
    steps = checkpoint_steps(partial_dir(run_dir))
    if resume and not steps:
        raise ConfigError(
            f"--resume found no interrupted run of '{run_dir}' ('{partial_dir(run_dir)}' holds no "
            "checkpoint), expected a run stopped after its first checkpoint"
        )
    if not resume and steps:
        raise ConfigError(
            f"an interrupted run of '{run_dir}' is kept in '{partial_dir(run_dir)}' (checkpoint "
            f"at step {steps[-1]}), expected --resume to continue it (or remove that folder to "
            "start over)"
        )
    _check_replaceable(run_dir, overwrite)


def _check_replaceable(run_dir: Path, overwrite: bool) -> None:
    if not run_dir.exists():
        return
    if run_dir.is_file():
        raise ConfigError(
            f"run folder '{run_dir}' is a file, expected a folder (a new one, or a pd run to "
            "overwrite)"
        )
    if not overwrite:
        raise ConfigError(
            f"run folder '{run_dir}' already exists, expected a new folder (or pass --overwrite)"
        )
    if not (run_dir / MARKER).is_file():
        raise ConfigError(
            f"run folder '{run_dir}' exists and is not a pd run folder (it has no {MARKER} "
            "file), expected a new folder or a pd run to overwrite"
        )


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold `folder`'s lock file: a second run writing the same partial folder is refused."""
    with (folder / ".lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"run folder '{folder}' is being written by another run, expected one run per "
                "folder at a time"
            ) from None
        yield


@contextmanager
def staged(run_dir: Path, overwrite: bool, resume: bool = False) -> Iterator[Path]:
    """Yield the partial folder to write the run into; on success it becomes `run_dir`.

    The run it replaces (with `overwrite`) is removed only after the new one is in place. On
    any exception, Ctrl-C included, the partial folder is kept if it holds a checkpoint (for
    `resume`) and removed otherwise; `run_dir` is untouched either way.
    """
    check_destination(run_dir, overwrite, resume)
    partial = partial_dir(run_dir)
    with ExitStack() as stack:
        try:
            partial.mkdir(parents=True, exist_ok=True)
            stack.enter_context(_locked(partial))
        except OSError as err:
            raise ConfigError(
                f"run folder '{run_dir}' cannot be created ({err.strerror}), expected a writable "
                "folder"
            ) from None
        if not resume:  # what a run killed outright (SIGKILL) left, with no checkpoint
            for stale in partial.iterdir():
                if stale.name != ".lock":
                    shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
        try:
            yield partial
            mark_finished(partial)
            _check_replaceable(run_dir, overwrite)  # the destination may have changed meanwhile
            old = None
            if run_dir.exists():
                old = run_dir.parent / f".{run_dir.name}.old-{secrets.token_hex(4)}"
                old.mkdir()
                os.replace(run_dir, old / run_dir.name)
            (partial / ".lock").unlink()
            os.replace(partial, run_dir)
            if old is not None:
                shutil.rmtree(old)
        except BaseException:
            if not checkpoint_steps(partial):
                shutil.rmtree(partial, ignore_errors=True)
            raise


__all__ = [
    "CHECKPOINTS",
    "MARKER",
    "check_destination",
    "checkpoint_steps",
    "mark_finished",
    "partial_dir",
    "staged",
]
