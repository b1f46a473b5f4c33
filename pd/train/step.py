"""The jitted training step (SPEC §7) and the faithfulness warmup (S21)."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import haiku as hk
import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike
from jaxtyping import Array, Bool, Float, Int, Key

from pd.adversary import Sources, ascend
from pd.ci import CI, CIFunction, GroupParams
from pd.decompose import make_mask, site_out
from pd.losses import faithfulness, importance_terms, kl, mse, recon_plan, uniform_k_routing
from pd.sites import SiteTable
from pd.state import Components, TrainState
from pd.targets.base import Batch, Output, SiteHook, Target, ToyTarget, frozen_site
from pd.train.config import LossConfig, ReconTerm, TrainConfig
from pd.train.schedule import Schedule, schedule_value

Metrics = dict[str, Float[Array, ""]]
CILower = tuple[Float[Array, "_n B ... _C"], ...]


class LiveSite(NamedTuple):
    """What a live site runs with: S1 masks and an optional route."""

    mask: Float[Array, "*L C"]
    delta_mask: Float[Array, " *L"]
    route: Bool[Array, " *L"] | None


def decomposed_hook(table: SiteTable, comps: Components, live: Mapping[str, LiveSite]) -> SiteHook:
    """A site hook running `site_out` on live sites and the frozen `x @ W` elsewhere (S2)."""

    def hook(
        name: str, x: Float[Array, "*L d_in"], W: Float[Array, "d_in d_out"]
    ) -> Float[Array, "*L d_out"]:
        if name not in live:
            return frozen_site(name, x, W)
        g, j = table.where(name)
        site = live[name]
        return site_out(x, W, comps.V[g][j], comps.U[g][j], site.mask, site.delta_mask, site.route)

    return hook


def grouped_weights(target: Target, frozen: hk.Params) -> tuple[list[Array], ...]:
    """The frozen W of every site, per shape group in slot order (views, never a stacked copy)."""
    return target.table.per_group(target.weights(frozen))


SourceOf = Callable[[str, Float[Array, "*L C"]], Float[Array, "*L Cp1"]]


def constant_source(value: float) -> SourceOf:
    """Every channel `value` and the delta channel off (the monitors of SPEC §5)."""

    def source_of(name: str, ci: Float[Array, "*L C"]) -> Float[Array, "*L Cp1"]:
        return jnp.full((*ci.shape[:-1], ci.shape[-1] + 1), value).at[..., -1].set(0.0)

    return source_of


def persistent_source(table: SiteTable, sources: Sources) -> SourceOf:
    """Each site's persistent source broadcast over the positions (S12)."""

    def source_of(name: str, ci: Float[Array, "*L C"]) -> Float[Array, "*L Cp1"]:
        g, slot = table.c_where(name)
        shape = (*ci.shape[:-1], ci.shape[-1] + 1)
        return jnp.broadcast_to(sources[g][slot].astype(ci.dtype), shape)

    return source_of


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

    def _adamw(self, lr: Schedule) -> optax.GradientTransformation:
        def learning_rate(count: ArrayLike) -> Float[Array, ""]:
            return schedule_value(lr, self.train.steps, jnp.asarray(count))

        # weight_decay must be set: optax's default is 1e-4, not 0.
        return optax.adamw(
            learning_rate=learning_rate, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0
        )

    def component_optimizer(self) -> optax.GradientTransformation:
        """S19: AdamW (0.9, 0.999, 1e-8), weight decay 0, on the (clipped) component gradients."""
        return self._adamw(self.train.lr)

    def ci_optimizer(self) -> optax.GradientTransformation:
        """S20: AdamW with the same betas / eps, weight decay 0."""
        return self._adamw(self.train.ci_lr)

    def ci(
        self, ci_params: GroupParams, comps: Components, frozen: hk.Params, x: Batch
    ) -> tuple[CI, Output]:
        """`(CI, clean output)`: the CI function reads the clean-path taps (S4)."""
        taps, clean = self.target.taps(frozen, x)
        return self.ci_fn.ci(ci_params, taps, comps.V), clean

    def divergence(self, masked: Output, clean: Output) -> Float[Array, ""]:
        """D(masked, clean): MSE for toys, KL(clean ‖ masked) for language models (SPEC §5)."""
        return kl(masked, clean) if self.target.divergence == "kl" else mse(masked, clean)

    def masked_output(
        self, frozen: hk.Params, x: Batch, comps: Components, live: Mapping[str, LiveSite]
    ) -> Output:
        return self.target.forward(frozen, x, decomposed_hook(self.table, comps, live))

    def stochastic_recon(
        self,
        key: Key[Array, ""],
        term: ReconTerm,
        frozen: hk.Params,
        x: Batch,
        comps: Components,
        ci_lower: CILower,
        clean: Output,
    ) -> Float[Array, ""]:
        """S10/S11: the mean divergence over every forward of the plan, fresh sources each."""
        table, leading = self.table, ci_lower[0].shape[1:-1]
        losses = []
        for j, entry in enumerate(recon_plan(term.plan, table, term.k)):
            for d in range(self.loss.n_mask_samples):
                src_key, route_key = jax.random.split(
                    jax.random.fold_in(jax.random.fold_in(key, j), d)
                )
                routes = (
                    uniform_k_routing(route_key, leading, len(entry.live)) if entry.routed else None
                )
                live = {}
                for i, name in enumerate(entry.live):
                    g, slot = table.where(name)
                    C = table.groups[g].C
                    src = jax.random.uniform(
                        jax.random.fold_in(src_key, table.index(name)), (*leading, C + 1)
                    )
                    mask, delta = make_mask(ci_lower[g][slot], src)
                    live[name] = LiveSite(mask, delta, None if routes is None else routes[..., i])
                losses.append(self.divergence(self.masked_output(frozen, x, comps, live), clean))
        return jnp.mean(jnp.stack(losses))

    def all_live_output(
        self,
        source_of: SourceOf,
        frozen: hk.Params,
        x: Batch,
        comps: Components,
        ci_lower: CILower,
    ) -> Output:
        """The output with every site live and routed everywhere, S1 masks from `source_of`."""
        live = {}
        for name in self.table.names:
            g, slot = self.table.where(name)
            ci = ci_lower[g][slot]
            mask, delta = make_mask(ci, source_of(name, ci))
            live[name] = LiveSite(mask, delta, None)
        return self.masked_output(frozen, x, comps, live)

    def all_live_recon(
        self,
        source_of: SourceOf,
        frozen: hk.Params,
        x: Batch,
        comps: Components,
        ci_lower: CILower,
        clean: Output,
    ) -> Float[Array, ""]:
        """D of `all_live_output` against the clean output."""
        masked = self.all_live_output(source_of, frozen, x, comps, ci_lower)
        return self.divergence(masked, clean)

    def monitor(
        self,
        source: float,
        frozen: hk.Params,
        x: Batch,
        comps: Components,
        ci_lower: CILower,
        clean: Output,
    ) -> Float[Array, ""]:
        """A constant source and no delta channel: 0 is CI-masked, 1 is unmasked (SPEC §5)."""
        return self.all_live_recon(constant_source(source), frozen, x, comps, ci_lower, clean)

    def adversarial_recon(
        self,
        sources: Sources,
        frozen: hk.Params,
        x: Batch,
        comps: Components,
        ci_lower: CILower,
        clean: Output,
    ) -> Float[Array, ""]:
        """S12: masks from the persistent sources, broadcast over their scope."""
        source_of = persistent_source(self.table, sources)
        return self.all_live_recon(source_of, frozen, x, comps, ci_lower, clean)

    def losses(
        self,
        comps: Components,
        ci: CI,
        sources: Sources,
        clean: Output,
        frozen: hk.Params,
        x: Batch,
        step_key: Key[Array, ""],
        step: Int[Array, ""],
    ) -> tuple[Float[Array, ""], Metrics]:
        """The total loss given this step's CI, and every term under its own name."""
        cfg = self.loss
        faith = faithfulness(grouped_weights(self.target, frozen), comps.V, comps.U)
        p = schedule_value(cfg.p, self.train.steps, step)
        lp, freq = importance_terms(ci.upper, p, cfg.eps, cfg.reference_token_count)
        total = cfg.faithfulness * faith + cfg.importance * lp
        metrics: Metrics = {"loss/faithfulness": faith, "loss/importance": lp, "p": p}
        if cfg.frequency > 0:
            total = total + cfg.frequency * freq
            metrics["loss/frequency"] = freq
        for t, term in enumerate(cfg.recon):
            value = self.stochastic_recon(
                jax.random.fold_in(step_key, 1 + t), term, frozen, x, comps, ci.lower, clean
            )
            total = total + term.coeff * value
            metrics[f"loss/{term.name}"] = value
        if cfg.adversary.coeff > 0:
            value = self.adversarial_recon(sources, frozen, x, comps, ci.lower, clean)
            total = total + cfg.adversary.coeff * value
            metrics["loss/adversarial"] = value
        for name in self.table.names:
            g, slot = self.table.where(name)
            active = jnp.sum(ci.lower[g][slot] > 0.1, axis=-1)
            metrics[f"ci_l0/{name}"] = jnp.mean(active.astype(jnp.float32))
        metrics["loss/total"] = total
        return total, metrics

    def evaluate_batch(
        self, state: TrainState, frozen: hk.Params, x: Batch, step_key: Key[Array, ""]
    ) -> tuple[Metrics, CI]:
        """The losses and monitors of `state` on a batch, and the CI they used (no gradient)."""
        comps = state.components
        ci, clean = self.ci(state.ci_params, comps, frozen, x)
        _, metrics = self.losses(comps, ci, state.sources, clean, frozen, x, step_key, state.step)
        metrics["monitor/ci_masked_recon"] = self.monitor(0.0, frozen, x, comps, ci.lower, clean)
        metrics["monitor/unmasked_recon"] = self.monitor(1.0, frozen, x, comps, ci.lower, clean)
        return metrics, ci


def clip_global_norm(grads: Components, max_norm: float) -> Components:
    """S19: `scale = min(1, max_norm / (‖g‖ + 1e-6))` (torch's epsilon; optax has none)."""
    norm = optax.tree.norm(grads)
    scale = jnp.minimum(1.0, max_norm / (norm + 1e-6))
    clipped: Components = jax.tree.map(lambda g: g * scale, grads)
    return clipped


StepFn = Callable[[TrainState, hk.Params, Batch, Key[Array, ""]], tuple[TrainState, Metrics]]


def make_train_step(recipe: Recipe, shardings: TrainState | None = None) -> StepFn:
    """One jitted `train_step(state, frozen, batch, run_key)`; frozen params are traced (S18).

    With `shardings` (a mesh run) the new state keeps the placement of the old one.
    """
    opt_c, opt_ci = recipe.component_optimizer(), recipe.ci_optimizer()
    adv = recipe.loss.adversary

    def train_step(
        state: TrainState, frozen: hk.Params, x: Batch, run_key: Key[Array, ""]
    ) -> tuple[TrainState, Metrics]:
        step_key = jax.random.fold_in(run_key, state.step)
        comps = state.components

        def ci_of(ci_params: GroupParams, comps: Components) -> tuple[CI, Output]:
            return recipe.ci(ci_params, comps, frozen, x)

        # The CI function runs once per step; its vjp carries the loss gradients back to it.
        (ci, clean), ci_vjp = jax.vjp(ci_of, state.ci_params, comps)
        clean = jax.lax.stop_gradient(clean)  # S3
        sources, source_opt = state.sources, state.source_opt
        if adv.coeff > 0:
            source_lr = schedule_value(adv.lr, recipe.train.steps, state.step)  # once per step
            fixed = jax.lax.stop_gradient((comps, ci.lower))
            for _ in range(adv.n_warmup):  # S13: ascents on detached components and CI
                g = jax.grad(recipe.adversarial_recon)(sources, frozen, x, *fixed, clean)
                sources, source_opt = ascend(
                    sources, source_opt, g, source_lr, adv.beta1, adv.beta2, adv.eps
                )
        grad_fn = jax.value_and_grad(recipe.losses, argnums=(0, 1, 2), has_aux=True)
        (_, metrics), (g_comps, g_ci, g_sources) = grad_fn(
            comps, ci, sources, clean, frozen, x, step_key, state.step
        )
        g_ci_params, g_comps_via_ci = ci_vjp((g_ci, jnp.zeros_like(clean)))
        g_comps = jax.tree.map(jnp.add, g_comps, g_comps_via_ci)
        if adv.coeff > 0:
            # S14: the final ascent uses this backward's source gradient, without the coefficient.
            g_term = jax.tree.map(lambda g: g / adv.coeff, g_sources)
            sources, source_opt = ascend(
                sources, source_opt, g_term, source_lr, adv.beta1, adv.beta2, adv.eps
            )
        if recipe.train.grad_clip > 0:
            g_comps = clip_global_norm(g_comps, recipe.train.grad_clip)
        up_c, opt_c_state = opt_c.update(g_comps, state.opt_components, comps)
        up_ci, opt_ci_state = opt_ci.update(g_ci_params, state.opt_ci, state.ci_params)
        metrics["lr"] = schedule_value(recipe.train.lr, recipe.train.steps, state.step)
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

    out = None if shardings is None else (shardings, None)
    step: StepFn = jax.jit(train_step, donate_argnums=0, out_shardings=out)
    return step


def batch_key(run_key: Key[Array, ""], step: int | Int[Array, ""]) -> Key[Array, ""]:
    """S18: the batch of `step` is drawn from `fold_in(fold_in(run_key, step), 0)`."""
    return jax.random.fold_in(jax.random.fold_in(run_key, step), 0)


def make_sampler(
    target: ToyTarget, batch_size: int
) -> Callable[[Key[Array, ""], Int[Array, ""]], Batch]:
    """The jitted batch of a step: a pure function of `(run_key, step)` (S18)."""

    def sample_batch(run_key: Key[Array, ""], step: Int[Array, ""]) -> Batch:
        return target.sample(batch_key(run_key, step), batch_size)

    fn: Callable[[Key[Array, ""], Int[Array, ""]], Batch] = jax.jit(sample_batch)
    return fn


def faith_warmup(recipe: Recipe, comps: Components, frozen: hk.Params) -> Components:
    """S21: `n` AdamW steps on faithfulness alone with a throwaway optimizer, before step 0."""
    cfg = recipe.train
    tx = optax.adamw(learning_rate=cfg.faith_warmup_lr, weight_decay=cfg.faith_warmup_wd)

    def faithfulness_warmup(comps: Components, frozen: hk.Params) -> Components:
        W = grouped_weights(recipe.target, frozen)

        def body(
            carry: tuple[Components, optax.OptState], _: None
        ) -> tuple[tuple[Components, optax.OptState], None]:
            c, opt = carry
            grads = jax.grad(lambda c: faithfulness(W, c.V, c.U))(c)
            updates, opt = tx.update(grads, opt, c)
            return (optax.apply_updates(c, updates), opt), None

        (comps, _), _ = jax.lax.scan(
            body, (comps, tx.init(comps)), None, length=cfg.faith_warmup_steps
        )
        return comps

    warmed: Components = jax.jit(faithfulness_warmup)(comps, frozen)
    return warmed
