"""`run(config) -> RunResult`: target, init, warmup, the training loop, evaluation, run folder."""

import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import haiku as hk
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from pd.compile_times import CompileTimes, recording
from pd.data import DataError
from pd.init import key_tree
from pd.log import show_pd_logs
from pd.shard import ShardingError, initialize_distributed, make_mesh
from pd.shard.state import frozen_shardings
from pd.state import TrainState
from pd.targets.base import Batch
from pd.targets.configs import FactoryConfig
from pd.targets.hf import CheckpointError
from pd.targets.train import TrainedTarget
from pd.train import checkpoint
from pd.train.ahead import Ahead
from pd.train.config import ConfigError, RunConfig
from pd.train.decomposition import Decomposition
from pd.train.evaluate import figure_batch
from pd.train.init_state import abstract_state, init_train_state, state_shardings
from pd.train.kinds import OwnTarget, TargetKind, kind_of
from pd.train.loop import Stepper, divergence, metric_sinks, write_config
from pd.train.objective import Recipe, flat_metrics
from pd.train.recipe import make_batches, make_recipe
from pd.train.resume import Checkpoints
from pd.train.rundir import (
    CHECKPOINTS,
    check_destination,
    check_intact,
    checkpoint_steps,
    partial_dir,
    set_aside,
    staged,
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


class Diverged(RuntimeError):
    """Non-finite numbers (exit status 3 from the command line): a NaN or an infinity in the
    target's frozen weights (the message names the parameter, found before the run folder is
    made) or a non-finite loss or gradient norm in training (it names the step and the term)."""


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


def make_mesh_of(config: RunConfig) -> Mesh | None:
    """The run's `(data, model)` mesh, or None for a single-device run."""
    m = config.mesh
    if m.data * m.model == 1 and jax.process_count() == 1:
        return None
    try:
        return make_mesh({"data": m.data, "model": m.model})
    except ShardingError as err:
        raise ConfigError(f"config key 'mesh': {err}") from None


Evaluation = Callable[[TrainState, Path], dict[str, float]]  # the summary; figures into a folder


_CALL_SECONDS = 0.25  # a multi-step call's length: about how long a stop waits for it


def _train(
    recipe: Recipe,
    state: TrainState,
    stepper: Stepper,
    checkpoints: Checkpoints,
    sinks: MetricSinks,
    evaluation: Evaluation,
    run_dir: Path,
    pending: Pending,
) -> TrainState:
    """The loop from `state.step`: one `device_get` per logged step, sent to `sinks`; the
    evaluation and figures every `train.eval_every` steps; a checkpoint every
    `train.checkpoint_every` steps and at the end, each of a finite state. When `pending()`
    reports a stop (Ctrl-C or SIGTERM, `pd.train.signals`), the loop saves a checkpoint of
    where it is and raises it: one call is in flight at a time, so a stop waits for that one.

    Where the step program draws its batches (toys, a caller's jittable ones), a call takes the
    steps up to the next one that is logged, evaluated or checkpointed, at most about
    `_CALL_SECONDS` of them at the pace measured so far (`pd.train.loop.Stepper`).
    """
    cfg = recipe.train
    every = cfg.checkpoint_every or cfg.steps
    first = saved = int(state.step)  # a resumed state is its checkpoint's
    per_call = 1
    while first < cfg.steps and pending() is None:
        t0 = time.perf_counter()
        # Up to the next step logged, evaluated or checkpointed after, or fewer.
        boundary = min(sinks.next_logged(first), (first // every + 1) * every - 1)
        step = stepper.last_of_call(first, min(boundary, first + per_call - 1))
        state, metrics = stepper.take(state, first, step)
        jax.tree.map(lambda a: a.block_until_ready(), metrics)  # one call in flight
        seconds = (time.perf_counter() - t0) / (step - first + 1)
        per_call = max(1, min(2 * (step - first + 1), int(_CALL_SECONDS / seconds)))
        # The last step's evaluation is the run's own, after the loop.
        evaluate = sinks.should_eval(step) and step < cfg.steps - 1
        if sinks.should_log(step) or evaluate:
            metrics = stepper.with_monitors(metrics, state, step)
            row = flat_metrics(recipe.table, jax.device_get(metrics))
            if (diverged := divergence(step, row)) is not None:
                raise Diverged(diverged)
            if evaluate:
                row |= {f"eval/{k}": v for k, v in evaluation(state, run_dir).items()}
            sinks.log(step, row)
        sinks.advance(step - first + 1)
        first = step + 1
        if first % every == 0 or first == cfg.steps:
            saved = _save(checkpoints, first, state)
    if first < cfg.steps and saved != first:  # stopped
        _save(checkpoints, first, state)  # `resume` continues from here exactly
    return state


def _stop_if(pending: Pending) -> None:
    """Raise the stop a signal requested while it was deferred."""
    if (stop := pending()) is not None:
        raise stop


def _save(checkpoints: Checkpoints, step: int, state: TrainState) -> int:
    """Start the checkpoint of `step`, of a finite state only (a resume never starts from a
    diverged one); returns `step`."""
    floats = [x for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.inexact)]
    if any(jax.device_get(_non_finite_counts(floats))):
        raise Diverged(
            f"training diverged before step {step}: the train state holds a NaN or an infinity, "
            "expected finite values (lower the learning rate)"
        )
    checkpoints.save(step, state)
    return step


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
    run_dir = Path(out) if out is not None else Path("runs") / config.name
    kind = kind_of(config.target, own)  # a factory's target is built here, once
    if own is not None and not isinstance(config.target, FactoryConfig):
        # Recorded as a target given in Python: pd.load asks for it again.
        config = dataclasses.replace(config, target=FactoryConfig())
    recipe = make_recipe(config, kind)  # validates the site specs before anything is written
    if config.distributed.coordinator:  # before anything starts a jax backend
        d = config.distributed
        initialize_distributed(d.coordinator, d.num_processes, d.process_id)
    mesh = make_mesh_of(config)
    try:
        # Divisibility and the token file are checked before anything is written or compiled.
        shardings = None if mesh is None else state_shardings(recipe, mesh)
        kind.check_inputs()
    except (ShardingError, DataError) as err:
        raise ConfigError(str(err)) from None
    check_wandb_login(config.train.wandb)
    check_destination(run_dir, overwrite, resume)
    if resume:
        _check_same_config(partial_dir(run_dir) / "config.json", config)
    if config.compile.cache_dir:
        set_option: Callable[[str, object], None] = jax.config.update  # unannotated upstream
        set_option("jax_compilation_cache_dir", config.compile.cache_dir)
        set_option("jax_persistent_cache_min_compile_time_secs", config.compile.min_compile_secs)
    init_key, src_key, run_key = key_tree(config.seed)
    sample = None  # on a mesh, batches are placed from the host
    if kind.sampler is not None and mesh is None:
        sample = kind.sampler(recipe.target, config.train.batch)
    t0 = time.perf_counter()
    with recording() as compile_times, Ahead(recipe, run_key, mesh, sample) as ahead:
        # While the target trains or loads: the state's initializer, which does not read the
        # target, and a step program that draws its batches, which reads only the target's
        # shapes (single-device runs; on a mesh, a background computation could order
        # collectives unlike another host's).
        early = mesh is None and not resume
        fresh = ahead.initialize(init_key, src_key) if early else None
        if early and sample is not None and kind.frozen_shapes is not None:
            ahead.start(kind.frozen_shapes(recipe.target), None, restored=False)
        try:  # a bad checkpoint stops the run before any folder is made
            trained = kind.load_frozen(recipe.target)
        except CheckpointError as err:
            raise ConfigError(str(err)) from None
        log.info("target ready (%s)", trained.describe())
        _check_finite(trained.params)
        try:
            with staged(run_dir, overwrite, resume) as tmp_dir:
                write_config(tmp_dir, config)
                frozen = trained.params
                if mesh is not None:
                    frozen = jax.device_put(frozen, frozen_shardings(recipe.target, frozen, mesh))
                batches = make_batches(config, recipe, run_key, mesh, kind=kind)
                eval_batches = make_batches(config, recipe, run_key, mesh, True, kind)
                evaluation = _evaluation(config, recipe, kind, frozen, eval_batches, run_key)
                keep, intact = config.train.keep_checkpoints, partial(check_intact, tmp_dir)
                with Checkpoints(tmp_dir / CHECKPOINTS, keep, intact) as checkpoints:
                    if not ahead.started:  # compiles while the state is restored or made
                        ahead.start(frozen, batches, restored=bool(checkpoint_steps(tmp_dir)))
                    with deferred() as pending:  # a signal does not cut a restore
                        like = abstract_state(recipe, mesh)
                        restored = checkpoints.restore_latest(like) if resume else None
                    _stop_if(pending)
                    if restored is not None:
                        state = restored
                    elif fresh is not None:
                        state = _warmed_up(recipe, fresh.result(), frozen)
                    else:
                        made = init_train_state(recipe, init_key, src_key, mesh)
                        state = _warmed_up(recipe, made, frozen)
                    # A failed allocation (out of memory) raises here; jax 0.10.2 on a CPU would
                    # wait forever reading a value (`int(state.step)`) of a computation that failed.
                    for leaf in jax.tree.leaves(state):
                        leaf.block_until_ready()
                    ahead.wait()
                    stepper = _stepper(recipe, config, frozen, run_key, shardings, batches, sample)
                    with (
                        metric_sinks(tmp_dir, config, int(state.step)) as sinks,
                        deferred() as pending,
                        checkpoints,  # closed before the signals are handled again
                    ):  # nor a step, nor a checkpoint's write
                        state = _train(
                            recipe, state, stepper, checkpoints, sinks, evaluation, tmp_dir, pending
                        )
                    _stop_if(pending)
                summary = write_results(tmp_dir, state, trained, evaluation, t0)
                compile_times.write(tmp_dir / "compile.json")
        except Diverged as err:  # a rerun starts over; the last finite checkpoint is kept aside
            aside = set_aside(run_dir)
            if aside is None:
                raise
            steps = checkpoint_steps(aside)
            last = f"its last finite checkpoint (step {steps[-1]})" if steps else "its folder"
            raise Diverged(f"{err}; {last} is set aside in '{aside}'") from None
    return RunResult(run_dir, config, summary, compile_times, state, frozen, recipe, kind)


def _stepper(
    recipe: Recipe,
    config: RunConfig,
    frozen: hk.Params,
    run_key: jax.Array,
    shardings: TrainState | None,
    batches: Callable[[int], Batch],
    sample: Sampler | None,
) -> Stepper:
    """A run's programs: n steps that draw their batches (with `sample`), or one step a call on
    the host's batches, with the monitors on logged steps."""
    steps = config.train.steps
    if sample is not None:
        return Stepper(frozen, run_key, steps, steps=make_train_steps(recipe, sample))
    step, monitors = make_train_step(recipe, shardings), make_monitor_step(recipe)
    return Stepper(frozen, run_key, steps, step=step, monitors=monitors, batches=batches)


def _evaluation(
    config: RunConfig,
    recipe: Recipe,
    kind: TargetKind,
    frozen: hk.Params,
    eval_batches: Callable[[int], Batch],
    run_key: jax.Array,
) -> Evaluation:
    """The run's evaluation: its summary, with the figures drawn into the folder given."""

    def evaluation(state: TrainState, folder: Path) -> dict[str, float]:
        def evaluate() -> dict[str, float]:
            return kind.evaluate(recipe, state, frozen, eval_batches, run_key, config.eval)

        if not config.eval.figures:
            return evaluate()
        # The figures (mostly Python) on a thread beside the evaluation (mostly XLA). Their
        # batch drawn on this thread: a caller's need not be thread-safe.
        x = figure_batch(recipe, eval_batches)
        with ThreadPoolExecutor(1, thread_name_prefix="pd-figures") as pool:
            drawn = pool.submit(_draw, recipe, state, frozen, x, folder, kind)
            summary = evaluate()
        drawn.result()  # raises what drawing raised
        return summary

    return evaluation


def write_results(
    folder: Path,
    state: TrainState,
    trained: TrainedTarget,
    evaluation: Evaluation,
    t0: float,
) -> dict[str, float]:
    """What a trained run leaves in its folder: `decomposition.npz`, the frozen target
    (`frozen.*`), the evaluation's figures and `summary.json` (with the target's training and
    the seconds since `t0`); returns the summary."""
    checkpoint.save(folder / "decomposition.npz", (state.components, state.ci_params))
    checkpoint.save_frozen(folder / "frozen.npz", trained.params)
    summary = evaluation(state, folder)
    summary["target/attempt"] = float(trained.attempt)
    if math.isfinite(trained.loss):  # a loaded checkpoint has no training loss
        summary["target/loss"] = trained.loss
    summary["time/total_s"] = time.perf_counter() - t0
    summary_json = json.dumps(summary, indent=2, sort_keys=True, allow_nan=False)
    (folder / "summary.json").write_text(summary_json)
    return summary


def _draw(
    recipe: Recipe,
    state: TrainState,
    frozen: hk.Params,
    x: Batch | None,
    folder: Path,
    kind: TargetKind,
) -> None:
    """The run's figures into `folder` (`pd.train.figures`, matplotlib imported here)."""
    from pd.train.figures import write_figures

    write_figures(recipe, state, frozen, x, folder, kind.labels, kind.known(recipe.target))


def _warmed_up(recipe: Recipe, state: TrainState, frozen: hk.Params) -> TrainState:
    """The state at step 0: the initialized one after the components' faithfulness warmup."""
    if recipe.train.faith_warmup_steps > 0:
        state = state._replace(components=faith_warmup(recipe, state.components, frozen))
    return state


@jax.jit
def _non_finite_counts(ws: list[jax.Array]) -> list[jax.Array]:
    """How many entries of each array are NaN or infinite (one pass each, no copies)."""
    return [jnp.sum(~jnp.isfinite(w)) for w in ws]


def _check_finite(params: hk.Params) -> None:
    """Refuse frozen weights that hold a NaN or an infinity, with one sentence naming the
    first such parameter; one jitted reduction over them and one small `device_get`."""
    leaves = [
        (jax.tree_util.keystr(path, simple=True, separator="/"), w)
        for path, w in jax.tree_util.tree_leaves_with_path(params)
        if jnp.issubdtype(jnp.result_type(w), jnp.inexact)
    ]
    counts = jax.device_get(_non_finite_counts([w for _, w in leaves]))
    found = [(name, w, int(n)) for (name, w), n in zip(leaves, counts, strict=True) if n]
    if found:
        name, w, bad = found[0]
        nans = int(jnp.isnan(w).sum())
        what = " and ".join(
            f"{n} {kind}" for n, kind in ((nans, "NaN"), (bad - nans, "infinite")) if n
        )
        more = len(found) - 1
        others = f" (and {more} more parameter{'s' * (more > 1)})" if more else ""
        raise Diverged(
            f"the target's weight '{name}' has {what} of its {jnp.size(w)} entries{others}, "
            "expected finite weights (the target diverged or its checkpoint is damaged)"
        )


def _first_difference(before: object, now: object, path: str) -> tuple[str, object, object] | None:
    """The first dotted key where two parsed configs differ, with both values."""
    if isinstance(before, dict) and isinstance(now, dict):
        for key in sorted(set(before) | set(now)):
            found = _first_difference(before.get(key), now.get(key), f"{path}.{key}".strip("."))
            if found is not None:
                return found
        return None
    return None if before == now else (path, before, now)


def _check_same_config(path: Path, config: RunConfig) -> None:
    """A resumed run continues the config it was started with; only where it runs may change."""
    free = ("mesh", "distributed", "compile")
    try:
        recorded = json.loads(path.read_text())
        if not isinstance(recorded, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as err:
        why = "is missing" if isinstance(err, FileNotFoundError) else f"is unreadable ({err})"
        raise ConfigError(
            f"the interrupted run's config '{path}' {why}, expected the config.json it was "
            "started with (start over with --overwrite)"
        ) from None
    before = {k: v for k, v in recorded.items() if k not in free}
    now = json.loads(json.dumps(dataclasses.asdict(config)))
    now = {k: v for k, v in now.items() if k not in free}
    found = _first_difference(before, now, "")
    if found is not None:
        key, old, value = found
        raise ConfigError(
            f"config key '{key}' is {value!r}, but the interrupted run had {old!r}, expected "
            "the same config to resume it"
        )


def summary_table(summary: dict[str, float]) -> str:
    """The console table: one row per metric family, one column per site."""
    rows: dict[str, dict[str, float]] = {}
    for key, value in summary.items():
        family, _, site = key.partition("/")
        rows.setdefault(family, {})[site] = value
    lines = []
    width = max(len(f) for f in rows)
    for family, cells in sorted(rows.items()):
        text = "  ".join(f"{site}={value:.4g}" for site, value in cells.items())
        lines.append(f"{family:<{width}}  {text}")
    return "\n".join(lines)


__all__ = [
    "Diverged",
    "OwnTarget",
    "RunResult",
    "make_batches",
    "make_recipe",
    "run",
    "summary_table",
]
