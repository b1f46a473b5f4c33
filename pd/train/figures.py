"""PNG figures of a run: CI on the one-hot probes, subcomponents, loss curves.

Drawn on matplotlib `Figure`s of their own, not through pyplot: the caller's backend (a
notebook's) is left as it was, and a run draws them on a thread beside its evaluation.
"""

import json
from pathlib import Path

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from pd.state import Components, TrainState
from pd.targets.base import Batch
from pd.train.evaluate import (
    ALIVE_THRESHOLD,
    KnownAnswer,
    ci_program,
    host_site_arrays,
    probe_ci,
)
from pd.train.folder import RunFolder
from pd.train.kinds import Labels
from pd.train.objective import Recipe
from pd.train.report import layers_of


def _ci_probes(
    recipe: Recipe, state: TrainState, frozen: hk.Params, known: KnownAnswer, path: Path
) -> None:
    """Per site, CI on each one-hot probe: the used subcomponents ordered by the feature they
    serve, each labelled with its index c in the site's `V[:, c]`."""
    comps = state.components
    probes = probe_ci(recipe, state.ci_params, comps, frozen, known.n_features)
    fig = Figure(figsize=(4 * len(probes), 3.5))
    axes = fig.subplots(1, len(probes), squeeze=False)
    for ax, (name, ci) in zip(axes[0], probes.items(), strict=True):
        used = np.flatnonzero(ci.max(axis=0) > ALIVE_THRESHOLD)
        order = used[np.argsort(np.argmax(ci[:, used], axis=0), kind="stable")]
        image = ax.imshow(ci[:, order], vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_title(f"{name}: {len(used)} of {ci.shape[1]} used")
        _label_subcomponents(ax, order)
        ax.set_xlabel("subcomponent c (CI > 0.1 on some probe)")
        ax.set_ylabel("one-hot feature (0.75)")
        fig.colorbar(image, ax=ax)
    fig.suptitle("causal importance on one-hot probes")
    _save(fig, path, len(probes), top=0.7, right=0.45)  # a colorbar's labels on the right


def _label_subcomponents(ax: Axes, shown: np.ndarray) -> None:
    """x ticks naming the subcomponents shown, when few enough to read."""
    if len(shown) <= 40:
        ax.set_xticks(range(len(shown)), [str(c) for c in shown], fontsize=5, rotation=90)


def _save(fig: Figure, path: Path, columns: int, top: float, right: float = 0.2) -> None:
    """Save with margins and gaps between `columns` fixed in inches, sized for a toy's labels.
    `tight_layout` measures every label before the drawing does: a toy run's three figures
    took 0.56–1.23 s with it and 0.38–0.56 s without (TMS 5-2, 40-10, 5-2-id and ResidMLP-1),
    and a sweep draws them for every member."""
    w, h = fig.get_size_inches()
    left, bottom, gap = 0.6, 0.6, 1.0
    width = (w - left - right - (columns - 1) * gap) / columns
    fig.subplots_adjust(
        left=left / w, right=1 - right / w, bottom=bottom / h, top=1 - top / h, wspace=gap / width
    )
    fig.savefig(path, dpi=110)


def _components(
    recipe: Recipe, comps: Components, frozen: hk.Params, known: KnownAnswer, path: Path
) -> None:
    """Rank-1 piece norms per site; for 2-d TMS hidden spaces, feature directions as arrows."""
    table = recipe.table
    weights, V, U = host_site_arrays(recipe, comps, frozen)
    arrows = [n for n in known.feature_sites if weights[n].shape[1] == 2]
    n_cols = len(table.names) + len(arrows)
    fig = Figure(figsize=(4 * n_cols, 3.5))
    axes = fig.subplots(1, n_cols, squeeze=False)
    for ax, name in zip(axes[0], table.names, strict=False):
        norms = np.linalg.norm(V[name], axis=0) * np.linalg.norm(U[name], axis=1)
        ax.bar(np.arange(norms.size), norms)
        ax.set_title(f"{name}: ‖V[:, c]‖·‖U[c, :]‖", fontsize=9)
        ax.set_xlabel("subcomponent")
    for ax, name in zip(axes[0][len(table.names) :], arrows, strict=True):
        W, v, u = weights[name], V[name], U[name]
        for j, row in enumerate(W):
            ax.arrow(0, 0, *row, color="black", width=0.01, length_includes_head=True)
            ax.annotate(f"f{j}", row * 1.08)
        pieces = v[:, :, None] * u[None, :, :]  # [n, C, 2]
        for j in range(W.shape[0]):
            c = int(np.argmax(np.linalg.norm(pieces[j], axis=-1)))
            ax.arrow(0, 0, *pieces[j, c], color="tab:red", width=0.005, alpha=0.7)
        ax.set_aspect("equal")
        ax.set_title(f"{name}: features (black),\nlargest subcomponent piece (red)", fontsize=9)
    _save(fig, path, n_cols, top=0.5)


def _losses(run_dir: Path, path: Path) -> None:
    """The losses and monitors logged so far; none before an evaluation at step 0, whose row
    is logged with its results (`train.eval_every`): then no figure until the next."""
    rows = [json.loads(line) for line in RunFolder(run_dir).metrics.read_text().splitlines()]
    if not rows:
        return
    keys = sorted(k for k in rows[0] if k.startswith(("loss/", "monitor/")))
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    steps = [r["step"] for r in rows]
    for key in keys:
        ax.plot(steps, [max(r[key], 1e-12) for r in rows], label=key)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.legend(fontsize=7)
    ax.set_title("losses")
    _save(fig, path, 1, top=0.35)


def _ci_over_rows(
    recipe: Recipe,
    state: TrainState,
    frozen: hk.Params,
    x: Batch,
    path: Path,
    labels: Labels | None,
) -> None:
    """Per-site CI of the first sequence of a token batch, or of the first 32 examples of any
    other batch: positions (the tokens, with `labels`) or examples down, used subcomponents
    across, labelled with their index c in the site's `V[:, c]`."""
    sequence = jnp.issubdtype(x.dtype, jnp.integer)  # token batches
    shown = x[:1] if sequence else x[:32]
    ci, _ = ci_program(recipe)(state.ci_params, state.components, frozen, shown)
    views = {
        n: v.reshape(-1, v.shape[-1])
        for n, v in recipe.table.views(jax.device_get(ci.lower)).items()
    }
    words = None if labels is None else [repr(w)[1:-1] for w in labels(np.asarray(x[0]).tolist())]
    if len(views) > MANY_SITES:
        _active_by_layer(recipe, views, words, sequence, path)
        return
    n = len(views)
    cols = min(n, 7 if words is None else 4)
    rows = -(-n // cols)
    size = (2.6, 2.6) if words is None else (4.2, 0.5 + 0.16 * len(words))
    fig = Figure(figsize=(size[0] * cols, size[1] * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, (name, ci_site) in zip(axes.flat, views.items(), strict=False):
        used = np.flatnonzero(ci_site.max(axis=0) > ALIVE_THRESHOLD)
        ax.imshow(ci_site[:, used], vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_title(f"{name}\n{len(used)} of {ci_site.shape[1]} used", fontsize=7)
        ax.set_xlabel("subcomponent c", fontsize=7)
        _label_subcomponents(ax, used)
        if words is None:
            ax.set_ylabel("position" if sequence else "example", fontsize=7)
        else:
            ax.set_yticks(range(len(words)), words, fontsize=6)
    fig.suptitle(f"causal importance over {'one sequence' if sequence else 'examples'}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


MANY_SITES = 28  # more sites than this: CI figures per kind over the layers, not per site


def _active_by_layer(
    recipe: Recipe,
    views: dict[str, np.ndarray],
    words: list[str] | None,
    sequence: bool,
    path: Path,
) -> None:
    """The CI figure of a target with many sites: one panel per kind, the number of its
    subcomponents with CI > 0.1 at each position (or example) down and each layer across."""
    table = recipe.table
    kinds = list(dict.fromkeys(table.spec(n).kind for n in table.names))
    layers = sorted({table.spec(n).layer for n in table.names})
    rows = next(iter(views.values())).shape[0]
    fig = Figure(figsize=(2.2 + 0.12 * len(layers), 0.8 + 0.16 * rows) if words else (3, 3))
    fig.set_figwidth(fig.get_figwidth() * len(kinds))
    axes = fig.subplots(1, len(kinds), squeeze=False)[0]
    for ax, kind in zip(axes, kinds, strict=True):
        grid = np.full((rows, len(layers)), np.nan)
        for name in table.names:
            spec = table.spec(name)
            if spec.kind == kind:
                grid[:, layers.index(spec.layer)] = np.sum(views[name] > ALIVE_THRESHOLD, axis=1)
        image = ax.imshow(grid, cmap="viridis", aspect="auto", interpolation="nearest")
        ax.set_title(f"{kind}: CI > {ALIVE_THRESHOLD} count", fontsize=8)
        ax.set_xticks(range(0, len(layers), 5), [str(v) for v in layers[::5]], fontsize=6)
        ax.set_xlabel("layer", fontsize=7)
        if words is not None:
            ax.set_yticks(range(len(words)), words, fontsize=5)
        else:
            ax.set_ylabel("position" if sequence else "example", fontsize=7)
        fig.colorbar(image, ax=ax, fraction=0.08)
    fig.suptitle(f"active subcomponents over {'one sequence' if sequence else 'examples'}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def layer_bars(summary: dict[str, float], path: Path) -> None:
    """`layers.png`: per layer, C, alive and CI-L0 (log scale) and CI-L0 / alive."""
    layers = layers_of(summary)
    fig = Figure(figsize=(max(6.0, 0.3 * len(layers) + 2), 6))
    top, bottom = fig.subplots(2, 1, sharex=True)
    x = np.arange(len(layers))
    for i, (family, label) in enumerate((("C", "C"), ("alive", "alive"), ("ci_l0", "CI-L0"))):
        values = [summary[f"layer_{family}/{layer}"] for layer in layers]
        top.bar(x + (i - 1) * 0.27, values, width=0.27, label=label)
    top.set_yscale("log")
    # Above the axes, where no layer's bars are: inside, the legend hid the last layer's.
    top.legend(fontsize=7, ncol=3, loc="lower right", bbox_to_anchor=(1.0, 1.0), frameon=False)
    top.set_title("subcomponents per layer (summed over its sites)", fontsize=9, loc="left")
    ratio = [100 * summary[f"layer_ci_l0_over_alive/{layer}"] for layer in layers]
    bottom.bar(x, ratio, color="tab:purple")
    bottom.set_ylabel("CI-L0 / alive (%)", fontsize=8)
    bottom.set_xticks(x, [str(v) for v in layers], fontsize=7)
    bottom.set_xlabel("layer")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_figures(
    recipe: Recipe,
    state: TrainState,
    frozen: hk.Params,
    x: Batch | None,
    run_dir: Path,
    labels: Labels | None = None,
    known: KnownAnswer | None = None,
) -> None:
    """With a known answer (toys): `ci_probes.png` and `components.png`; with an evaluation
    batch `x` (every target but pd's toys, `TargetKind.figure_batch`): `ci_sequence.png`, the CI
    over its first sequence, its tokens' text from `labels`, or over its first examples; all:
    `losses.png`, once a row is logged."""
    if x is not None:
        _ci_over_rows(recipe, state, frozen, x, run_dir / "ci_sequence.png", labels)
    if known is not None:
        _ci_probes(recipe, state, frozen, known, run_dir / "ci_probes.png")
        _components(recipe, state.components, frozen, known, run_dir / "components.png")
    _losses(run_dir, run_dir / "losses.png")
