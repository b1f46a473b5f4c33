"""What a training loop does at each call, shared by a run (`pd.train.run`) and a sweep's chunks of
members (`pd.train.sweep.chunk`): which program takes the next steps and how many, the monitors
of a logged step, the sentence that stops a diverged row, and a run folder's config file and
metric sinks.
"""

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

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
        if (self.steps is None) == (self.step is None and self.batches is None):
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


def write_config(folder: Path, config: RunConfig) -> None:
    """A run folder's `config.json`, which `pd.load` and `--resume` read."""
    text = json.dumps(dataclasses.asdict(config), indent=2, allow_nan=False)
    (folder / "config.json").write_text(text)


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
