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
from jaxtyping import Array, Float, Int

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


def repeat_kept(n: int, f: Callable[[Carry], Carry], init: Carry, zero: Int[Array, ""]) -> Carry:
    """`repeat(n, f, init)` as a loop that XLA keeps even at `n = 1`: its count is
    `n + min(zero, 0)`, read at run time (`zero`: any traced integer that is never negative,
    such as the step). The result is then the loop's own buffer, which no later fusion can
    recompute from the loop's inputs, keeping them alive for as long as it is used: the
    adversary's warmup ascent would otherwise keep its Adam direction (an fp32 set of sources)
    alive through every pass. Fully unrolled (`unrolled()`) it is `repeat`."""
    if _unroll[-1] is True:
        return repeat(n, f, init)
    count = jnp.minimum(zero, 0) + n
    out: Carry = jax.lax.fori_loop(0, count, lambda _, carry: f(carry), init)
    return out


def accumulate(
    f: Callable[[P, X, P | None], Float[Array, ""]],
    params: P,
    rows: X,
    into: P,
    scale: float,
    adds_into: bool = False,
) -> tuple[Float[Array, ""], P]:
    """`(mean_j f(params, rows[j], ·), into + scale · ∇ mean_j f)`, one row at a time.

    Each row's backward runs in the row's own iteration and the loop carries the one running
    gradient `into`, so a step holds one row's residuals (a masked forward's activations) and
    one gradient at a time, never every row's; nothing a row computes from `params` alone (a
    layer's gathered weights) is hoisted out of the loop and kept for all of them.

    `f`'s third argument is None, or with `adds_into` the running gradient itself: `f` then
    hands every leaf of it to `scan_adding`, whose backward adds the row's gradient into it in
    place, and the row's gradient never exists as a buffer of its own.
    """
    n = jax.tree.leaves(rows)[0].shape[0]

    def body(grads: P, row: X) -> tuple[P, Float[Array, ""]]:
        if not adds_into:
            value, grad = jax.value_and_grad(lambda p: f(p, row, None))(params)
            return jax.tree.map(lambda a, g: a + g * (scale / n), grads, grad), value

        def scaled(p: P, acc: P) -> tuple[Float[Array, ""], Float[Array, ""]]:
            value = f(p, row, acc)
            return value * (scale / n), value

        (_, value), (grad, added) = jax.value_and_grad(scaled, (0, 1), has_aux=True)(params, grads)
        return jax.tree.map(jnp.add, added, grad), value

    # (The values leave as rows, not in the carry: a carry made here would not vary like the
    # parameters where they vary, over a sweep's members.)
    grads, values = scan(body, into, rows)
    return jnp.mean(values), grads


G = TypeVar("G")


def scan_adding(
    body: Callable[[Carry, X], Carry], init: Carry, xs: X, into: G, pick: Callable[[X], G]
) -> Carry:
    """`scan(body, init, xs)`'s last carry, for a loop whose backward runs inside `accumulate`
    with `adds_into`: the backward recomputes each iteration from its input carry (as
    `jax.checkpoint` of the body would) and adds the cotangents of `pick(xs)` row by row into
    `into` (its rows aligned with those of `xs`), in place.

    The derivative it reports is that sum, `into + ∂/∂pick(xs)`, for `into`, and none for `xs`:
    not the derivative of the function, which ignores `into`, but the running gradient that
    `accumulate` carries on with.
    """
    out: Carry = _scan_adding(body, pick, init, xs, into)
    return out


def _scan_adding_impl(
    body: Callable[[Carry, X], Carry], pick: Callable[[X], G], init: Carry, xs: X, into: G
) -> Carry:
    del pick, into
    last: Carry = scan(lambda c, x: (body(c, x), None), init, xs)[0]
    return last


def _scan_adding_fwd(
    body: Callable[[Carry, X], Carry], pick: Callable[[X], G], init: Carry, xs: X, into: G
) -> tuple[Carry, tuple[Carry, X, G]]:
    """The forward, keeping each iteration's input carry."""
    del pick
    last, inputs = scan(lambda c, x: (body(c, x), c), init, xs)
    return last, (inputs, xs, into)


def _scan_adding_bwd(
    body: Callable[[Carry, X], Carry],
    pick: Callable[[X], G],
    saved: tuple[Carry, X, G],
    ct: Carry,
) -> tuple[Carry, None, G]:
    """The backward, last iteration first: each recomputes its body's vjp from its input carry
    and adds its `pick(xs)` cotangents into row i of the running gradient."""
    inputs, xs, into = saved

    def back(
        carry: tuple[Carry, G], row: tuple[Int[Array, ""], Carry, X]
    ) -> tuple[tuple[Carry, G], None]:
        ct_c, acc = carry
        i, c, x = row
        ct_prev, ct_x = jax.vjp(body, c, x)[1](ct_c)
        acc = jax.tree.map(lambda a, g: a.at[i].add(g.astype(a.dtype)), acc, pick(ct_x))
        return (ct_prev, acc), None

    n = jax.tree.leaves(inputs)[0].shape[0]
    rows = (jnp.arange(n), inputs, xs)
    (ct_init, acc), _ = jax.lax.scan(back, (ct, into), rows, reverse=True, unroll=_unroll[-1])
    return ct_init, None, acc


_scan_adding = jax.custom_vjp(_scan_adding_impl, nondiff_argnums=(0, 1))
_scan_adding.defvjp(_scan_adding_fwd, _scan_adding_bwd)
