"""Checkpoints of the whole train state, for exact resume: orbax's CheckpointManager (atomic,
asynchronous, keeps the last k, and writes arrays that span processes from every process),
each sealed with the sha256 of every file it wrote.

A checkpoint counts once its seal (`pd.train.rundir.SEAL`) is written, after orbax has finished
writing it; a resume checks the seal before restoring and falls back, with a warning, to the
newest checkpoint whose files all match theirs. orbax is imported on first use (about half a
second) and ships no type information: the few calls pd makes are wrapped here with their types.
"""

import errno
import hashlib
import importlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Protocol, runtime_checkable

import jax
from jax.experimental import multihost_utils

from pd.state import TrainState
from pd.train.config import ConfigError
from pd.train.rundir import SEAL, sealed_steps

log = logging.getLogger(__name__)

_METADATA_BYTES = 1 << 20  # orbax's metadata and pd's seal, beside the arrays (an upper bound)


class CheckpointDamaged(ConfigError):
    """No checkpoint of an interrupted run is intact (exit status 2 from the command line)."""


class CheckpointMismatch(ConfigError):
    """An intact checkpoint that this version of pd cannot read into its train state (exit
    status 2 from the command line); it is left as it is."""


def _orbax() -> ModuleType:
    return importlib.import_module("orbax.checkpoint")


class _Repeats(logging.Filter):
    """Drops orbax's error records (logged through absl) from threads that are waiting on a
    checkpoint write: its failure is raised to the run, which reports it in one sentence."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[int] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread not in self.threads


_REPEATS = _Repeats()
logging.getLogger("absl").addFilter(_REPEATS)


@contextmanager
def _raised_not_logged() -> Iterator[None]:
    """Within: orbax's errors on this thread are only raised, not also logged."""
    me = threading.get_ident()
    _REPEATS.threads.add(me)
    try:
        yield
    finally:
        _REPEATS.threads.discard(me)


@runtime_checkable
class _Manager(Protocol):
    """The calls pd makes of orbax's `CheckpointManager`."""

    def save(self, step: int, *, args: object, force: bool) -> bool: ...
    def restore(self, step: int, *, args: object) -> object: ...
    def wait_until_finished(self) -> None: ...
    def close(self) -> None: ...


def _digests(folder: Path) -> dict[str, str]:
    """The sha256 of every file under `folder` but the seal, by path relative to it."""
    found = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != SEAL):
        with path.open("rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        found[path.relative_to(folder).as_posix()] = digest
    return found


def seal(folder: Path) -> None:
    """Write `folder`'s seal: the digests of its files, atomically (a file renamed into place)."""
    tmp = folder / f".{SEAL}.tmp"
    tmp.write_text(json.dumps({"sha256": _digests(folder)}, indent=1, sort_keys=True))
    os.replace(tmp, folder / SEAL)


def damage(folder: Path) -> str | None:
    """What is wrong with a sealed checkpoint folder (a file missing, added or changed since it
    was sealed, or an unreadable seal), or None when every file matches its digest."""
    try:
        recorded = json.loads((folder / SEAL).read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"its seal {SEAL} is unreadable"
    found = _digests(folder)
    for name in sorted(set(recorded) | set(found)):
        if name not in found:
            return f"its file {name} is missing"
        if name not in recorded:
            return f"it holds a file {name} it did not write"
        if found[name] != recorded[name]:
            return f"its file {name} does not match its sha256"
    return None


class Checkpoints:
    """The train-state checkpoints of one run, in `folder` (one subfolder per step)."""

    def __init__(self, folder: Path, keep: int, intact: Callable[[], None] = lambda: None) -> None:
        """`intact()` raises when the checkpoints may no longer be written to `folder` (its run
        folder was removed): it is called before each save and before each seal."""
        self._folder = folder.absolute()
        self._intact = intact
        self._keep = keep
        self._made: _Manager | None = None
        self._sealer = ThreadPoolExecutor(1, thread_name_prefix="pd-seal")
        self._sealing: Future[None] | None = None
        self._closed = False

    @property
    def _manager(self) -> _Manager:
        """orbax's manager, made on first use: after a resume has deleted damaged steps."""
        if self._made is None:
            ocp = _orbax()
            options = ocp.CheckpointManagerOptions(max_to_keep=self._keep, create=True)
            self._made = ocp.CheckpointManager(self._folder, options=options)
        return self._made

    def save(self, step: int, state: TrainState) -> None:
        """Start writing `state` as the checkpoint of `step` (returns before it is written); it
        is sealed once written, on a thread of its own. A disk without room for it is refused
        before orbax starts (an `OSError` of ENOSPC)."""
        self._wait_sealed()
        self._intact()
        need = sum(x.nbytes for x in jax.tree.leaves(state)) + _METADATA_BYTES
        self._folder.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self._folder).free
        if free < need:
            raise OSError(
                errno.ENOSPC,
                f"{os.strerror(errno.ENOSPC)}: the checkpoint of step "
                f"{step} needs about {need} bytes, {free} are free",
            )
        self._manager.save(step, args=_orbax().args.StandardSave(state), force=True)
        self._sealing = self._sealer.submit(self._seal, step)

    def _seal(self, step: int) -> None:
        with _raised_not_logged():
            self._manager.wait_until_finished()
        self._intact()
        if jax.process_index() == 0:
            seal(self._folder / str(step))

    def _wait_sealed(self) -> None:
        if self._sealing is not None:
            sealing, self._sealing = self._sealing, None
            sealing.result()  # raises what writing or sealing raised

    def restore_latest(self, like: TrainState) -> TrainState | None:
        """The newest intact checkpoint, placed as the abstract leaves of `like` say (their
        shardings may differ from the saving run's: another device count restores too), or
        None when there is none. Damaged checkpoints (files that do not match their seal) are
        named in a warning and deleted; when every one is damaged, `CheckpointDamaged` says so.
        An intact one that does not fit `like` stops the resume (`CheckpointMismatch`) and is
        kept."""
        damaged = []
        for step in reversed(sealed_steps(self._folder)):
            folder = self._folder / str(step)
            what = damage(folder)
            if what is None:
                try:
                    return self._restore(step, like)
                except Exception as err:  # orbax's errors have no common base
                    # Intact, so not damaged: written for another state layout (another
                    # version of pd). Kept, and nothing older is tried in its place.
                    raise CheckpointMismatch(
                        f"the checkpoint of step {step} in '{self._folder}' is intact but does "
                        f"not fit this version of pd's train state ({type(err).__name__}: "
                        f"{_first_line(err)}), expected the layout it was written with: resume "
                        "it with the version of pd that wrote it, or start over with --overwrite"
                    ) from err
            damaged.append(f"step {step}: {what}")
            log.warning(
                "the checkpoint of step %d is damaged (%s): deleted, trying the one before",
                step,
                what,
            )
            self._forget()
            if jax.process_index() == 0:
                shutil.rmtree(folder, ignore_errors=True)
        if damaged:
            raise CheckpointDamaged(
                f"no checkpoint in '{self._folder}' is intact ({'; '.join(damaged)}), expected "
                "one that matches its seal: start over with --overwrite"
            )
        return None

    def _restore(self, step: int, like: TrainState) -> TrainState:
        restored = self._manager.restore(step, args=_orbax().args.StandardRestore(like))
        state: TrainState = jax.tree.unflatten(jax.tree.structure(like), jax.tree.leaves(restored))
        log.info("resumed from the checkpoint of step %d", step)
        return state

    def _forget(self) -> None:
        """Drop orbax's manager (it lists the steps it found when made)."""
        if self._made is not None:
            self._made.close()
            self._made = None

    def close(self) -> None:
        """Wait for a save in flight and its seal (every process: until process 0 has sealed
        it), then release the manager; again, a no-op. Interrupted while it waits (a third
        signal), it leaves the write to finish in the background."""
        if self._closed:
            return
        self._closed = True
        try:
            self._wait_sealed()
            if jax.process_count() > 1:
                multihost_utils.sync_global_devices("pd: checkpoint sealed")
        except Exception:
            with suppress(Exception), _raised_not_logged():  # they repeat the one raised
                self._forget()
            _join_orbax_threads()
            raise
        else:
            self._forget()
        finally:
            self._sealer.shutdown(wait=False)

    def __enter__(self) -> "Checkpoints":
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close; after an error, an error of closing does not replace it."""
        if exc_type is None:
            self.close()
        else:
            with suppress(Exception):
                self.close()


_ORBAX_JOIN_SECONDS = 30.0


def _join_orbax_threads() -> None:
    """Wait (at most half a minute) for orbax's threads still writing a failed checkpoint: one
    failed write ends orbax's wait, while its other writers may still be failing, and each logs
    its traceback when it does. Joined here, they log before the run reports the failure in its
    one sentence, not after it."""
    deadline = time.monotonic() + _ORBAX_JOIN_SECONDS
    for thread in threading.enumerate():
        if (
            type(thread).__module__.startswith("orbax.")
            and thread is not threading.current_thread()
        ):
            # Thread's own join: orbax's override re-raises the thread's error.
            threading.Thread.join(thread, max(0.0, deadline - time.monotonic()))


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else "no message"
