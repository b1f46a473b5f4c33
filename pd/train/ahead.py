"""Work a run does on background threads before its loop: compiling the step and monitor
programs and initializing the state, while the main thread trains or loads the target.

None of these reads the target's values (a toy's step compiles for the shapes its training
will give, `pd.targets.train.trained_shapes`), and an XLA compile releases the GIL, so where
the machine has a core free the cold start shrinks toward the longest of them instead of their
sum (`docs/performance.md`, "Start-up"). jax keeps the program that
`fn.trace(args).lower().compile()` made for `fn`'s later calls whose arguments have the same
shapes, dtypes and placements, so the training loop finds its programs compiled. A compile
that fails here is left to the loop's own call, which raises it where a run without this would.
"""

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import cast

import haiku as hk
import jax
import jax.numpy as jnp
from jax.stages import Wrapped
from jaxtyping import PyTree

from pd.state import TrainState
from pd.targets.base import Batch
from pd.train.objective import Recipe
from pd.train.placement import Placement
from pd.train.step import Sampler, make_monitor_step, make_train_step, make_train_steps
from pd.xla import shape_dtype

log = logging.getLogger(__name__)


class Ahead:
    """`start` compiles the step program the training loop will call: `train_steps` where it
    draws its batches with `sample` (it computes the monitors too), else `train_step` (with the
    state's shardings on a mesh) and `monitor_step`; `initialize` makes the state. `wait` (and
    the block's exit) waits for the compiles."""

    def __init__(
        self, recipe: Recipe, run_key: jax.Array, placement: Placement, sample: Sampler | None
    ):
        self.recipe, self.run_key, self.placement, self.sample = recipe, run_key, placement, sample
        self.pool = ThreadPoolExecutor(max_workers=3, thread_name_prefix="pd-compile")
        self.futures: list[Future[None]] = []

    def __enter__(self) -> "Ahead":
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.wait()

    @property
    def started(self) -> bool:
        return bool(self.futures)

    def start(
        self,
        frozen: hk.Params | PyTree[jax.ShapeDtypeStruct],
        batches: Callable[[int], Batch] | None,
    ) -> None:
        """Begin the compiles for `frozen` (its values, or only their shapes and dtypes where it
        is not loaded yet: a run that draws its batches needs no `batches`), for the state as
        the placement makes or restores it."""
        recipe, placement, pool = self.recipe, self.placement, self.pool
        state = placement.abstract_state(recipe)
        if self.sample is not None:
            steps = make_train_steps(recipe, self.sample)
            n = shape_dtype((), jnp.int32)
            self.futures = [pool.submit(compile_for, steps, state, frozen, self.run_key, n)]
            return
        assert batches is not None, "a run given its batches compiles for one of them"
        # One call of `batches` (a caller's own may not be safe to call from two threads).
        batch = pool.submit(batches, 0)
        step = make_train_step(recipe, placement.shardings(recipe))  # as the run's
        monitor_step = make_monitor_step(recipe)

        def train() -> None:
            compile_for(step, state, frozen, batch.result(), self.run_key)

        def monitors() -> None:
            compile_for(monitor_step, state, frozen, batch.result())

        self.futures = [pool.submit(train), pool.submit(monitors)]  # each raises what `batch` did

    def initialize(self, init_key: jax.Array, src_key: jax.Array) -> Future[TrainState]:
        """The initial state, made on a background thread."""
        return self.pool.submit(self.placement.init, self.recipe, init_key, src_key)

    def wait(self) -> None:
        """Wait for the compiles; one that failed is logged (the loop compiles its own)."""
        self.pool.shutdown()
        wait_compiles(self.futures)
        self.futures = []


def wait_compiles(futures: list[Future[None]]) -> None:
    """Wait for compiles begun ahead; one that failed is logged (the loop compiles its own)."""
    for future in futures:
        if (err := future.exception()) is not None:
            log.debug("compiling ahead failed (the loop compiles its own): %r", err)


def compile_for(fn: Callable[..., object], *args: object) -> None:
    """Compile the jitted `fn` (which pd types as the function it wraps) for `args`."""
    jitted = cast(Wrapped, fn)
    jitted.trace(*args).lower().compile()
