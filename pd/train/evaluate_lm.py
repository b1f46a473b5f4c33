"""Evaluation of a language-model decomposition (SPEC §13): KL and CE of the masked model against
the clean one under CI, unmasked, stochastic, zero and adversarial masks; CI-L0 and alive counts."""

from collections.abc import Callable

import haiku as hk
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, Key

from pd.decompose import Constant, Draw, Persistent
from pd.losses import kl
from pd.state import TrainState
from pd.targets.base import Output
from pd.train.config import EvalConfig
from pd.train.evaluate import EVAL_FOLD, accumulate, site_max
from pd.train.step import Metrics, PassInputs, Recipe, ci_l0

Tokens = Int[Array, "B T"]
LMEvalFn = Callable[
    [TrainState, hk.Params, Tokens, Key[Array, ""]],
    tuple[Metrics, tuple[Float[Array, "_n _C"], ...]],
]


def next_token_ce(logits: Float[Array, "B T V"], tokens: Tokens) -> Float[Array, ""]:
    """Mean cross-entropy of predicting token t + 1 from position t, in fp32."""
    log_q = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(log_q, tokens[:, 1:, None], axis=-1)
    return -jnp.mean(picked)


def make_lm_eval_step(recipe: Recipe) -> LMEvalFn:
    """Jitted `eval_step`: KL / CE per mask kind, CI-L0 per site, each site's max CI."""

    def eval_step(
        state: TrainState, frozen: hk.Params, tokens: Tokens, key: Key[Array, ""]
    ) -> tuple[Metrics, tuple[Float[Array, "_n _C"], ...]]:
        comps = state.components
        taps, clean = recipe.target.taps(frozen, tokens)
        ci = recipe.ci_fn.ci(state.ci_params, taps, comps.V)
        inp = PassInputs(frozen, tokens, comps, ci.lower, clean, taps)
        no_ci = inp._replace(ci_lower=tuple(jnp.zeros_like(lower) for lower in ci.lower))
        outputs: dict[str, Output] = {
            "ci_masked": recipe.all_live_output(inp, Constant(0.0)),
            "unmasked": recipe.all_live_output(inp, Constant(1.0)),
            "stochastic": recipe.all_live_output(inp, Draw(key)),
            "zero_masked": recipe.all_live_output(no_ci, Constant(0.0)),
        }
        if state.sources:
            outputs["adversarial"] = recipe.all_live_output(inp, Persistent(), state.sources)
        metrics: Metrics = {"ce/clean": next_token_ce(clean, tokens), "ci_l0": ci_l0(ci.lower)}
        for kind, out in outputs.items():
            metrics[f"kl/{kind}"] = kl(out, clean)
            metrics[f"ce/{kind}"] = next_token_ce(out, tokens)
        return metrics, tuple(site_max(lower) for lower in ci.lower)

    fn: LMEvalFn = jax.jit(eval_step)
    return fn


def evaluate_lm(
    recipe: Recipe,
    state: TrainState,
    frozen: hk.Params,
    batches: Callable[[int], Tokens],
    run_key: Key[Array, ""],
    cfg: EvalConfig,
) -> dict[str, float]:
    """The flat summary of a language-model decomposition over the evaluation batches (steps
    counting down from EVAL_FOLD, which training never reaches)."""
    n_batches = max(1, -(-cfg.n_samples // cfg.batch))
    key = jax.random.fold_in(run_key, EVAL_FOLD)
    eval_step = make_lm_eval_step(recipe)
    results = (
        jax.device_get(eval_step(state, frozen, batches(EVAL_FOLD - b), jax.random.fold_in(key, b)))
        for b in range(n_batches)
    )
    summary, _ = accumulate(recipe.table, results)
    zero = summary["kl/zero_masked"]
    summary["kl_ratio/ci_masked_vs_zero"] = summary["kl/ci_masked"] / max(zero, 1e-12)
    # The acceptance bar of a language-model run: every site's mean CI-L0 below C / 4.
    summary["ci_l0_over_C/max_site"] = max(
        summary[f"ci_l0/{n}"] / recipe.table.spec(n).C for n in recipe.table.names
    )
    return summary
