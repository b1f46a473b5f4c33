"""Evaluation of any target's decomposition (SPEC §13): the divergence of the masked model from
the clean one (KL for language models, MSE otherwise) under CI, unmasked, stochastic, zero and
adversarial masks, and for language models the cross-entropy of each; CI-L0 and alive counts."""

from collections.abc import Callable

import haiku as hk
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, Key

from pd.decompose import Constant, Draw, Persistent
from pd.state import TrainState
from pd.targets.base import Batch, Output
from pd.train.config import EvalConfig
from pd.train.evaluate import (
    EVAL_FOLD,
    KnownAnswer,
    accumulate,
    known_answer_metrics,
    site_max,
)
from pd.train.objective import Metrics, Recipe, ci_l0
from pd.xla import compiler_options, one_per_value

Tokens = Int[Array, "B T"]
MaskEvalFn = Callable[
    [TrainState, hk.Params, Batch, Key[Array, ""]],
    tuple[Metrics, tuple[Float[Array, "_n _C"], ...]],
]


def next_token_ce(logits: Float[Array, "B T V"], tokens: Tokens) -> Float[Array, ""]:
    """Mean cross-entropy of predicting token t + 1 from position t, in fp32."""
    log_q = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(log_q, tokens[:, 1:, None], axis=-1)
    return -jnp.mean(picked)


@one_per_value
def make_mask_eval_step(recipe: Recipe) -> MaskEvalFn:
    """Jitted `eval_step`: the divergence (and, for token batches, CE) per mask kind, CI-L0
    per site, each site's max CI."""
    div = recipe.target.divergence

    def eval_step(
        state: TrainState, frozen: hk.Params, x: Batch, key: Key[Array, ""]
    ) -> tuple[Metrics, tuple[Float[Array, "_n _C"], ...]]:
        ci, inp = recipe.pass_inputs(state.ci_params, state.components, frozen, x)
        no_ci = inp._replace(ci_lower=tuple(jnp.zeros_like(lower) for lower in ci.lower))
        outputs: dict[str, Output] = {
            "ci_masked": recipe.all_live_output(inp, Constant(0.0)),
            "unmasked": recipe.all_live_output(inp, Constant(1.0)),
            "stochastic": recipe.all_live_output(inp, Draw(key)),
            "zero_masked": recipe.all_live_output(no_ci, Constant(0.0)),
        }
        if state.sources:
            outputs["adversarial"] = recipe.all_live_output(inp, Persistent(), state.sources)
        metrics: Metrics = {"ci_l0": ci_l0(ci.lower)}
        lm = div == "kl" and jnp.issubdtype(x.dtype, jnp.integer)  # token batches
        if lm:
            metrics["ce/clean"] = next_token_ce(inp.clean, x)
        for kind, out in outputs.items():
            metrics[f"{div}/{kind}"] = recipe.divergence(out, inp.clean)
            if lm:
                metrics[f"ce/{kind}"] = next_token_ce(out, x)
        return metrics, tuple(site_max(lower) for lower in ci.lower)

    fn: MaskEvalFn = jax.jit(eval_step, compiler_options=compiler_options(recipe.ci_fn))
    return fn


def evaluate_masks(
    recipe: Recipe,
    state: TrainState,
    frozen: hk.Params,
    batches: Callable[[int], Batch],
    run_key: Key[Array, ""],
    cfg: EvalConfig,
    known: KnownAnswer | None = None,
) -> dict[str, float]:
    """The flat summary of a decomposition over the evaluation batches (steps counting down
    from EVAL_FOLD, which training never reaches), with the known-answer metrics where the
    target declares its answer (`known`)."""
    n_batches = max(1, -(-cfg.n_samples // cfg.batch))
    key = jax.random.fold_in(run_key, EVAL_FOLD)
    eval_step = make_mask_eval_step(recipe)
    results = (
        jax.device_get(eval_step(state, frozen, batches(EVAL_FOLD - b), jax.random.fold_in(key, b)))
        for b in range(n_batches)
    )
    summary, ci_max = accumulate(recipe.table, results)
    div = recipe.target.divergence
    zero = summary[f"{div}/zero_masked"]
    summary[f"{div}_ratio/ci_masked_vs_zero"] = summary[f"{div}/ci_masked"] / max(zero, 1e-12)
    # The acceptance bar of a language-model run: every site's mean CI-L0 below C / 4.
    summary["ci_l0_over_C/max_site"] = max(
        summary[f"ci_l0/{n}"] / recipe.table.spec(n).C for n in recipe.table.names
    )
    if known is not None:
        summary.update(known_answer_metrics(recipe, state, frozen, ci_max, known))
    return summary
