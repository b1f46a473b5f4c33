"""Run folders that appear whole or not at all, and interrupted runs that can be resumed.

A run writes into `.NAME.partial`, a sibling of its folder, and renames it into place only once
it has finished, so a failing run leaves no half-written folder and never destroys the run it
was asked to `--overwrite`. An interrupted run that has saved a checkpoint keeps its partial
folder, which `--resume` continues and `--overwrite` replaces; one with nothing worth keeping
leaves nothing. A partial folder's lock names the process writing it, so a second run of the
same folder is told that one is in progress. pd only ever deletes a folder that holds its marker
file, or a partial folder it made.
"""

import dataclasses
import errno
import fcntl
import json
import os
import secrets
import shutil
import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from pd.train.config import ConfigError, RunConfig
from pd.train.folder import RunFolder

MARKER = ".pd-run"  # written into every finished run folder; pd deletes no folder without it
SEAL = "pd-sha256.json"  # in each checkpoint's folder once it is completely written
LOCK = ".lock"


class FolderError(ConfigError):
    """A run folder that cannot be written, or was changed under a run (exit status 2)."""


def mark_finished(folder: Path) -> None:
    """Write the marker that lets pd replace `folder` later (with --overwrite)."""
    (folder / MARKER).write_text("a pd run folder: pd may replace it with --overwrite\n")


def _sibling(run_dir: Path, what: str) -> Path:
    return run_dir.parent / f".{run_dir.name}.{what}"


def partial_dir(run_dir: Path) -> Path:
    """Where the run of `run_dir` is written until it finishes."""
    return _sibling(run_dir, "partial")


def diverged_dir(run_dir: Path) -> Path:
    """Where a run of `run_dir` that diverged keeps its partial folder (its last one only)."""
    return _sibling(run_dir, "diverged")


_OLD = "old-" + "0" * 8  # the widest sibling name: the replaced run, while the new one moves in


def sealed_steps(folder: Path) -> list[int]:
    """The steps of the checkpoints in a checkpoints folder that were completely written: orbax
    names each by its step once written, and pd seals it after (`pd.train.checkpoints`)."""
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit() and (p / SEAL).exists())


def checkpoint_steps(run_dir: Path) -> list[int]:
    """The steps of the completely written checkpoints in a run (or partial) folder."""
    return sealed_steps(RunFolder(run_dir).checkpoints)


def holder(folder: Path) -> str | None:
    """The process writing `folder` ("pid N on HOST"), or None when no live run holds its lock."""
    try:
        lock = (folder / LOCK).open("r+")
    except OSError:
        return None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, _, host = lock.read().strip().partition(" ")
            return f"pid {pid or '?'} on {host or 'an unknown host'}"
    return None


def check_destination(run_dir: Path, overwrite: bool, resume: bool = False) -> None:
    """Refuse a destination the run may not replace, a run in progress there, or an
    interrupted run it would ignore, before anything is compiled or written."""
    _check_name(run_dir)
    partial = partial_dir(run_dir)
    live = holder(partial)
    if live is not None:
        raise FolderError(
            f"run '{run_dir}' is in progress ({live} is writing '{partial}'), expected one run "
            "per folder at a time (wait for it, or stop it and pass --resume)"
        )
    steps = checkpoint_steps(partial)
    if resume and not steps:
        raise ConfigError(
            f"--resume found no interrupted run of '{run_dir}' ('{partial}' holds no "
            "checkpoint), expected a run stopped after its first checkpoint"
        )
    if not resume and not overwrite and steps:
        raise ConfigError(
            f"an interrupted run of '{run_dir}' is kept in '{partial}' (checkpoint at step "
            f"{steps[-1]}), expected --resume to continue it or --overwrite to start over"
        )
    _check_replaceable(run_dir, overwrite)


def _check_name(run_dir: Path) -> None:
    """The run folder's name leaves room for the siblings pd writes beside it."""
    parent = run_dir.absolute().parent
    while not parent.exists():
        parent = parent.parent
    try:
        name_max = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    longest = name_max - len(os.fsencode(_sibling(Path("x"), _OLD).name)) + 1
    size = len(os.fsencode(run_dir.name))
    if size > longest:
        raise ConfigError(
            f"run folder name '{run_dir.name[:40]}…' is {size} bytes long, expected at most "
            f"{longest} (leaving room for '{_sibling(Path('NAME'), _OLD).name}' beside it)"
        )


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
    """Hold `folder`'s lock file, which names this process: a second run writing the same
    partial folder is refused."""
    with (folder / LOCK).open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FolderError(
                f"run folder '{folder}' is being written by another run ({holder(folder)}), "
                "expected one run per folder at a time"
            ) from None
        lock.truncate(0)
        lock.write(f"{os.getpid()} {socket.gethostname()}\n")
        lock.flush()
        yield


def _ours(partial: Path) -> bool:
    """Whether `partial` is still the folder this process locked (not removed or replaced)."""
    try:
        pid = (partial / LOCK).read_text().split(" ", 1)[0]
    except OSError:
        return False
    return pid == str(os.getpid())


def check_intact(partial: Path) -> None:
    """Refuse to write on into a partial folder that was removed (or replaced) under the run."""
    if not _ours(partial):
        raise _removed(partial)


def _removed(partial: Path) -> FolderError:
    return FolderError(
        f"run folder '{partial}' was removed while this run was writing it, expected it kept "
        "until the run finishes (the run's work is lost; run it again)"
    )


def no_space(err: BaseException) -> str | None:
    """Why `err`, or an error behind it (its causes and contexts), says the disk is full or over
    quota: an `OSError` of ENOSPC or EDQUOT, or one of orbax's TensorStore errors that carries
    the operating system's message; None for any other error."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return seen.strerror or os.strerror(seen.errno)
        for code in (errno.ENOSPC, errno.EDQUOT):
            if os.strerror(code) in str(seen):
                return os.strerror(code)
        seen = seen.__cause__ or seen.__context__
    return None


@contextmanager
def staged(run_dir: Path, overwrite: bool, resume: bool = False) -> Iterator[Path]:
    """Yield the partial folder to write the run into; on success it becomes `run_dir`.

    The run it replaces (with `overwrite`) is removed only after the new one is in place. On
    any exception, Ctrl-C included, the partial folder is kept if it holds a checkpoint (for
    `resume`) and removed otherwise; `run_dir` is untouched either way. A full disk, or a
    folder that cannot be written, is a `FolderError`.
    """
    check_destination(run_dir, overwrite, resume)
    partial = partial_dir(run_dir)
    with ExitStack() as stack:
        made = not partial.exists()
        try:
            partial.mkdir(parents=True, exist_ok=True)
            stack.enter_context(_locked(partial))
        except OSError as err:
            if made:
                shutil.rmtree(partial, ignore_errors=True)
            if no_space(err) is not None:
                where = f"no run folder was written ('{run_dir}' is as it was)"
                raise _disk_full(run_dir, err, where) from None
            raise FolderError(
                f"run folder '{run_dir}' cannot be created ({err.strerror}), expected a writable "
                "folder"
            ) from None
        if not resume:  # a run killed outright (SIGKILL), or one --overwrite starts over
            for stale in partial.iterdir():
                if stale.name != LOCK:
                    shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
        try:
            yield partial
            check_intact(partial)
            mark_finished(partial)
            _check_replaceable(run_dir, overwrite)  # the destination may have changed meanwhile
            _move_into_place(partial, run_dir)
        except BaseException as err:
            ours = _ours(partial)
            sealed = checkpoint_steps(partial) if ours else []
            if ours and not sealed:
                shutil.rmtree(partial, ignore_errors=True)
            if not ours and isinstance(err, Exception) and not isinstance(err, FolderError):
                raise _removed(partial) from None  # what failed is a write into it
            if no_space(err) is not None:
                where = (
                    f"the run is kept in '{partial}' (checkpoint at step {sealed[-1]}; free space "
                    "and pass --resume)"
                    if sealed
                    else f"no run folder was written ('{run_dir}' is as it was)"
                )
                raise _disk_full(run_dir, err, where) from None
            raise


def _disk_full(run_dir: Path, err: BaseException, where: str) -> FolderError:
    return FolderError(
        f"the disk holding '{run_dir}' is full ({no_space(err)}), expected free space for the "
        f"run; {where}"
    )


def _move_into_place(partial: Path, run_dir: Path) -> None:
    """Rename the finished `partial` to `run_dir`, replacing the run there (checked already)."""
    old = None
    try:
        if run_dir.exists():
            old = _sibling(run_dir, f"old-{secrets.token_hex(4)}")
            old.mkdir()
            os.replace(run_dir, old / run_dir.name)
        (partial / LOCK).unlink()
        os.replace(partial, run_dir)
    except OSError as err:
        if old is not None and not run_dir.exists() and (old / run_dir.name).exists():
            os.replace(old / run_dir.name, run_dir)  # the replaced run back in its place
            old.rmdir()
        raise FolderError(
            f"the finished run could not be moved to '{run_dir}' ({err.strerror}), expected a "
            f"writable folder; it is kept in '{partial}' (pass --resume once it is writable)"
        ) from None
    if old is not None:
        shutil.rmtree(old)


def set_aside(run_dir: Path) -> Path | None:
    """Move the partial folder of a run that diverged to `diverged_dir(run_dir)` (replacing an
    earlier one), so that a rerun starts over; returns where it went, or None if nothing was
    kept."""
    partial, aside = partial_dir(run_dir), diverged_dir(run_dir)
    if not partial.exists():
        return None
    if aside.exists():
        shutil.rmtree(aside)
    os.replace(partial, aside)
    return aside


__all__ = [
    "MARKER",
    "SEAL",
    "FolderError",
    "check_destination",
    "check_intact",
    "checkpoint_steps",
    "diverged_dir",
    "holder",
    "mark_finished",
    "no_space",
    "partial_dir",
    "sealed_steps",
    "set_aside",
    "staged",
]


def write_config(folder: Path, config: RunConfig) -> None:
    """A run folder's `config.json`, which `pd.load` and `--resume` read."""
    text = json.dumps(dataclasses.asdict(config), indent=2, allow_nan=False)
    RunFolder(folder).config.write_text(text)


def first_difference(before: object, now: object, path: str) -> tuple[str, object, object] | None:
    """The first dotted key where two parsed configs differ, with both values."""
    if isinstance(before, dict) and isinstance(now, dict):
        for key in sorted(set(before) | set(now)):
            found = first_difference(before.get(key), now.get(key), f"{path}.{key}".strip("."))
            if found is not None:
                return found
        return None
    return None if before == now else (path, before, now)


def check_same_config(path: Path, config: RunConfig) -> None:
    """A resumed run continues the config it was started with; only where it runs may change."""
    free = ("mesh", "distributed", "compile")
    try:
        recorded = json.loads(path.read_text())
        if not isinstance(recorded, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as err:
        why = "is missing" if isinstance(err, FileNotFoundError) else f"is unreadable ({err})"
        raise ConfigError(
            f"the interrupted run's config '{path}' {why}, expected the config.json it was "
            "started with (start over with --overwrite)"
        ) from None
    before = {k: v for k, v in recorded.items() if k not in free}
    now = json.loads(json.dumps(dataclasses.asdict(config)))
    now = {k: v for k, v in now.items() if k not in free}
    found = first_difference(before, now, "")
    if found is not None:
        key, old, value = found
        raise ConfigError(
            f"config key '{key}' is {value!r}, but the interrupted run had {old!r}, expected "
            "the same config to resume it"
        )
