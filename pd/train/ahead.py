"""A run's step and monitor programs, compiled on background threads while the main thread
makes the state (initialization and warmup, or a checkpoint's restore).

Those and the state's initializer (on the main thread) do not depend on each other, and an XLA
compile releases the GIL, so where the machine has more cores than one compile keeps busy, the
cold start shrinks toward the longest of them instead of their sum (README, "Speed"). jax keeps
the program that `fn.trace(args).lower().compile()` made for `fn`'s later calls whose arguments
have the same shapes, dtypes and placements, so the training loop finds its programs compiled.
A compile that fails here is left to the loop's own call, which raises it where a run without
this would.
"""

import logging
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import cast

import haiku as hk
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.stages import Wrapped

from pd.targets.base import Batch
from pd.train.init_state import abstract_state, state_shardings
from pd.train.step import Recipe, make_monitor_step, make_train_step, make_train_steps

log = logging.getLogger(__name__)
_struct: Callable[..., jax.ShapeDtypeStruct] = jax.ShapeDtypeStruct  # unannotated upstream


@contextmanager
def compiling_ahead(
    recipe: Recipe,
    frozen: hk.Params,
    run_key: jax.Array,
    batches: Callable[[int], Batch],
    mesh: Mesh | None,
    sampled: bool,
    restored: bool,
) -> Iterator[None]:
    """Compile in the background the step program `_train` will call: `train_steps` where
    `sampled` (it computes the monitors too), else `train_step` (with the state's shardings on a
    mesh) and `monitor_step`; the block's exit waits for them. `restored`: the state will come
    from a checkpoint."""
    state = abstract_state(recipe, mesh)
    if mesh is None and not restored:
        # A fresh single-device state is what jit returns, uncommitted: a program lowered for
        # leaves placed on the device would not be the one its calls look up.
        state = jax.tree.map(lambda a: _struct(a.shape, a.dtype), state)

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="pd-compile") as pool:
        if sampled:
            steps = make_train_steps(recipe, recipe.train.batch)
            n = _struct((), jnp.int32)
            futures = [pool.submit(_compile, steps, state, frozen, run_key, n)]
        else:
            # One call of `batches` (a caller's own may not be safe to call from two threads).
            batch = pool.submit(batches, 0)
            shardings = None if mesh is None else state_shardings(recipe, mesh)  # as run's
            step, monitor_step = make_train_step(recipe, shardings), make_monitor_step(recipe)

            def train() -> None:
                _compile(step, state, frozen, batch.result(), run_key)

            def monitors() -> None:
                _compile(monitor_step, state, frozen, batch.result())

            futures = [pool.submit(train), pool.submit(monitors)]  # each raises what `batch` did
        yield
    for future in futures:
        if (err := future.exception()) is not None:
            log.debug("compiling ahead failed (the loop compiles its own): %r", err)


def _compile(fn: Callable[..., object], *args: object) -> None:
    """Compile the jitted `fn` (which pd types as the function it wraps) for `args`."""
    jitted = cast(Wrapped, fn)
    jitted.trace(*args).lower().compile()
