"""What a finished run leaves in its folder and prints."""

import json
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import haiku as hk
from jaxtyping import Array, Key

from pd.state import TrainState
from pd.targets.base import Batch
from pd.targets.train import TrainedTarget
from pd.train import arrays
from pd.train.config import EvalConfig
from pd.train.folder import RunFolder
from pd.train.kinds import Batches, TargetKind
from pd.train.objective import Recipe
from pd.train.report import LAYERS_KEY, evaluation_markdown

# A run's evaluation: its summary, with the figures drawn into the folder given.
Evaluation = Callable[[TrainState, Path], dict[str, float]]


def evaluation(
    kind: TargetKind,
    recipe: Recipe,
    cfg: EvalConfig,
    frozen: hk.Params,
    eval_batches: Batches,
    run_key: Key[Array, ""],
) -> Evaluation:
    """The evaluation of a run (and of a sweep's member): the kind's summary and, with
    `cfg.figures`, the figures (mostly Python) drawn on a thread beside it (mostly XLA)."""

    def evaluate(state: TrainState, folder: Path) -> dict[str, float]:
        def summary() -> dict[str, float]:
            return kind.evaluate(recipe, state, frozen, eval_batches, run_key, cfg)

        if not cfg.figures:
            return summary()
        x = kind.figure_batch(eval_batches)  # on this thread: a caller's need not be thread-safe
        with ThreadPoolExecutor(1, thread_name_prefix="pd-figures") as pool:
            drawn = pool.submit(_draw, kind, recipe, state, frozen, x, folder)
            out = summary()
        drawn.result()  # raises what drawing raised
        if LAYERS_KEY in out:
            from pd.train.figures import layer_bars

            layer_bars(out, folder / "layers.png")
        return out

    return evaluate


def _draw(
    kind: TargetKind,
    recipe: Recipe,
    state: TrainState,
    frozen: hk.Params,
    x: Batch | None,
    folder: Path,
) -> None:
    """The figures into `folder` (`pd.train.figures`, matplotlib imported here)."""
    from pd.train.figures import write_figures

    write_figures(recipe, state, frozen, x, folder, kind.labels, kind.known(recipe.target))


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
    files = RunFolder(folder)
    arrays.save(files.decomposition, (state.components, state.ci_params))
    arrays.save_frozen(files.frozen, trained.params)
    summary = evaluation(state, folder)
    summary["target/attempt"] = float(trained.attempt)
    if math.isfinite(trained.loss):  # a loaded checkpoint has no training loss
        summary["target/loss"] = trained.loss
    summary["time/total_s"] = time.perf_counter() - t0
    summary_json = json.dumps(summary, indent=2, sort_keys=True, allow_nan=False)
    files.summary.write_text(summary_json)
    if tables := evaluation_markdown(summary):
        files.evaluation.write_text(tables)
    return summary


# A family of more sites or layers than this is shown as its range, in the console's summary
# and in a sweep's table.
WIDEST = 8


def summary_table(summary: dict[str, float], widest: int = WIDEST) -> str:
    """The console table: one row per metric family, one column per site (a family of more
    than `widest` sites or layers as its range), then the tables of `evaluation.md`."""
    rows: dict[str, dict[str, float]] = {}
    for key, value in summary.items():
        family, _, site = key.partition("/")
        rows.setdefault(family, {})[site] = value
    lines = []
    width = max(len(f) for f in rows)
    for family, cells in sorted(rows.items()):
        if len(cells) > widest:
            values = list(cells.values())
            text = f"{len(values)} values, min={min(values):.4g} max={max(values):.4g}"
        else:
            text = "  ".join(f"{site}={value:.4g}" for site, value in cells.items())
        lines.append(f"{family:<{width}}  {text}")
    tables = evaluation_markdown(summary)
    return "\n".join(lines) + (f"\n\n{tables}" if tables else "")
