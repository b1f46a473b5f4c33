"""Training one chunk of a group: the members one call of its programs trains together."""

import logging
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import haiku as hk
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding

from pd.state import TrainState
from pd.targets.base import Batch
from pd.targets.configs import TargetConfig
from pd.targets.train import TrainedTarget
from pd.train.finite import divergence
from pd.train.loop import Stepper, metric_sinks, train_loop
from pd.train.objective import Metrics, flat_metrics
from pd.train.recipe import make_batches
from pd.train.results import evaluation
from pd.train.rundir import write_config
from pd.train.sinks import MetricSinks
from pd.train.sweep.programs import MEMBERS, SHARED, Group, Programs, stacked_keys

log = logging.getLogger(__name__)


@contextmanager
def _rows_unlogged() -> Iterator[None]:
    """Without a bar, every member's sinks would log one line per row: the sweep logs one line
    per logged step for all of them instead."""

    class Unlogged(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return record.levelno > logging.INFO

    sinks_log, quiet = logging.getLogger("pd.train.sinks"), Unlogged()
    sinks_log.addFilter(quiet)
    try:
        yield
    finally:
        sinks_log.removeFilter(quiet)


class Stopped(Exception):
    """Another lane of the sweep failed, or it was interrupted: this one stops too."""


def member_state(host: TrainState, i: int) -> TrainState:
    """Member `i` of host-side stacked states, as device arrays of its own."""
    state: TrainState = jax.tree.map(lambda a: jnp.asarray(a[i]), host)
    return state


class Chunk:
    """Members trained by one call of a group's programs: `size` real ones, then copies of the
    last (padding to a multiple of the devices), whose results are dropped."""

    def __init__(
        self,
        group: Group,
        programs: Programs,
        mesh: Mesh,
        members: list[int],
        size: int,
        trained: dict[TargetConfig, TrainedTarget],
        stacked_frozen: bool,
    ) -> None:
        self.group, self.programs, self.size = group, programs, size
        self.members = [group.members[i] for i in members]
        self.kinds = [group.kinds[i] for i in members]
        self.trained = [trained[m.config.target] for m in self.members]
        on_members, shared = NamedSharding(mesh, MEMBERS), NamedSharding(mesh, SHARED)
        init, src, run = stacked_keys([m.config.seed for m in self.members])
        self.init_keys, self.src_keys, self.run_keys = jax.device_put((init, src, run), on_members)
        self.host_run_keys = run
        if stacked_frozen:
            stacked = jax.tree.map(lambda *a: jnp.stack(a), *(t.params for t in self.trained))
            self.frozen: hk.Params = jax.device_put(stacked, on_members)
        else:
            self.frozen = jax.device_put(self.trained[0].params, shared)
        self.on_members = on_members
        self._last = (0, 0.0)  # the step and time of the last logged row, for its speed

    def batches(self) -> Callable[[int], Batch]:
        """The members' batches of a step, stacked (S18: each a pure function of its seed), for
        targets whose steps do not draw their own."""
        recipe = self.group.recipe
        per_member = [
            make_batches(m.config, recipe, k, kind=kind)
            for m, k, kind in zip(self.members, self.host_run_keys, self.kinds, strict=True)
        ]
        return lambda step: jax.device_put(
            jnp.stack([b(step) for b in per_member]), self.on_members
        )

    def evaluation(self, i: int, state: TrainState, folder: Path) -> dict[str, float]:
        """Member `i`'s summary (and figures), exactly as `pd.train.run` evaluates a run."""
        config, kind, recipe = self.members[i].config, self.kinds[i], self.group.recipe
        frozen, run_key = self.trained[i].params, self.host_run_keys[i]
        eval_batches = make_batches(config, recipe, run_key, evaluation=True, kind=kind)
        return evaluation(kind, recipe, config.eval, frozen, eval_batches, run_key)(state, folder)

    @property
    def label(self) -> str:
        """The members' names, for the log."""
        return ", ".join(m.name for m in self.members[: self.size])

    def train(self, folders: list[Path], stop: threading.Event) -> tuple[TrainState, list[str]]:
        """Every member's final state (host-side, stacked) and why each diverged ("" if not);
        rows into each member's sinks. Raises `Stopped` between calls once `stop` is set."""
        programs, cfg = self.programs, self.group.recipe.train
        states = programs.init(self.init_keys, self.src_keys)
        if cfg.faith_warmup_steps > 0:
            states = programs.warmup(states, self.frozen)
        if programs.steps is not None:  # toys: up to the next logged step in one call
            stepper = Stepper(self.frozen, self.run_keys, cfg.steps, steps=programs.steps)
        else:
            stepper = Stepper(
                self.frozen,
                self.run_keys,
                cfg.steps,
                step=programs.step,
                monitors=programs.monitors,
                batches=self.batches(),
            )
        diverged = [""] * self.size
        self._last = (0, time.perf_counter())
        with ExitStack() as stack, _rows_unlogged():
            sinks = []
            for member, folder in zip(self.members[: self.size], folders, strict=True):
                write_config(folder, member.config)
                sinks.append(stack.enter_context(metric_sinks(folder, member.config, 0, False)))

            def on_row(step: int, metrics: Metrics, states: TrainState | None) -> None:
                self._log(step, metrics, states, sinks, folders, diverged)

            states, first = train_loop(states, 0, stepper, sinks[0], on_row, stop.is_set)
            if first < cfg.steps:
                raise Stopped
        host_final: TrainState = jax.device_get(states)
        return host_final, diverged

    def _log(
        self,
        step: int,
        metrics: Metrics,
        states: TrainState | None,
        sinks: list[MetricSinks],
        folders: list[Path],
        diverged: list[str],
    ) -> None:
        """Each member's row of a logged step into its sinks (with its evaluation, given the
        `states` to evaluate), unless it has diverged, now or before (`diverged`); one line for
        the log."""
        host = jax.device_get(metrics)
        host_states = None if states is None else jax.device_get(states)
        totals = []
        for i, sink in enumerate(sinks):
            if diverged[i]:
                continue
            row = flat_metrics(self.group.recipe.table, {k: v[i] for k, v in host.items()})
            if (why := divergence(step, row)) is not None:
                diverged[i] = why
                continue
            if host_states is not None:
                evaluated = self.evaluation(i, member_state(host_states, i), folders[i])
                row |= {f"eval/{k}": v for k, v in evaluated.items()}
            sink.log(step, row)
            totals.append(row["loss/total"])
        done, before = self._last
        self._last = (step + 1, time.perf_counter())
        speed = (step + 1 - done) / max(self._last[1] - before, 1e-9)
        if len(totals) > 1:
            loss = (
                f"loss/total median {statistics.median(totals):.4g} "
                f"(min {min(totals):.4g}, max {max(totals):.4g})"
            )
        else:
            loss = f"loss/total {totals[0]:.4g}" if totals else "every member diverged"
        steps = self.group.recipe.train.steps
        log.info("step %d/%d of %s: %s, %.3g steps/s", step, steps, self.label, loss, speed)
