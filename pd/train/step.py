"""The jitted training step (SPEC §7) and the faithfulness warmup (S21): the programs. What
they optimize, the recipe and the loss terms with their gradients, is `pd.train.objective`.

The step's program does not grow with depth or with the number of sites: the target runs its
layers as one scanned body, the entries and mask draws of a reconstruction plan are rows of
static arrays mapped over one at a time, and the adversary's warmup ascents are one loop
(`pd.loops`).
"""

from collections.abc import Callable
from dataclasses import dataclass

import haiku as hk
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding
from jaxtyping import Array, Float, Int, Key

from pd import loops
from pd.adversary import SourceAdam, Sources, ascend
from pd.ci import GroupParams
from pd.losses import faithfulness
from pd.precision import compute
from pd.shard import placement
from pd.state import Components, TrainState
from pd.targets.base import Batch, ToyTarget
from pd.train.objective import (
    Diff,
    Metrics,
    PassInputs,
    Recipe,
    adversarial_recon,
    loss_grads,
    state_monitors,
)
from pd.train.optim import ci_optimizer, component_optimizer
from pd.train.schedule import schedule_value
from pd.xla import compiler_options, one_per_value

StepFn = Callable[[TrainState, hk.Params, Batch, Key[Array, ""]], tuple[TrainState, Metrics]]


def step_fn(recipe: Recipe, mesh: Mesh | None = None) -> StepFn:
    """`train_step(state, frozen, batch, run_key)` before jit: the pure body that
    `make_train_step` jits and `pd.train.sweep` vmaps over the members of a sweep. On `mesh`
    the layer and chunk bodies gather their weights from the state's shards (`pd.shard`)."""
    opt_c, opt_ci = component_optimizer(recipe.train), ci_optimizer(recipe.train)
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
            sources, source_opt = warmup_ascents(recipe, fixed, state, source_lr)
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
        metrics["lr"] = schedule_value(recipe.train.lr, recipe.train.steps, state.step)
        metrics["grad_norm/components"] = optax.tree.norm(g_comps)  # before the clip
        new = updated(state, opt_c, opt_ci, g_comps, g_ci_params)
        return new._replace(sources=sources, source_opt=source_opt), metrics

    return train_step


def updated(
    state: TrainState,
    opt_c: optax.GradientTransformation,
    opt_ci: optax.GradientTransformation,
    g_comps: Components,
    g_ci: GroupParams,
) -> TrainState:
    """`state` one step on: its components and CI function updated by their optimizers."""
    up_c, opt_c_state = opt_c.update(g_comps, state.opt_components, state.components)
    up_ci, opt_ci_state = opt_ci.update(g_ci, state.opt_ci, state.ci_params)
    return state._replace(
        step=state.step + 1,
        components=optax.apply_updates(state.components, up_c),
        ci_params=optax.apply_updates(state.ci_params, up_ci),
        opt_components=opt_c_state,
        opt_ci=opt_ci_state,
    )


def warmup_ascents(
    recipe: Recipe, fixed: PassInputs, state: TrainState, lr: Float[Array, ""]
) -> tuple[Sources, SourceAdam]:
    """S13: the sources after `loss.adversary.n_warmup` ascents on the detached components and
    CI of `fixed`, in one loop that XLA keeps (`pd.loops.repeat_kept`)."""
    adv = recipe.loss.adversary

    def ascent(carry: tuple[Sources, SourceAdam]) -> tuple[Sources, SourceAdam]:
        sources, source_opt = carry
        g = jax.grad(lambda s: adversarial_recon(recipe, fixed, s))(sources)
        return ascend(sources, source_opt, g, lr, adv.beta1, adv.beta2, adv.eps)

    start = (state.sources, state.source_opt)
    return loops.repeat_kept(adv.n_warmup, ascent, start, state.step)


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
