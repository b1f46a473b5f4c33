"""Evaluation of a decomposition (SPEC §13): CI-L0, alive counts, CI errors, MMCS / ML2R."""

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, Key
from scipy.optimize import linear_sum_assignment

from pd.ci import CI, GroupParams
from pd.decompose import site_weights
from pd.sites import SiteTable
from pd.state import Components, TrainState
from pd.targets.base import Batch, Output, ToyTarget
from pd.train.config import EvalConfig
from pd.train.objective import CI_ACTIVE, Metrics, Recipe, evaluate_batch, flat_metrics
from pd.xla import compiler_options, one_per_value

ALIVE_THRESHOLD = CI_ACTIVE  # alive: CI above 0.1 on some evaluation sample (SPEC §13)


CIProgram = Callable[[GroupParams, Components, hk.Params, Batch], tuple[CI, Output]]


@one_per_value
def ci_program(recipe: Recipe) -> CIProgram:
    """Jitted `recipe.ci`, for the evaluation's probes and the figures."""
    fn: CIProgram = jax.jit(recipe.ci)
    return fn


def identity_ci_error(ci: np.ndarray, tol: float) -> int:
    """Entries off the best-matching diagonal above `tol` plus matched entries below `1 − tol`.

    `ci` is `[n_features, C]`; columns are permuted (Hungarian) to best match the diagonal.
    """
    rows, cols = linear_sum_assignment(ci, maximize=True)
    on_diagonal = np.zeros_like(ci, dtype=bool)
    on_diagonal[rows, cols] = True
    return int(np.sum(ci[~on_diagonal] > tol) + np.sum(ci[on_diagonal] < 1.0 - tol))


def dense_ci_error(ci: np.ndarray, k: int, tol: float) -> int:
    """The k most-used columns each need an entry `≥ 1 − tol`; every other column none `> tol`."""
    order = np.argsort(-ci.sum(axis=0), kind="stable")
    used, rest = order[:k], order[k:]
    return int(np.sum(ci[:, used].max(axis=0) < 1.0 - tol) + np.sum(ci[:, rest] > tol))


def mmcs_ml2r(
    W: np.ndarray, V: np.ndarray, U: np.ndarray, alive: np.ndarray
) -> tuple[float, float]:
    """Row j of `W [n, m]` against row j of each alive rank-1 piece `V[j, c] · U[c, :]`.

    MMCS: mean over j of the best cosine; ML2R: mean norm ratio of that best match to row j.
    Only alive subcomponents compete: a dead one keeps a tiny remnant whose direction can match
    a feature perfectly, which would make the norm ratio meaningless.
    """
    if not alive.any():
        return 0.0, 0.0
    V, U = V[:, alive], U[alive]
    pieces = V[:, :, None] * U[None, :, :]  # [n, C_alive, m]
    norms = np.linalg.norm(pieces, axis=-1)
    w_norm = np.linalg.norm(W, axis=-1)
    cos = np.einsum("ncm,nm->nc", pieces, W) / np.maximum(norms * w_norm[:, None], 1e-12)
    best = np.argmax(cos, axis=1)
    rows = np.arange(W.shape[0])
    return float(np.mean(cos[rows, best])), float(np.mean(norms[rows, best] / w_norm))


def site_max(lower: Float[Array, "_n *L _C"]) -> Float[Array, "_n _C"]:
    """Each site's max CI over all positions of a batch."""
    return jnp.max(lower.reshape(lower.shape[0], -1, lower.shape[-1]), axis=1)


EvalFn = Callable[
    [TrainState, hk.Params, Key[Array, ""], Int[Array, ""]],
    tuple[Metrics, tuple[Float[Array, "_n _C"], ...]],
]
EVAL_FOLD = 2**31 - 1  # evaluation data: from fold_in(run_key, EVAL_FOLD), or steps below it


@one_per_value
def make_eval_step(recipe: Recipe, target: ToyTarget, batch_size: int) -> EvalFn:
    """Jitted `eval_step(state, frozen, run_key, b)` of a toy: the loss terms on its evaluation
    batch `b`, and each site's max CI over the batch. The batch is drawn in the same program
    (one compile, not one more for the sampler and the keys) from the first of the two keys
    split from `fold_in(fold_in(run_key, EVAL_FOLD), b)`; the second is the step's. `target`
    is the recipe's, as the toy it is."""

    def eval_step(
        state: TrainState, frozen: hk.Params, run_key: Key[Array, ""], b: Int[Array, ""]
    ) -> tuple[Metrics, tuple[Float[Array, "_n _C"], ...]]:
        key = jax.random.fold_in(jax.random.fold_in(run_key, EVAL_FOLD), b)
        k_data, k_step = jax.random.split(key)
        x = target.sample(k_data, batch_size)
        metrics, ci = evaluate_batch(recipe, state, frozen, x, k_step)  # CI computed once
        return metrics, tuple(site_max(lower) for lower in ci.lower)

    fn: EvalFn = jax.jit(eval_step, compiler_options=compiler_options(recipe.ci_fn))
    return fn


@dataclass(frozen=True)
class KnownAnswer:
    """What a target's decomposition should find (SPEC §13), for targets that know it: on a
    one-hot probe of each of `n_features` input features, each site needs one subcomponent per
    feature (identity CI error) except `dense_sites`, which need `k` always-on ones (dense CI
    error); in `feature_sites`, row j of W is feature j's direction (MMCS / ML2R)."""

    n_features: int
    dense_sites: Mapping[str, int] = field(default_factory=dict)
    feature_sites: tuple[str, ...] = ()


def toy_answer(target: ToyTarget) -> KnownAnswer:
    return KnownAnswer(target.n_features, target.dense_sites, target.feature_sites)


def probe_ci(
    recipe: Recipe,
    ci_params: GroupParams,
    comps: Components,
    frozen: hk.Params,
    n_features: int,
) -> dict[str, np.ndarray]:
    """`{site: [n_features, C]}` CI of each one-hot feature input with value 0.75."""
    probes = jnp.asarray(0.75 * np.eye(n_features, dtype=np.float32))  # a transfer, no op
    ci, _ = ci_program(recipe)(ci_params, comps, frozen, probes)
    return recipe.table.views(jax.device_get(ci.lower))


def known_answer_metrics(
    recipe: Recipe,
    state: TrainState,
    frozen: hk.Params,
    site_max: Mapping[str, np.ndarray],
    known: KnownAnswer,
) -> dict[str, float]:
    """The CI errors on one-hot probes, and MMCS / ML2R of the feature sites (SPEC §13);
    `site_max` is each site's max CI over the evaluation data (who is alive)."""
    summary: dict[str, float] = {}
    probes = probe_ci(recipe, state.ci_params, state.components, frozen, known.n_features)
    for name, ci in probes.items():
        k = known.dense_sites.get(name)
        for tol in (0.1, 0.2):
            if k is None:
                summary[f"identity_ci_error_{tol}/{name}"] = float(identity_ci_error(ci, tol))
            else:
                summary[f"dense_ci_error_{tol}/{name}"] = float(dense_ci_error(ci, k, tol))
    W, V, U = host_site_arrays(recipe, state.components, frozen)
    for name in known.feature_sites:
        alive = site_max[name] > ALIVE_THRESHOLD
        summary[f"mmcs/{name}"], summary[f"ml2r/{name}"] = mmcs_ml2r(
            W[name], V[name], U[name], alive
        )
    return summary


SiteArrays = dict[str, Float[np.ndarray, "_d_in _d_out"]]


def host_site_arrays(
    recipe: Recipe, comps: Components, frozen: hk.Params
) -> tuple[SiteArrays, SiteArrays, SiteArrays]:
    """Each site's frozen weight W and its components V and U on the host, fetched in one
    transfer: slicing host arrays per site runs no device op (each would be a compile)."""
    W, V, U = jax.device_get((recipe.target.weights(frozen), comps.V, comps.U))
    table = recipe.table
    return site_weights(table, W), table.views(V), table.views(U)


def accumulate(
    table: SiteTable, results: Iterable[tuple[dict[str, np.ndarray], tuple[np.ndarray, ...]]]
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Every metric's mean over the evaluation batches, `alive/{site}` (SPEC §13), and each
    site's max CI per subcomponent, from the `(metrics, max CI per group)` of each batch."""
    sums: dict[str, float] = {}
    ci_max = [np.zeros((len(g.names), g.C)) for g in table.groups]
    n_batches = 0
    for metrics, maxes in results:
        for name, value in flat_metrics(table, metrics).items():
            sums[name] = sums.get(name, 0.0) + value
        ci_max = [np.maximum(a, m) for a, m in zip(ci_max, maxes, strict=True)]
        n_batches += 1
    sums = {name: total / n_batches for name, total in sums.items()}
    site_max = table.views(tuple(ci_max))
    for name, mx in site_max.items():
        sums[f"alive/{name}"] = float(np.sum(mx > ALIVE_THRESHOLD))
    return sums, site_max


def evaluate_toy(
    recipe: Recipe,
    target: ToyTarget,
    state: TrainState,
    frozen: hk.Params,
    run_key: Key[Array, ""],
    cfg: EvalConfig,
) -> dict[str, float]:
    """The flat summary of SPEC §13 for a decomposition of the toy `target` (the recipe's), on
    `n_samples` fresh samples drawn from the evaluation key."""
    table, batch = recipe.table, cfg.batch
    eval_step = make_eval_step(recipe, target, batch)
    n_batches = max(1, -(-cfg.n_samples // batch))

    def results() -> Iterator[tuple[dict[str, np.ndarray], tuple[np.ndarray, ...]]]:
        for b in range(n_batches):
            index = jnp.asarray(b, jnp.int32)
            yield jax.device_get(eval_step(state, frozen, run_key, index))

    means, site_max = accumulate(table, results())
    keep = ("loss/", "monitor/", "ci_l0/", "alive/")
    summary = {k: v for k, v in means.items() if k.startswith(keep)}
    summary["eval/n_samples"] = float(n_batches * batch)
    summary.update(known_answer_metrics(recipe, state, frozen, site_max, toy_answer(target)))
    return summary
