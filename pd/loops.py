"""The loops of pd's jitted programs (layers, chunks, plan rows, warmup ascents), in one place.

A step traces its loops under `unroll(n)` (`train.unroll`): each loop iteration then runs n
bodies, as JAX's `scan(unroll=n)`. The program holds n copies of each body, so it stays the
same size at any depth; on a CPU a small model runs faster with 2, because two independent
bodies (two plan rows, two layers' worth of work) can run side by side.

XLA's cost analysis counts a `while` loop's body once. Inside `unrolled()` every loop is traced
fully unrolled, so that `compiled.cost_analysis()` counts each iteration and folds each
per-site `lax.cond` to the branch that runs — `bench/compile_step.py` uses it to report the
FLOPs a step really does. Training never uses it: an unrolled program grows with depth.
"""

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TypeVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

Carry = TypeVar("Carry")
P = TypeVar("P")
X = TypeVar("X")
Y = TypeVar("Y")

_unroll: list[int | bool] = [1]


@contextmanager
def unroll(n: int | bool) -> Iterator[None]:
    """Trace the loops inside the block with `n` bodies per iteration (True: all); a fully
    unrolled block stays fully unrolled."""
    _unroll.append(True if _unroll[-1] is True else n)
    try:
        yield
    finally:
        _unroll.pop()


def unrolled() -> AbstractContextManager[None]:
    """Trace every loop inside the block fully unrolled (for cost analysis only)."""
    return unroll(True)


def scan(
    body: Callable[[Carry, X], tuple[Carry, Y]], init: Carry, xs: X, length: int | None = None
) -> tuple[Carry, Y]:
    """`lax.scan(body, init, xs, length)`."""
    out: tuple[Carry, Y] = jax.lax.scan(body, init, xs, length=length, unroll=_unroll[-1])
    return out


def map_rows(f: Callable[[X], Y], xs: X) -> Y:
    """`lax.map(f, xs)`: one row at a time."""

    def body(carry: None, x: X) -> tuple[None, Y]:
        return carry, f(x)

    return scan(body, None, xs)[1]


def repeat(n: int, f: Callable[[Carry], Carry], init: Carry) -> Carry:
    """`f` applied `n` times (a static count) as one loop."""

    def body(carry: Carry, _: None) -> tuple[Carry, None]:
        return f(carry), None

    return scan(body, init, None, length=n)[0]


def accumulate(
    f: Callable[[P, X], Float[Array, ""]], params: P, rows: X, into: P, scale: float
) -> tuple[Float[Array, ""], P]:
    """`(mean_j f(params, rows[j]), into + scale · ∇ mean_j f)`, one row at a time.

    Each row's backward runs in the row's own iteration and the loop carries the one running
    gradient `into`, so a step holds one row's residuals (a masked forward's activations) and
    one gradient at a time, never every row's; nothing a row computes from `params` alone (a
    layer's gathered weights) is hoisted out of the loop and kept for all of them.
    """
    n = jax.tree.leaves(rows)[0].shape[0]

    def body(grads: P, row: X) -> tuple[P, Float[Array, ""]]:
        value, grad = jax.value_and_grad(f)(params, row)
        return jax.tree.map(lambda a, g: a + g * (scale / n), grads, grad), value

    # (The values leave as rows, not in the carry: a carry made here would not vary like the
    # parameters where they vary, over a sweep's members.)
    grads, values = scan(body, into, rows)
    return jnp.mean(values), grads
