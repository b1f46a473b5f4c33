"""The training loop of a run (`pd.train.run`) and of a sweep's chunks of members
(`pd.train.sweep.chunk`): which program takes the next steps and how many, the monitors of a
logged step, and a run folder's metric sinks. What differs between the two is what they do
with a logged row (`OnRow`).
"""

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import haiku as hk
import jax
import jax.numpy as jnp

from pd.state import TrainState
from pd.targets.base import Batch
from pd.train.config import RunConfig
from pd.train.objective import Metrics
from pd.train.sinks import MetricSinks

# The programs of a loop, one run's or a sweep's members' stacked along a leading axis: one step
# on a batch, `n` steps that draw their own batches (and return the monitors of the last), the
# monitors of a state on a batch.
Step = Callable[[TrainState, hk.Params, Batch, jax.Array], tuple[TrainState, Metrics]]
Steps = Callable[[TrainState, hk.Params, jax.Array, jax.Array], tuple[TrainState, Metrics]]
Monitors = Callable[[TrainState, hk.Params, Batch], Metrics]
# What a loop does with a logged step: its metrics (monitors included) and, where the step is
# evaluated, its state.
OnRow = Callable[[int, Metrics, TrainState | None], None]

_CALL_SECONDS = 0.25  # a multi-step call's length: about how long a stop waits for it


@dataclass
class Stepper:
    """A loop's step programs on its frozen weights and run key(s). Where the program draws its
    batches (`steps`), a call takes every step up to a boundary the loop chooses; otherwise
    (`step`, with `batches` from the host) one step a call, the next step's batch drawn while it
    runs, and the monitors, which are not trained, only on logged steps (`monitors`)."""

    frozen: hk.Params
    run_key: jax.Array
    total: int  # the run's steps
    step: Step | None = None
    steps: Steps | None = None
    monitors: Monitors | None = None
    batches: Callable[[int], Batch] | None = None
    _drawn: dict[int, Batch] = field(default_factory=dict)

    def __post_init__(self) -> None:
        one_a_call = self.step is not None and self.batches is not None
        if (self.steps is not None) == one_a_call:
            raise ValueError("Stepper takes `steps`, or `step` with `batches`, not both")

    def last_of_call(self, first: int, boundary: int) -> int:
        """The last step of a call from `first`, where the loop would stop at `boundary`."""
        return first if self.steps is None else boundary

    def take(self, state: TrainState, first: int, last: int) -> tuple[TrainState, Metrics]:
        """Steps `first` to `last` (`last_of_call`) from `state`: the new state and the last
        step's metrics."""
        if self.steps is not None:
            n = jnp.asarray(last - first + 1, jnp.int32)
            return self.steps(state, self.frozen, self.run_key, n)
        assert self.step is not None and last == first
        x = self._batch(first)
        out = self.step(state, self.frozen, x, self.run_key)
        self._drawn = {first: x}  # for the monitors of this step
        if first + 1 < self.total:
            self._drawn[first + 1] = self._batch(first + 1)
        return out

    def with_monitors(self, metrics: Metrics, state: TrainState, step: int) -> Metrics:
        """A logged step's metrics with the monitors (SPEC §5) of `state` on its batch."""
        if self.monitors is None:  # the steps program returned them
            return metrics
        return metrics | self.monitors(state, self.frozen, self._batch(step))

    def _batch(self, step: int) -> Batch:
        if step in self._drawn:
            return self._drawn[step]
        assert self.batches is not None
        return self.batches(step)


@runtime_checkable
class Cadence(Protocol):
    """Which steps a loop logs and evaluates (`MetricSinks` is one), and its progress."""

    def should_log(self, step: int) -> bool: ...

    def should_eval(self, step: int) -> bool: ...

    def next_logged(self, step: int) -> int: ...

    def advance(self, n: int = 1) -> None: ...


def train_loop(
    state: TrainState,
    first: int,
    stepper: Stepper,
    cadence: Cadence,
    on_row: OnRow,
    stopped: Callable[[], bool],
    save: Callable[[int, TrainState], None] | None = None,
    checkpoint_every: int = 0,
) -> tuple[TrainState, int]:
    """Steps from `first` (`state`'s) to the end, or until `stopped()` (asked before each call): the
    state and the next step to take. Each logged or evaluated step goes to `on_row`; with `save`
    the state of every `checkpoint_every`-th step and of the last is saved, and a stopped loop
    saves where it is. One call is in flight at a time, so a stop waits for that one.

    Where the step program draws its batches, a call takes the steps up to the next one that is
    logged, evaluated or saved, at most about `_CALL_SECONDS` of them at the pace measured so
    far; otherwise one step a call.
    """
    total = stepper.total
    every = checkpoint_every or total
    saved = first
    per_call = 1
    while first < total and not stopped():
        t0 = time.perf_counter()
        boundary = min(cadence.next_logged(first), (first // every + 1) * every - 1)
        step = stepper.last_of_call(first, min(boundary, first + per_call - 1))
        state, metrics = stepper.take(state, first, step)
        jax.tree.map(lambda a: a.block_until_ready(), metrics)  # one call in flight
        n = step - first + 1
        per_call = max(1, min(2 * n, int(_CALL_SECONDS * n / (time.perf_counter() - t0))))
        # The last step's evaluation is the run's own, after the loop.
        evaluate = cadence.should_eval(step) and step < total - 1
        if cadence.should_log(step) or evaluate:
            on_row(step, stepper.with_monitors(metrics, state, step), state if evaluate else None)
        cadence.advance(n)
        first = step + 1
        if save is not None and (first % every == 0 or first == total):
            save(first, state)
            saved = first
    if save is not None and first < total and saved != first:  # stopped
        save(first, state)  # a resume continues from here exactly
    return state, first


def metric_sinks(
    folder: Path, config: RunConfig, start_step: int = 0, interactive: bool | None = None
) -> MetricSinks:
    """The metric sinks of a run folder, as its config asks (`train.log_every`, tensorboard,
    W&B); `interactive=False` draws no progress bar."""
    t = config.train
    return MetricSinks(
        folder,
        t.steps,
        log_every=t.log_every,
        eval_every=t.eval_every,
        start_step=start_step,
        tensorboard=t.tensorboard,
        wandb=t.wandb,
        run_name=config.name,
        config=dataclasses.asdict(config),
        interactive=interactive,
    )
