"""`run(config) -> RunResult`: target, init, warmup, the training loop, evaluation, run folder."""

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import haiku as hk
import jax

from pd.compile_times import CompileTimes, recording
from pd.data import DataError
from pd.init import key_tree
from pd.log import show_pd_logs
from pd.shard import ShardingError, initialize_distributed
from pd.state import TrainState
from pd.targets.base import Batch
from pd.targets.hf import CheckpointError
from pd.targets.train import TrainedTarget
from pd.train.ahead import Ahead
from pd.train.checkpoints import Checkpoints
from pd.train.config import ConfigError, RunConfig
from pd.train.decomposition import Decomposition
from pd.train.finite import Diverged, check_finite, divergence, save_finite
from pd.train.folder import RunFolder
from pd.train.kinds import OwnTarget, TargetKind, kind_of
from pd.train.loop import OnRow, Stepper, metric_sinks, train_loop
from pd.train.objective import Metrics, Recipe, flat_metrics
from pd.train.placement import Placement, placement_of
from pd.train.recipe import make_batches, make_recipe
from pd.train.results import Evaluation, evaluation, summary_table, write_results
from pd.train.rundir import (
    check_destination,
    check_intact,
    check_same_config,
    checkpoint_steps,
    partial_dir,
    set_aside,
    staged,
    write_config,
)
from pd.train.signals import Pending, deferred
from pd.train.sinks import MetricSinks, check_wandb_login
from pd.train.step import (
    Sampler,
    faith_warmup,
    make_monitor_step,
    make_train_step,
    make_train_steps,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunResult:
    """What a run leaves behind: its folder, summary, final state and frozen target."""

    run_dir: Path
    config: RunConfig
    summary: dict[str, float]
    compile_times: CompileTimes
    state: TrainState
    frozen: hk.Params
    recipe: Recipe
    kind: TargetKind

    @property
    def decomposition(self) -> Decomposition:
        """The trained decomposition, as `pd.load(run_dir)` gives it."""
        s = self.state
        return Decomposition(
            self.config, self.recipe, self.kind, self.frozen, s.components, s.ci_params
        )


def _row_logger(recipe: Recipe, sinks: MetricSinks, evaluation: Evaluation, run_dir: Path) -> OnRow:
    """A run's logged rows: refused with `Diverged` where a value is not finite, with the
    evaluation's summary (`eval/` keys) where the step is evaluated, into `sinks`."""

    def on_row(step: int, metrics: Metrics, state: TrainState | None) -> None:
        row = flat_metrics(recipe.table, jax.device_get(metrics))
        if (diverged := divergence(step, row)) is not None:
            raise Diverged(diverged)
        if state is not None:
            row |= {f"eval/{k}": v for k, v in evaluation(state, run_dir).items()}
        sinks.log(step, row)

    return on_row


def _stop_if(pending: Pending) -> None:
    """Raise the stop a signal requested while it was deferred."""
    if (stop := pending()) is not None:
        raise stop


def run(
    config: RunConfig,
    out: Path | None = None,
    overwrite: bool = False,
    own: OwnTarget | None = None,
    resume: bool = False,
) -> RunResult:
    """Decompose the configured target (or `own`, a target of the caller's own, in place of
    `config.target`) end to end and write the run folder.

    The folder appears only when the run has finished (`pd.train.rundir.staged`): a failing or
    interrupted run writes nothing to `out` and, with `overwrite`, leaves the old run there. An
    interrupted run keeps its checkpoints beside it; `resume` continues it from the latest, with
    the same config (its mesh may differ), to the same result as an uninterrupted run.
    """
    show_pd_logs()  # progress lines from a script or notebook that configured no logging
    plan = _plan(config, Path(out) if out is not None else None, overwrite, own, resume)
    t0 = time.perf_counter()
    with (
        recording() as times,
        Ahead(plan.recipe, plan.run_key, plan.placement, plan.sample) as ahead,
    ):
        fresh = _start_early(plan, ahead)
        trained = _load_target(plan)
        try:
            with staged(plan.run_dir, overwrite, resume) as folder:
                write_config(folder, plan.config)
                frozen = plan.placement.frozen(plan.recipe.target, trained.params)
                evaluation = _evaluation(plan, frozen)
                state = _train_in(folder, plan, frozen, evaluation, ahead, fresh)
                summary = write_results(folder, state, trained, evaluation, t0)
                times.write(RunFolder(folder).compile_times)
        except Diverged as err:  # a rerun starts over; the last finite checkpoint is kept aside
            raise _set_aside(plan.run_dir, err) from None
    config, recipe, kind = plan.config, plan.recipe, plan.kind
    return RunResult(plan.run_dir, config, summary, times, state, frozen, recipe, kind)


@dataclass(frozen=True)
class _Plan:
    """What a run decided, and checked, before it writes or compiles anything."""

    config: RunConfig  # as recorded: a target given in Python becomes a FactoryConfig
    run_dir: Path
    resume: bool
    kind: TargetKind
    recipe: Recipe
    placement: Placement
    shardings: TrainState | None  # the step program's: None where jit places the state
    init_key: jax.Array
    src_key: jax.Array
    run_key: jax.Array
    sample: Sampler | None  # where the step program draws its batches


def _plan(
    config: RunConfig, out: Path | None, overwrite: bool, own: OwnTarget | None, resume: bool
) -> _Plan:
    """Every check a run makes before it writes anything: the sites, the mesh's divisibility,
    the token file, W&B, the destination and, resuming, the interrupted run's config."""
    run_dir = out if out is not None else Path("runs") / config.name
    kind = kind_of(config.target, own)  # a factory's target is built here, once
    config = kind.recorded(config)  # a caller's target: what it really runs with
    recipe = make_recipe(config, kind)  # validates the site specs before anything is written
    if config.distributed.coordinator:  # before anything starts a jax backend
        d = config.distributed
        initialize_distributed(d.coordinator, d.num_processes, d.process_id)
    placement = placement_of(config)
    try:
        shardings = placement.shardings(recipe)
        kind.check_inputs()
    except (ShardingError, DataError) as err:
        raise ConfigError(str(err)) from None
    check_wandb_login(config.train.wandb)
    check_destination(run_dir, overwrite, resume)
    if resume:
        check_same_config(RunFolder(partial_dir(run_dir)).config, config)
    _use_compile_cache(config)
    sample = placement.sampler(kind, recipe.target, config.train.batch)
    keys = key_tree(config.seed)
    return _Plan(config, run_dir, resume, kind, recipe, placement, shardings, *keys, sample)


def _use_compile_cache(config: RunConfig) -> None:
    """JAX's persistent compilation cache, where `compile.cache_dir` names one."""
    if config.compile.cache_dir:
        set_option: Callable[[str, object], None] = jax.config.update  # unannotated upstream
        set_option("jax_compilation_cache_dir", config.compile.cache_dir)
        set_option("jax_persistent_cache_min_compile_time_secs", config.compile.min_compile_secs)


def _start_early(plan: _Plan, ahead: Ahead) -> Future[TrainState] | None:
    """While the target trains or loads: the state's initializer, which does not read the
    target, and a step program that draws its batches, which reads only the target's shapes
    (where the placement allows it: `starts_early`)."""
    if not plan.placement.starts_early or plan.resume:
        return None
    fresh = ahead.initialize(plan.init_key, plan.src_key)
    shapes = plan.kind.frozen_shapes(plan.recipe.target)
    if plan.sample is not None and shapes is not None:
        ahead.start(shapes, None)
    return fresh


def _load_target(plan: _Plan) -> TrainedTarget:
    """The frozen target, trained or loaded, checked finite; a bad checkpoint stops the run
    before any folder is made."""
    try:
        trained = plan.kind.load_frozen(plan.recipe.target)
    except CheckpointError as err:
        raise ConfigError(str(err)) from None
    log.info("target ready (%s)", trained.describe())
    check_finite(trained.params)
    return trained


def _train_in(
    folder: Path,
    plan: _Plan,
    frozen: hk.Params,
    evaluation: Evaluation,
    ahead: Ahead,
    fresh: Future[TrainState] | None,
) -> TrainState:
    """The trained state: from the latest checkpoint in `folder` (resuming) or a new one, trained
    to the end with a checkpoint every `train.checkpoint_every` steps. A stop (Ctrl-C, SIGTERM)
    saves where the run is and is raised once the checkpoints are written."""
    config, recipe = plan.config, plan.recipe
    batches = make_batches(config, recipe, plan.run_key, plan.placement, kind=plan.kind)
    keep, intact = config.train.keep_checkpoints, partial(check_intact, folder)
    with Checkpoints(RunFolder(folder).checkpoints, keep, intact) as checkpoints:
        if not ahead.started:  # compiles while the state is restored or made
            ahead.start(frozen, batches)
        state = _initial_state(plan, checkpoints, frozen, fresh)
        ahead.wait()
        stepper = _stepper(plan, frozen, batches)
        with (
            metric_sinks(folder, config, int(state.step)) as sinks,
            deferred() as pending,  # nor a step, nor a checkpoint's write is cut by a signal
            checkpoints,  # closed before the signals are handled again
        ):
            state, _ = train_loop(
                state,
                int(state.step),  # a resumed state is its checkpoint's
                stepper,
                sinks,
                _row_logger(recipe, sinks, evaluation, folder),
                lambda: pending() is not None,
                partial(save_finite, checkpoints),
                config.train.checkpoint_every,
            )
        _stop_if(pending)
    return state


def _initial_state(
    plan: _Plan, checkpoints: Checkpoints, frozen: hk.Params, fresh: Future[TrainState] | None
) -> TrainState:
    """The latest checkpoint's state (resuming), or a new one after the faithfulness warmup."""
    with deferred() as pending:  # a signal does not cut a restore
        like = plan.placement.abstract_state(plan.recipe)
        restored = checkpoints.restore_latest(like) if plan.resume else None
    _stop_if(pending)
    if restored is not None:
        state = restored
    else:
        made = fresh.result() if fresh is not None else None
        if made is None:
            made = plan.placement.init(plan.recipe, plan.init_key, plan.src_key)
        state = _warmed_up(plan.recipe, made, frozen)
    # A failed allocation (out of memory) raises here; jax 0.10.2 on a CPU would wait forever
    # reading a value (`int(state.step)`) of a computation that failed.
    for leaf in jax.tree.leaves(state):
        leaf.block_until_ready()
    return state


def _set_aside(run_dir: Path, err: Diverged) -> Diverged:
    """A diverged run's error, saying where its partial folder (with its last finite
    checkpoint) was set aside, if it was."""
    aside = set_aside(run_dir)
    if aside is None:
        return err
    steps = checkpoint_steps(aside)
    last = f"its last finite checkpoint (step {steps[-1]})" if steps else "its folder"
    return Diverged(f"{err}; {last} is set aside in '{aside}'")


def _stepper(plan: _Plan, frozen: hk.Params, batches: Callable[[int], Batch]) -> Stepper:
    """A run's programs: n steps that draw their batches (with `sample`), or one step a call on
    the host's batches, with the monitors on logged steps."""
    recipe, run_key, steps = plan.recipe, plan.run_key, plan.config.train.steps
    if plan.sample is not None:
        return Stepper(frozen, run_key, steps, steps=make_train_steps(recipe, plan.sample))
    step, monitors = make_train_step(recipe, plan.shardings), make_monitor_step(recipe)
    return Stepper(frozen, run_key, steps, step=step, monitors=monitors, batches=batches)


def _evaluation(plan: _Plan, frozen: hk.Params) -> Evaluation:
    """The run's evaluation: its summary, with the figures drawn into the folder given."""
    config, recipe, kind, run_key = plan.config, plan.recipe, plan.kind, plan.run_key
    eval_batches = make_batches(config, recipe, run_key, plan.placement, True, kind)
    return evaluation(kind, recipe, config.eval, frozen, eval_batches, run_key)


def _warmed_up(recipe: Recipe, state: TrainState, frozen: hk.Params) -> TrainState:
    """The state at step 0: the initialized one after the components' faithfulness warmup."""
    if recipe.train.faith_warmup_steps > 0:
        state = state._replace(components=faith_warmup(recipe, state.components, frozen))
    return state


__all__ = [
    "Diverged",
    "OwnTarget",
    "RunResult",
    "make_batches",
    "make_recipe",
    "run",
    "summary_table",
]
