"""What a decomposition optimizes: its recipe (target, CI function, losses, schedules), the
loss terms of a step and their gradients (SPEC §5–§7), and what an evaluation logs of them.

The terms made of masked forwards are rows of static arrays mapped over one at a time
(`pd.loops`), so the programs that use them do not grow with depth or with the number of sites.
"""

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, Key

from pd import loops
from pd.adversary import Sources
from pd.ci import CI, CIFunction, GroupParams, Inner
from pd.decompose import (
    CleanProducts,
    Constant,
    Draw,
    LayerSites,
    Persistent,
    SiteGrads,
    Sites,
    SourceMode,
    decomposed_hook,
    layer_grads,
    layer_sites,
)
from pd.losses import (
    faithfulness,
    importance_terms,
    kl,
    mse,
    plan_arrays,
    recon_plan,
    uniform_k_routing,
)
from pd.precision import compute
from pd.sites import SiteTable, output_tap
from pd.state import Components, TrainState
from pd.targets.base import Batch, Output, Taps, Target
from pd.train.config import LossConfig, ReconTerm, TrainConfig
from pd.train.schedule import schedule_value

# Scalars, plus `ci_l0`: one value per site in `SiteTable.group_order` (see `flat_metrics`).
Metrics = dict[str, Float[Array, "..."]]
CILower = tuple[Float[Array, "_n B ... _C"], ...]
CI_ACTIVE = 0.1  # CI-L0 counts subcomponents with ci_lower above this (SPEC §13)


class PassInputs(NamedTuple):
    """What every masked forward on one batch reads: the frozen target, the batch, the
    components, the CI (masks only), the clean output it is compared with, the clean taps
    (a target resumes from them after its frozen leading layers) and, where the step has them,
    the clean products that a site with a clean input reuses."""

    frozen: hk.Params
    x: Batch
    comps: Components
    ci_lower: CILower
    clean: Output
    taps: Taps
    products: CleanProducts | None = None


@dataclass(frozen=True)
class Recipe:
    """Static structure of one decomposition: target, CI function, losses and schedules.

    `seq_len` is the sequence length of language-model batches (0 for toys); it fixes the shape
    of sequence-scoped adversarial sources.
    """

    target: Target
    ci_fn: CIFunction
    loss: LossConfig
    train: TrainConfig
    seq_len: int = 0

    @property
    def table(self) -> SiteTable:
        return self.target.table

    def ci(
        self, ci_params: GroupParams, comps: Components, frozen: hk.Params, x: Batch
    ) -> tuple[CI, Output]:
        """`(CI, clean output)`: the CI function reads the clean-path taps (S4)."""
        ci, inp = self.pass_inputs(ci_params, comps, frozen, x)
        return ci, inp.clean

    def pass_inputs(
        self, ci_params: GroupParams, comps: Components, frozen: hk.Params, x: Batch
    ) -> tuple[CI, PassInputs]:
        """The CI and what the masked forwards on `x` read, without gradients (the step takes
        the same three vjps itself)."""
        taps, clean = self.target.taps(frozen, x)
        inner = self.ci_fn.inner(taps, comps.V)
        ci = self.ci_fn.ci(ci_params, taps, inner)
        products = self.products(taps, inner)
        return ci, PassInputs(frozen, x, comps, ci.lower, clean, taps, products)

    def products(self, taps: Taps, inner: Inner | None) -> CleanProducts | None:
        """The clean products, where the CI function reads the inner activations (`inner`); their
        `x @ W` where the target taps its sites' outputs."""
        if inner is None:
            return None
        if not all(output_tap(k) in taps for k in self.table.kinds):
            return CleanProducts(inner, None)
        return CleanProducts(
            inner, self.table.from_kinds({k: taps[output_tap(k)] for k in self.table.kinds})
        )

    def forward(self, inp: PassInputs, sites: Sites) -> Output:
        """The target's output with `sites`, resumed from the clean taps."""
        return self.target.resume(inp.frozen, inp.x, inp.taps, sites)

    def divergence(self, masked: Output, clean: Output) -> Float[Array, ""]:
        """D(masked, clean): MSE for toys, KL(clean ‖ masked) for language models (SPEC §5)."""
        return kl(masked, clean) if self.target.divergence == "kl" else mse(masked, clean)

    def all_live_output(
        self,
        inp: PassInputs,
        mode: SourceMode,
        sources: Sources | None = None,
        into: "Diff | None" = None,
    ) -> Output:
        """The output with every site live and routed everywhere, S1 masks from `mode`."""
        comps = inp.comps
        sites = layer_sites(
            self.table, comps.V, comps.U, inp.ci_lower, sources, products=inp.products
        )
        return self.forward(inp, Sites(decomposed_hook(mode), sites, self.into(into)))

    def into(self, grads: "Diff | None") -> dict[str, SiteGrads] | None:
        """A pass's running gradient as its sites lay it out (`Sites.into`)."""
        if grads is None:
            return None
        V, U = grads.comps
        return layer_grads(self.table, V, U, grads.lower, grads.sources, grads.inner)


class Diff(NamedTuple):
    """What the masked forwards are differentiated in: the components, this step's masking CI
    (its lower squashing: S6 gates the logits' gradient by the sign of the whole loss's gradient,
    summed over every pass), the clean products' inner activations, and the persistent sources
    where a term reads them (the adversarial term; None elsewhere). A loop over a term's forwards
    carries a gradient of this shape, so it holds nothing a pass cannot reach: no CI logits or
    upper squashing, no frozen products, no sources outside the adversarial term."""

    comps: Components
    lower: CILower
    inner: Inner | None
    sources: Sources | None = None


Row = tuple[Int[Array, " n"], Int[Array, " n"]]  # (plan entry, mask draw) per masked forward
# One masked forward's divergence: of `Diff`, at a row `(plan entry, mask draw)`, given the
# running gradient where the target adds into it (`Sites.into`), else None.
PassForward = Callable[[Diff, tuple[Int[Array, ""], Int[Array, ""]], Diff | None], Float[Array, ""]]


@dataclass(frozen=True)
class PassTerm:
    """A loss term of masked forwards: `mean_j forward(diff, rows[j])`, one forward per row,
    weighted by `coeff` in the total and logged as `name`."""

    name: str
    coeff: float
    forward: PassForward
    rows: Row
    reads_sources: bool = False


def with_diff(inp: PassInputs, diff: Diff) -> PassInputs:
    """`inp` reading the components, CI and clean inner activations of `diff`."""
    products = inp.products
    if products is not None and diff.inner is not None:
        products = products._replace(inner=diff.inner)
    return inp._replace(comps=diff.comps, ci_lower=diff.lower, products=products)


def stochastic_recon(
    recipe: Recipe, inp: PassInputs, key: Key[Array, ""], term: ReconTerm
) -> PassTerm:
    """S10/S11: the divergence of every forward of the plan, fresh sources each.

    Entry j, draw d is one row; its sources and routes come from `fold_in(fold_in(key, j), d)`
    split into (source, route) (SPEC §9).
    """
    table = recipe.table
    entries = recon_plan(term.plan, table, term.k)
    plan = plan_arrays(entries, table)
    routed = entries[0].routed  # one routing kind per plan
    width = max(len(e.live) for e in entries)
    leading = inp.ci_lower[0].shape[1:-1]
    n_draws = recipe.loss.n_mask_samples
    rows = np.arange(len(entries) * n_draws)

    def forward(
        diff: Diff, row: tuple[Int[Array, ""], Int[Array, ""]], into: Diff | None
    ) -> Float[Array, ""]:
        j, d = row
        src_key, route_key = jax.random.split(jax.random.fold_in(jax.random.fold_in(key, j), d))
        routes = uniform_k_routing(route_key, leading, width, plan.n_live[j]) if routed else None
        alone = plan.n_live[j] == 1  # every other site frozen: the live one's input is clean

        def entry(s: LayerSites, kind: str) -> LayerSites:
            live = s.live & plan.live[kind][j]
            return s._replace(live=live, column=plan.column[kind][j], clean=s.clean | alone & live)

        here = with_diff(inp, diff)
        base = layer_sites(table, here.comps.V, here.comps.U, here.ci_lower, products=here.products)
        sites = {kind: entry(s, kind) for kind, s in base.items()}
        hook = decomposed_hook(Draw(src_key), routes)
        out = recipe.forward(here, Sites(hook, sites, recipe.into(into)))
        return recipe.divergence(out, inp.clean)

    row_arrays = (jnp.asarray(rows // n_draws), jnp.asarray(rows % n_draws))
    return PassTerm(f"loss/{term.name}", term.coeff, forward, row_arrays)


def pass_terms(recipe: Recipe, inp: PassInputs, step_key: Key[Array, ""]) -> list[PassTerm]:
    """The loss terms made of masked forwards, in the order of the total: the reconstruction
    terms, the CI-masked term and the adversarial term (S12)."""
    cfg = recipe.loss
    terms = [  # a few differently-shaped terms, each one program
        stochastic_recon(recipe, inp, jax.random.fold_in(step_key, 1 + t), term)
        for t, term in enumerate(cfg.recon)
    ]
    one: Row = (jnp.zeros(1, jnp.int32), jnp.zeros(1, jnp.int32))
    if cfg.ci_masked > 0:
        masked = PassTerm(
            "loss/ci_masked",
            cfg.ci_masked,
            lambda d, _, into: monitor(recipe, with_diff(inp, d), 0.0, into),
            one,
        )
        terms.append(masked)
    if cfg.adversary.coeff > 0:

        def adversarial(
            d: Diff, _: tuple[Int[Array, ""], Int[Array, ""]], into: Diff | None
        ) -> Float[Array, ""]:
            assert d.sources is not None
            return adversarial_recon(recipe, with_diff(inp, d), d.sources, into)

        terms.append(PassTerm("loss/adversarial", cfg.adversary.coeff, adversarial, one, True))
    return terms


def adversarial_recon(
    recipe: Recipe, inp: PassInputs, sources: Sources, into: Diff | None = None
) -> Float[Array, ""]:
    """S12: masks from the persistent sources, broadcast over their scope."""
    out = recipe.all_live_output(inp, Persistent(), sources, into)
    return recipe.divergence(out, inp.clean)


def monitor(
    recipe: Recipe, inp: PassInputs, source: float, into: Diff | None = None
) -> Float[Array, ""]:
    """A constant source and no delta channel: 0 is CI-masked, 1 is unmasked (SPEC §5)."""
    return recipe.divergence(recipe.all_live_output(inp, Constant(source), None, into), inp.clean)


def ci_l0(lower: CILower) -> Float[Array, " n_sites"]:
    """SPEC §13 CI-L0: per site, the mean over positions of the number of subcomponents with
    CI above 0.1, in `SiteTable.group_order`."""
    counts = [
        jnp.mean(jnp.sum(lw > CI_ACTIVE, axis=-1).reshape(lw.shape[0], -1), axis=1) for lw in lower
    ]
    return jnp.concatenate(counts).astype(jnp.float32)


def flat_metrics(table: SiteTable, metrics: dict[str, np.ndarray]) -> dict[str, float]:
    """Host-side metrics by name: `ci_l0` becomes `ci_l0/{site}`."""
    flat = {k: float(v) for k, v in metrics.items() if k != "ci_l0"}
    if "ci_l0" in metrics:
        for name, value in zip(table.group_order, metrics["ci_l0"], strict=True):
            flat[f"ci_l0/{name}"] = float(value)
    return flat


def direct_losses(
    recipe: Recipe,
    comps: Components,
    upper: CILower,
    frozen: hk.Params,
    step: Int[Array, ""],
) -> tuple[Float[Array, ""], Metrics]:
    """The terms that run no masked forward (faithfulness, importance, frequency), weighted and
    summed, and each under its own name."""
    cfg = recipe.loss
    faith = faithfulness(recipe.table, recipe.target.weights(frozen), comps.V, comps.U)
    p = schedule_value(cfg.p, recipe.train.steps, step)
    lp, freq = importance_terms(upper, p, cfg.eps, cfg.reference_token_count)
    total = cfg.faithfulness * faith + cfg.importance * lp
    metrics: Metrics = {"loss/faithfulness": faith, "loss/importance": lp, "p": p}
    if cfg.frequency > 0:
        total = total + cfg.frequency * freq
        metrics["loss/frequency"] = freq
    return total, metrics


def _no_into(
    forward: PassForward, diff: Diff, row: tuple[Int[Array, ""], Int[Array, ""]]
) -> Float[Array, ""]:
    return forward(diff, row, None)


def _diff(diff: Diff, term: PassTerm) -> Diff:
    return diff if term.reads_sources else diff._replace(sources=None)


def losses(
    recipe: Recipe,
    diff: Diff,
    ci: CI,
    inp: PassInputs,
    step_key: Key[Array, ""],
    step: Int[Array, ""],
) -> tuple[Float[Array, ""], Metrics]:
    """The total loss given this step's CI and clean products, and every term under its own
    name (no gradient: what an evaluation logs)."""
    total, metrics = direct_losses(recipe, diff.comps, ci.upper, inp.frozen, step)
    for term in pass_terms(recipe, inp, step_key):
        d = _diff(diff, term)
        value = jnp.mean(loops.map_rows(partial(_no_into, term.forward, d), term.rows))
        total = total + term.coeff * value
        metrics[term.name] = value
    metrics["ci_l0"] = ci_l0(ci.lower)
    metrics["loss/total"] = total
    return total, metrics


def loss_grads(
    recipe: Recipe,
    diff: Diff,
    ci: CI,
    inp: PassInputs,
    step_key: Key[Array, ""],
    step: Int[Array, ""],
) -> tuple[Metrics, Diff, CI]:
    """`losses`' metrics and the total's gradient: in `diff`, and in the CI (its lower
    squashing's from `diff`, its upper's from the importance terms). Each masked forward takes
    its backward in its own loop iteration, into one running gradient (`loops.accumulate`): the
    step holds one forward's activations and one gradient at a time."""
    (total, metrics), (g_comps, g_upper) = jax.value_and_grad(
        lambda c, u: direct_losses(recipe, c, u, inp.frozen, step), argnums=(0, 1), has_aux=True
    )(diff.comps, ci.upper)
    zeros = partial(jax.tree.map, jnp.zeros_like)
    grads = Diff(g_comps, zeros(diff.lower), zeros(diff.inner))
    for term in pass_terms(recipe, inp, step_key):
        d = _diff(diff, term)
        into = grads._replace(sources=zeros(d.sources))
        value, grads = loops.accumulate(
            term.forward, d, term.rows, into, term.coeff, recipe.target.adds_into
        )
        total = total + term.coeff * value
        metrics[term.name] = value
    metrics["ci_l0"] = ci_l0(ci.lower)
    metrics["loss/total"] = total
    g_ci = CI(logits=zeros(ci.logits), lower=grads.lower, upper=g_upper)
    return metrics, grads, g_ci


def evaluate_batch(
    recipe: Recipe, state: TrainState, frozen: hk.Params, x: Batch, step_key: Key[Array, ""]
) -> tuple[Metrics, CI]:
    """The losses and monitors of `state` on a batch, and the CI they used (no gradient)."""
    comps = state.components
    with loops.unroll(recipe.train.unroll), compute(recipe.train.compute_dtype):  # trace time
        ci, inp = recipe.pass_inputs(state.ci_params, comps, frozen, x)
        inner = None if inp.products is None else inp.products.inner
        diff = Diff(comps, ci.lower, inner, state.sources)
        _, metrics = losses(recipe, diff, ci, inp, step_key, state.step)
        metrics |= monitors(recipe, inp)
    return metrics, ci


def monitors(recipe: Recipe, inp: PassInputs) -> Metrics:
    """SPEC §5's monitors: the CI-masked and the unmasked reconstruction."""
    return {
        "monitor/ci_masked_recon": monitor(recipe, inp, 0.0),
        "monitor/unmasked_recon": monitor(recipe, inp, 1.0),
    }


def state_monitors(recipe: Recipe, state: TrainState, frozen: hk.Params, x: Batch) -> Metrics:
    """The monitors of `state` on a batch, without the losses (no gradient)."""
    with loops.unroll(recipe.train.unroll), compute(recipe.train.compute_dtype):  # trace time
        _, inp = recipe.pass_inputs(state.ci_params, state.components, frozen, x)
        return monitors(recipe, inp)
