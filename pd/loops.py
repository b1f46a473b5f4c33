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

Carry = TypeVar("Carry")
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
