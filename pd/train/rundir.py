"""Run folders that appear whole or not at all.

A run writes into a temporary sibling of its folder and renames it into place only once it has
finished, so an interrupted or failing run leaves no half-written folder and never destroys the
run it was asked to `--overwrite`. pd only ever deletes a folder that holds its marker file.
"""

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pd.train.config import ConfigError

MARKER = ".pd-run"  # written into every finished run folder; pd deletes no folder without it


def check_destination(run_dir: Path, overwrite: bool) -> None:
    """Refuse a destination the run may not replace, before anything is compiled or written."""
    if not run_dir.exists():
        return
    if not overwrite:
        raise ConfigError(
            f"run folder '{run_dir}' already exists, expected a new folder (or pass --overwrite)"
        )
    if not (run_dir / MARKER).is_file():
        raise ConfigError(
            f"run folder '{run_dir}' exists and is not a pd run folder (it has no {MARKER} "
            "file), expected a new folder or a pd run to overwrite"
        )


def _sibling(run_dir: Path, what: str) -> Path:
    """A new hidden folder beside `run_dir`, with the permissions a plain mkdir gives."""
    path = run_dir.parent / f".{run_dir.name}.{what}-{secrets.token_hex(4)}"
    path.mkdir()
    return path


@contextmanager
def staged(run_dir: Path, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary folder to write the run into; on success it becomes `run_dir`.

    The run it replaces (with `overwrite`) is removed only after the new one is in place; on
    any exception, Ctrl-C included, the temporary folder is removed and `run_dir` is untouched.
    """
    check_destination(run_dir, overwrite)
    try:
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = _sibling(run_dir, "tmp")
    except OSError as err:
        raise ConfigError(
            f"run folder '{run_dir}' cannot be created ({err.strerror}), expected a writable folder"
        ) from None
    try:
        yield tmp
        (tmp / MARKER).write_text("a pd run folder: pd may replace it with --overwrite\n")
        check_destination(run_dir, overwrite)  # the destination may have changed meanwhile
        old = None
        if run_dir.exists():
            old = _sibling(run_dir, "old")
            os.replace(run_dir, old / run_dir.name)
        os.replace(tmp, run_dir)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


__all__ = ["MARKER", "check_destination", "staged"]
