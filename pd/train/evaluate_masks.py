"""Evaluation of any target's decomposition (SPEC §13): the divergence of the masked model from
the clean one (KL for language models, MSE otherwise) under CI-valued, rounded (CI > 0 and
CI > 0.5), unmasked, stochastic, zero, persistent adversarial and fresh adversarial masks, and
for language models the cross-entropy of each; CI-L0 and alive counts per site and per layer."""

from collections.abc import Callable

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, Key

from pd import loops
from pd.adversary import SourceAdam, Sources, ascend, init_source_adam, init_sources
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
from pd.train.objective import Metrics, PassInputs, Recipe, adversarial_recon, ci_l0
from pd.train.report import per_layer
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

        def rounded(above: float) -> PassInputs:
            return inp._replace(ci_lower=tuple((c > above).astype(c.dtype) for c in ci.lower))

        outputs: dict[str, Output] = {
            "ci_masked": recipe.all_live_output(inp, Constant(0.0)),
            "rounded_0": recipe.all_live_output(rounded(0.0), Constant(0.0)),
            "rounded_0.5": recipe.all_live_output(rounded(0.5), Constant(0.0)),
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


PgdFn = Callable[[TrainState, hk.Params, Batch, Key[Array, ""]], Metrics]


@one_per_value
def make_pgd_eval(recipe: Recipe, steps: tuple[int, ...], lr: float) -> PgdFn:
    """Jitted: the divergence under a fresh adversarial mask (S1 masks from sources of their
    own per example, and per position for token batches, drawn `U[0, 1)`) after each count of
    `steps` Adam ascents of that divergence, with the sources projected onto [0, 1] (S15)."""
    div = recipe.target.divergence

    def pgd(state: TrainState, frozen: hk.Params, x: Batch, key: Key[Array, ""]) -> Metrics:
        _, inp = recipe.pass_inputs(state.ci_params, state.components, frozen, x)
        scope = x.shape if jnp.issubdtype(x.dtype, jnp.integer) else x.shape[:-1]
        sources = init_sources(key, 0, recipe.table, scope)

        def value(s: Sources) -> Float[Array, ""]:
            return adversarial_recon(recipe, inp, s)

        def ascent(
            carry: tuple[Sources, SourceAdam], _: None
        ) -> tuple[tuple[Sources, SourceAdam], Float[Array, ""]]:
            d, g = jax.value_and_grad(value)(carry[0])
            return ascend(*carry, g, jnp.float32(lr), 0.9, 0.999, 1e-8), d

        (last, _), before = loops.scan(
            ascent, (sources, init_source_adam(sources)), None, max(steps)
        )
        values = jnp.append(before, value(last))  # values[n]: after n ascents
        return {f"{div}/pgd_{n}": values[n] for n in steps}

    fn: PgdFn = jax.jit(pgd, compiler_options=compiler_options(recipe.ci_fn))
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
    if cfg.pgd_steps:
        pgd = make_pgd_eval(recipe, cfg.pgd_steps, cfg.pgd_lr)
        pgd_key = jax.random.fold_in(key, EVAL_FOLD)  # batches' keys count up from 0
        n_pgd = min(n_batches, max(1, -(-cfg.pgd_samples // cfg.batch)))
        rows = [
            jax.device_get(
                pgd(state, frozen, batches(EVAL_FOLD - b), jax.random.fold_in(pgd_key, b))
            )
            for b in range(n_pgd)
        ]
        summary.update({k: float(np.mean([r[k] for r in rows])) for k in rows[0]})
    summary.update(per_layer(summary, recipe.table))
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
