"""Checkpoints of the whole train state, for exact resume: orbax's CheckpointManager (atomic,
asynchronous, keeps the last k, and writes arrays that span processes from every process).

orbax is imported on first use (about half a second) and ships no type information: the few
calls pd makes are wrapped here with their types.
"""

import importlib
from pathlib import Path
from types import ModuleType

import jax

from pd.state import TrainState


def _orbax() -> ModuleType:
    return importlib.import_module("orbax.checkpoint")


class Checkpoints:
    """The train-state checkpoints of one run, in `folder` (one subfolder per step)."""

    def __init__(self, folder: Path, keep: int) -> None:
        ocp = _orbax()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
        self._manager = ocp.CheckpointManager(folder.absolute(), options=options)

    def latest(self) -> int | None:
        """The step of the newest complete checkpoint, if any."""
        step = self._manager.latest_step()
        return None if step is None else int(step)

    def save(self, step: int, state: TrainState) -> None:
        """Start writing `state` as the checkpoint of `step` (returns before it is written)."""
        ocp = _orbax()
        self._manager.save(step, args=ocp.args.StandardSave(state), force=True)

    def restore(self, step: int, like: TrainState) -> TrainState:
        """The checkpoint of `step`, placed as the abstract leaves of `like` say (their
        shardings may differ from the saving run's: another device count restores too)."""
        ocp = _orbax()
        restored = self._manager.restore(step, args=ocp.args.StandardRestore(like))
        state: TrainState = jax.tree.unflatten(jax.tree.structure(like), jax.tree.leaves(restored))
        return state

    def close(self) -> None:
        """Wait for a save in flight, then release the manager."""
        self._manager.wait_until_finished()
        self._manager.close()
