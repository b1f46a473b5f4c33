"""The checks that refuse a NaN or an infinity: in the frozen weights before a run starts, in a
logged row, and in a state about to be saved (a resume never starts from a diverged one)."""

import math

import haiku as hk
import jax
import jax.numpy as jnp

from pd.state import TrainState
from pd.train.checkpoints import Checkpoints


class Diverged(RuntimeError):
    """Non-finite numbers (exit status 3 from the command line): a NaN or an infinity in the
    target's frozen weights (the message names the parameter, found before the run folder is
    made) or a non-finite loss or gradient norm in training (it names the step and the term)."""


def divergence(step: int, row: dict[str, float]) -> str | None:
    """The sentence that stops a run (or a sweep's member) whose logged row holds a NaN or an
    infinity, or None: nothing that looks like a result is made of such a row."""
    bad = [k for k, v in row.items() if not math.isfinite(v)]
    if not bad:
        return None
    others = f" (and {len(bad) - 1} more terms)" if len(bad) > 1 else ""
    return (
        f"training diverged at step {step}: {bad[0]} is {row[bad[0]]}{others}, expected finite "
        "values (lower the learning rate)"
    )


def save_finite(checkpoints: Checkpoints, step: int, state: TrainState) -> None:
    """Start the checkpoint of `step`, of a finite state only (a resume never starts from a
    diverged one)."""
    floats = [x for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.inexact)]
    if any(jax.device_get(non_finite_counts(floats))):
        raise Diverged(
            f"training diverged before step {step}: the train state holds a NaN or an infinity, "
            "expected finite values (lower the learning rate)"
        )
    checkpoints.save(step, state)


@jax.jit
def non_finite_counts(ws: list[jax.Array]) -> list[jax.Array]:
    """How many entries of each array are NaN or infinite (one pass each, no copies)."""
    return [jnp.sum(~jnp.isfinite(w)) for w in ws]


def check_finite(params: hk.Params) -> None:
    """Refuse frozen weights that hold a NaN or an infinity, with one sentence naming the
    first such parameter; one jitted reduction over them and one small `device_get`."""
    leaves = [
        (jax.tree_util.keystr(path, simple=True, separator="/"), w)
        for path, w in jax.tree_util.tree_leaves_with_path(params)
        if jnp.issubdtype(jnp.result_type(w), jnp.inexact)
    ]
    counts = jax.device_get(non_finite_counts([w for _, w in leaves]))
    found = [(name, w, int(n)) for (name, w), n in zip(leaves, counts, strict=True) if n]
    if found:
        name, w, bad = found[0]
        nans = int(jnp.isnan(w).sum())
        what = " and ".join(
            f"{n} {kind}" for n, kind in ((nans, "NaN"), (bad - nans, "infinite")) if n
        )
        more = len(found) - 1
        others = f" (and {more} more parameter{'s' * (more > 1)})" if more else ""
        raise Diverged(
            f"the target's weight '{name}' has {what} of its {jnp.size(w)} entries{others}, "
            "expected finite weights (the target diverged or its checkpoint is damaged)"
        )
