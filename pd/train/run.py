"""`run(config) -> RunResult`: target, init, warmup, the training loop, evaluation, run folder."""

import dataclasses
import json
import logging
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import haiku as hk
import jax
from tqdm import tqdm

from pd.ci import PerSiteCI
from pd.compile_times import CompileTimes, recording
from pd.init import key_tree
from pd.state import TrainState
from pd.targets.train import load_or_train
from pd.train import checkpoint
from pd.train.config import ConfigError, RunConfig
from pd.train.evaluate import evaluate, make_eval_step
from pd.train.step import (
    Recipe,
    batch_key,
    faith_warmup,
    init_train_state,
    make_sampler,
    make_train_step,
)

log = logging.getLogger(__name__)

EVAL_FOLD = (
    2**31 - 1
)  # the evaluation data key is fold_in(run_key, EVAL_FOLD); steps never get there


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


def make_recipe(config: RunConfig) -> Recipe:
    """The static structure of a run (no arrays, nothing compiled)."""
    target = config.target.build(config.C)
    ci_fn = PerSiteCI(target.table, config.ci_fn, config.ci_hidden)
    return Recipe(target, ci_fn, config.loss, config.train)


def prepare_run_dir(run_dir: Path, overwrite: bool) -> None:
    """Create the run folder; an existing one is refused unless `overwrite` (nothing is lost)."""
    if run_dir.exists() and not overwrite:
        raise ConfigError(
            f"run folder '{run_dir}' already exists, expected a new folder (or pass --overwrite)"
        )
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)


def _train(
    recipe: Recipe, state: TrainState, frozen: hk.Params, run_key: jax.Array, run_dir: Path
) -> TrainState:
    """The loop: one `device_get` per log interval, appended to metrics.jsonl.

    The monitors (SPEC §5) are not trained, so they are computed only on logged steps, by the
    evaluation step on that step's batch.
    """
    cfg = recipe.train
    train_step = make_train_step(recipe)
    eval_step = make_eval_step(recipe)
    sample = make_sampler(recipe.target, cfg.batch)
    bar = tqdm(total=cfg.steps, disable=not sys.stderr.isatty(), desc="train", unit="step")
    with (run_dir / "metrics.jsonl").open("w") as out:
        for step in range(cfg.steps):
            x = sample(run_key, state.step)
            state, metrics = train_step(state, frozen, x, run_key)
            if step % cfg.log_every == 0 or step == cfg.steps - 1:
                evaluated, _ = eval_step(state, frozen, x, batch_key(run_key, step))
                monitors = {k: v for k, v in evaluated.items() if k.startswith("monitor/")}
                row = {k: float(v) for k, v in jax.device_get({**metrics, **monitors}).items()}
                out.write(json.dumps({"step": step, **row}) + "\n")
                out.flush()  # readable while the run goes on
                bar.set_postfix(loss=f"{row['loss/total']:.3g}")
            bar.update(1)
    bar.close()
    return state


def run(config: RunConfig, out: Path | None = None, overwrite: bool = False) -> RunResult:
    """Decompose the configured target end to end and write the run folder."""
    run_dir = Path(out) if out is not None else Path("runs") / config.name
    recipe = make_recipe(config)  # validates the site specs before anything is written
    prepare_run_dir(run_dir, overwrite)
    (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(config), indent=2))
    if config.compile.cache_dir:
        set_option: Callable[[str, object], None] = jax.config.update  # unannotated upstream
        set_option("jax_compilation_cache_dir", config.compile.cache_dir)
        set_option("jax_persistent_cache_min_compile_time_secs", config.compile.min_compile_secs)
    t0 = time.perf_counter()
    with recording() as compile_times:
        trained = load_or_train(config.target, recipe.target)
        log.info(
            "target ready (attempt %d, loss %.3g, cached %s)",
            trained.attempt,
            trained.loss,
            trained.from_cache,
        )
        frozen = trained.params
        init_key, src_key, run_key = key_tree(config.seed)
        state = init_train_state(recipe, init_key, src_key)
        if config.train.faith_warmup_steps > 0:
            state = state._replace(components=faith_warmup(recipe, state.components, frozen))
        state = _train(recipe, state, frozen, run_key, run_dir)
        checkpoint.save(run_dir / "decomposition.npz", (state.components, state.ci_params))

        eval_key = jax.random.fold_in(run_key, EVAL_FOLD)
        summary = evaluate(
            recipe, state, frozen, eval_key, config.eval.n_samples, config.eval.batch
        )
    summary["target/attempt"] = float(trained.attempt)
    summary["target/loss"] = trained.loss
    summary["time/total_s"] = time.perf_counter() - t0
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    compile_times.write(run_dir / "compile.json")
    if config.eval.figures:
        from pd.train.figures import write_figures  # matplotlib is imported only when drawing

        write_figures(recipe, state.ci_params, state.components, frozen, run_dir)
    return RunResult(run_dir, config, summary, compile_times, state, frozen, recipe)


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


__all__ = ["RunResult", "make_recipe", "run", "summary_table"]
