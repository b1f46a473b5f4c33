"""The loops of pd's jitted programs (layers, chunks, plan rows, warmup ascents), in one place.

XLA's cost analysis counts a `while` loop's body once. Inside `unrolled()` every loop is traced
fully unrolled, so that `compiled.cost_analysis()` counts each iteration and folds each
per-site `lax.cond` to the branch that runs — `bench/compile_step.py` uses it to report the
FLOPs a step really does. Training never uses it: an unrolled program grows with depth.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import jax

Carry = TypeVar("Carry")
X = TypeVar("X")
Y = TypeVar("Y")

_unroll = [False]


@contextmanager
def unrolled() -> Iterator[None]:
    """Trace every loop inside the block fully unrolled (for cost analysis only)."""
    _unroll.append(True)
    try:
        yield
    finally:
        _unroll.pop()


def scan(
    body: Callable[[Carry, X], tuple[Carry, Y]], init: Carry, xs: X, length: int | None = None
) -> tuple[Carry, Y]:
    """`lax.scan(body, init, xs, length)`."""
    out: tuple[Carry, Y] = jax.lax.scan(body, init, xs, length=length, unroll=_unroll[-1] or 1)
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
