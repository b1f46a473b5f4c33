"""The jitted training step (SPEC §7) and the faithfulness warmup (S21).

The step's program does not grow with depth or with the number of sites: the target runs its
layers as one scanned body, the entries and mask draws of a reconstruction plan are rows of
static arrays mapped over one at a time, and the adversary's warmup ascents are one loop
(`pd.loops`).
"""

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jaxtyping import Array, Float, Int, Key

from pd import loops
from pd.adversary import SourceAdam, Sources, ascend
from pd.ci import CI, CIFunction, GroupParams, Inner
from pd.decompose import (
    CleanProducts,
    Constant,
    Draw,
    LayerSites,
    Persistent,
    Sites,
    SourceMode,
    decomposed_hook,
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
from pd.shard import placement
from pd.sites import SiteTable, output_tap
from pd.state import Components, TrainState
from pd.targets.base import Batch, Output, Taps, Target, ToyTarget
from pd.train.config import LossConfig, ReconTerm, TrainConfig
from pd.train.optim import ci_optimizer, component_optimizer
from pd.train.schedule import schedule_value
from pd.xla import compiler_options, one_per_value

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
        self, inp: PassInputs, mode: SourceMode, sources: Sources | None = None
    ) -> Output:
        """The output with every site live and routed everywhere, S1 masks from `mode`."""
        comps = inp.comps
        sites = layer_sites(
            self.table, comps.V, comps.U, inp.ci_lower, sources, products=inp.products
        )
        return self.forward(inp, Sites(decomposed_hook(mode), sites))


CIProgram = Callable[[GroupParams, Components, hk.Params, Batch], tuple[CI, Output]]


@one_per_value
def ci_program(recipe: Recipe) -> CIProgram:
    """Jitted `recipe.ci`, for the evaluation's probes and the figures."""
    fn: CIProgram = jax.jit(recipe.ci)
    return fn


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


@dataclass(frozen=True)
class PassTerm:
    """A loss term of masked forwards: `mean_j forward(diff, rows[j])`, one forward per row,
    weighted by `coeff` in the total and logged as `name`."""

    name: str
    coeff: float
    forward: Callable[[Diff, tuple[Int[Array, ""], Int[Array, ""]]], Float[Array, ""]]
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

    def forward(diff: Diff, row: tuple[Int[Array, ""], Int[Array, ""]]) -> Float[Array, ""]:
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
        out = recipe.forward(here, Sites(decomposed_hook(Draw(src_key), routes), sites))
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
            lambda d, _: monitor(recipe, with_diff(inp, d), 0.0),
            one,
        )
        terms.append(masked)
    if cfg.adversary.coeff > 0:

        def adversarial(d: Diff, _: tuple[Int[Array, ""], Int[Array, ""]]) -> Float[Array, ""]:
            assert d.sources is not None
            return adversarial_recon(recipe, with_diff(inp, d), d.sources)

        terms.append(PassTerm("loss/adversarial", cfg.adversary.coeff, adversarial, one, True))
    return terms


def adversarial_recon(recipe: Recipe, inp: PassInputs, sources: Sources) -> Float[Array, ""]:
    """S12: masks from the persistent sources, broadcast over their scope."""
    return recipe.divergence(recipe.all_live_output(inp, Persistent(), sources), inp.clean)


def monitor(recipe: Recipe, inp: PassInputs, source: float) -> Float[Array, ""]:
    """A constant source and no delta channel: 0 is CI-masked, 1 is unmasked (SPEC §5)."""
    return recipe.divergence(recipe.all_live_output(inp, Constant(source)), inp.clean)


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
        value = jnp.mean(loops.map_rows(partial(term.forward, _diff(diff, term)), term.rows))
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
        value, grads = loops.accumulate(term.forward, d, term.rows, into, term.coeff)
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


StepFn = Callable[[TrainState, hk.Params, Batch, Key[Array, ""]], tuple[TrainState, Metrics]]


def step_fn(recipe: Recipe, mesh: Mesh | None = None) -> StepFn:
    """`train_step(state, frozen, batch, run_key)` before jit: the pure body that
    `make_train_step` jits and `pd.train.sweep` vmaps over the members of a sweep. On `mesh`
    the layer and chunk bodies gather their weights from the state's shards (`pd.shard`)."""
    opt_c = component_optimizer(recipe.train)
    opt_ci = ci_optimizer(recipe.train)
    adv = recipe.loss.adversary

    def train_step(
        state: TrainState, frozen: hk.Params, x: Batch, run_key: Key[Array, ""]
    ) -> tuple[TrainState, Metrics]:
        with (
            loops.unroll(recipe.train.unroll),
            compute(recipe.train.compute_dtype),
            placement(mesh),
        ):
            return one_step(state, frozen, x, run_key)  # (the settings apply at trace time)

    def one_step(
        state: TrainState, frozen: hk.Params, x: Batch, run_key: Key[Array, ""]
    ) -> tuple[TrainState, Metrics]:
        step_key = jax.random.fold_in(run_key, state.step)
        comps = state.components

        # The clean pass (S3: no gradient reaches it), the clean products and the CI function
        # run once per step; their vjps carry the loss gradients back to them, those of the
        # inner activations summed over the CI function and every pass that reuses them.
        taps, clean = jax.lax.stop_gradient(recipe.target.taps(frozen, x))
        inner, inner_vjp = jax.vjp(lambda V: recipe.ci_fn.inner(taps, V), comps.V)
        products = recipe.products(taps, inner)
        ci, ci_vjp = jax.vjp(lambda p, i: recipe.ci_fn.ci(p, taps, i), state.ci_params, inner)
        sources, source_opt = state.sources, state.source_opt
        if adv.coeff > 0:
            source_lr = schedule_value(adv.lr, recipe.train.steps, state.step)  # once per step
            fixed_comps, fixed_lower, fixed_products = jax.lax.stop_gradient(
                (comps, ci.lower, products)
            )
            fixed = PassInputs(frozen, x, fixed_comps, fixed_lower, clean, taps, fixed_products)

            def warmup_ascent(carry: tuple[Sources, SourceAdam]) -> tuple[Sources, SourceAdam]:
                # S13: ascents on detached components and CI.
                sources, source_opt = carry
                g = jax.grad(lambda s: adversarial_recon(recipe, fixed, s))(sources)
                return ascend(sources, source_opt, g, source_lr, adv.beta1, adv.beta2, adv.eps)

            sources, source_opt = loops.repeat(adv.n_warmup, warmup_ascent, (sources, source_opt))
        inp = PassInputs(frozen, x, comps, ci.lower, clean, taps, products)
        diff = Diff(comps, ci.lower, inner, sources)
        metrics, grads, g_ci = loss_grads(recipe, diff, ci, inp, step_key, state.step)
        g_comps, g_sources = grads.comps, grads.sources
        g_ci_params, g_inner = ci_vjp(g_ci)
        if grads.inner is not None:
            g_inner = jax.tree.map(jnp.add, g_inner, grads.inner)
        if inner is not None:
            (g_V,) = inner_vjp(g_inner)
            g_comps = g_comps._replace(V=jax.tree.map(jnp.add, g_comps.V, g_V))
        if adv.coeff > 0:
            # S14: the final ascent uses this backward's source gradient, without the coefficient.
            g_term = jax.tree.map(lambda g: g / adv.coeff, g_sources)
            sources, source_opt = ascend(
                sources, source_opt, g_term, source_lr, adv.beta1, adv.beta2, adv.eps
            )
        up_c, opt_c_state = opt_c.update(g_comps, state.opt_components, comps)
        up_ci, opt_ci_state = opt_ci.update(g_ci_params, state.opt_ci, state.ci_params)
        metrics["lr"] = schedule_value(recipe.train.lr, recipe.train.steps, state.step)
        metrics["grad_norm/components"] = optax.tree.norm(g_comps)  # before the clip
        new = TrainState(
            step=state.step + 1,
            components=optax.apply_updates(comps, up_c),
            ci_params=optax.apply_updates(state.ci_params, up_ci),
            opt_components=opt_c_state,
            opt_ci=opt_ci_state,
            sources=sources,
            source_opt=source_opt,
        )
        return new, metrics

    return train_step


@one_per_value
def make_train_step(recipe: Recipe, shardings: TrainState | None = None) -> StepFn:
    """One jitted `train_step(state, frozen, batch, run_key)`; frozen params are traced (S18).

    With `shardings` (a mesh run) the new state keeps the placement of the old one. Runs of one
    recipe and placement in a process share the program (`one_per_value`).
    """
    out = None if shardings is None else (shardings, None)
    mesh = None if shardings is None else _mesh_of(shardings)
    step: StepFn = jax.jit(
        step_fn(recipe, mesh),
        donate_argnums=0,
        out_shardings=out,
        compiler_options=compiler_options(recipe.ci_fn),
    )
    return step


def _mesh_of(shardings: TrainState) -> Mesh:
    sharding = jax.tree.leaves(shardings)[0]
    assert isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, Mesh)
    return sharding.mesh


StepsFn = Callable[
    [TrainState, hk.Params, Key[Array, ""], Int[Array, ""]], tuple[TrainState, Metrics]
]
# The batch of a step from `(run_key, step)`, traceable: what a run's step program draws itself.
Sampler = Callable[[Key[Array, ""], Int[Array, ""]], Batch]


@dataclass(frozen=True)
class ToySampler:
    """S18's batch of a toy target: `sample(batch_key(run_key, step))` (compared by value, so
    that runs and sweeps of one recipe share the programs that draw it)."""

    target: ToyTarget
    batch_size: int

    def __call__(self, run_key: Key[Array, ""], step: Int[Array, ""]) -> Batch:
        return self.target.sample(batch_key(run_key, step), self.batch_size)


def steps_fn(recipe: Recipe, sample: Sampler) -> StepsFn:
    """`train_steps(state, frozen, run_key, n ≥ 1)` before jit: `n` training steps (a traced
    count, so one program serves every n) that draw each step's batch themselves,
    `sample(run_key, step)`; the metrics are the last step's, with the monitors (SPEC §5) of the
    state it leaves on its batch, as a run logs them: in the same program, so such a run
    compiles no program of its own for them."""
    one_step = step_fn(recipe)

    def train_steps(
        state: TrainState, frozen: hk.Params, run_key: Key[Array, ""], n: Int[Array, ""]
    ) -> tuple[TrainState, Metrics]:
        def body(
            i: Int[Array, ""], carry: tuple[TrainState, Metrics]
        ) -> tuple[TrainState, Metrics]:
            state = carry[0]
            return one_step(state, frozen, sample(run_key, state.step), run_key)

        shapes = jax.eval_shape(lambda s: body(jnp.int32(0), (s, {})), state)[1]
        # Zeros made from the state, so they vary wherever it does (a sweep's members inside
        # `shard_map`): a loop's carry must keep its type.
        zero = state.step * 0
        metrics = jax.tree.map(lambda a: jnp.broadcast_to(zero.astype(a.dtype), a.shape), shapes)
        state, metrics = jax.lax.fori_loop(0, n, body, (state, metrics))
        x = sample(run_key, state.step - 1)  # the last step's
        return state, metrics | state_monitors(recipe, state, frozen, x)

    return train_steps


@one_per_value
def make_train_steps(recipe: Recipe, sample: Sampler) -> StepsFn:
    """One jitted `steps_fn`: a run whose batches a step can draw (a toy's, or a caller's
    jittable ones) takes the steps between two logged steps as one call, with no host round
    trip per step (`docs/performance.md`)."""
    steps: StepsFn = jax.jit(
        steps_fn(recipe, sample),
        donate_argnums=0,
        compiler_options=compiler_options(recipe.ci_fn),
    )
    return steps


MonitorFn = Callable[[TrainState, hk.Params, Batch], Metrics]


@one_per_value
def make_monitor_step(recipe: Recipe) -> MonitorFn:
    """Jitted `monitor_step(state, frozen, batch)`: the monitors of a logged step where the step
    program does not compute them (a run that is given its batches)."""

    def monitor_step(state: TrainState, frozen: hk.Params, x: Batch) -> Metrics:
        return state_monitors(recipe, state, frozen, x)

    fn: MonitorFn = jax.jit(monitor_step, compiler_options=compiler_options(recipe.ci_fn))
    return fn


def batch_key(run_key: Key[Array, ""], step: int | Int[Array, ""]) -> Key[Array, ""]:
    """S18: the batch of `step` is drawn from `fold_in(fold_in(run_key, step), 0)`."""
    return jax.random.fold_in(jax.random.fold_in(run_key, step), 0)


@one_per_value
def make_sampler(target: ToyTarget, batch_size: int) -> Sampler:
    """The jitted batch of a step: a pure function of `(run_key, step)` (S18)."""
    fn: Sampler = jax.jit(ToySampler(target, batch_size))
    return fn


def faith_warmup(recipe: Recipe, comps: Components, frozen: hk.Params) -> Components:
    """S21: `n` AdamW steps on faithfulness alone with a throwaway optimizer, before step 0."""
    return _faith_warmup(recipe)(comps, frozen)


@one_per_value
def _faith_warmup(recipe: Recipe) -> Callable[[Components, hk.Params], Components]:
    cfg = recipe.train
    tx = optax.adamw(learning_rate=cfg.faith_warmup_lr, weight_decay=cfg.faith_warmup_wd)

    def faithfulness_warmup(comps: Components, frozen: hk.Params) -> Components:
        W = recipe.target.weights(frozen)

        def body(
            carry: tuple[Components, optax.OptState], _: None
        ) -> tuple[tuple[Components, optax.OptState], None]:
            c, opt = carry
            grads = jax.grad(lambda c: faithfulness(recipe.table, W, c.V, c.U))(c)
            updates, opt = tx.update(grads, opt, c)
            return (optax.apply_updates(c, updates), opt), None

        (comps, _), _ = jax.lax.scan(
            body, (comps, tx.init(comps)), None, length=cfg.faith_warmup_steps
        )
        return comps

    fn: Callable[[Components, hk.Params], Components] = jax.jit(faithfulness_warmup)
    return fn
