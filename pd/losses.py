"""Losses: faithfulness, importance minimality, output divergence, recon plans (SPEC §5)."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Key

from pd.sites import SiteTable

PlanKind = Literal["all", "per_site", "subset", "chunks"]


def faithfulness(
    W: Sequence[Sequence[Float[Array, "_d_in _d_out"]] | Float[Array, "_n _d_in _d_out"]],
    V: tuple[Float[Array, "_n _d_in _C"], ...],
    U: tuple[Float[Array, "_n _C _d_out"], ...],
) -> Float[Array, ""]:
    """S17: `Σ_s ‖W_s − V_s U_s‖²_F / Σ_s numel(W_s)` from the fp32 masters.

    `W[g][j]` is the frozen weight of slot j of shape group g: a stacked array or the target's
    own per-site arrays, so the step never copies the frozen weights into a stacked layout.
    """
    total = jnp.zeros((), jnp.float32)
    numel = 0.0  # a float: an int over 2³¹ would overflow under jit
    for ws, v, u in zip(W, V, U, strict=True):
        for j, w in enumerate(ws):
            total = total + jnp.sum((w.astype(jnp.float32) - v[j] @ u[j]) ** 2)
            numel += float(w.size)
    return total / numel


def importance_terms(
    ci_upper: tuple[Float[Array, "_n ... _C"], ...], p: Float[Array, ""], eps: float, a: float
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """S7/S8: `(lp, freq)` from per-(site, subcomponent) global means `f[s, c]` (never merged)."""
    lp = jnp.zeros((), jnp.float32)
    freq = jnp.zeros((), jnp.float32)
    for upper in ci_upper:
        flat = upper.astype(jnp.float32).reshape(upper.shape[0], -1, upper.shape[-1])
        f = jnp.mean((flat + eps) ** p, axis=1)  # [n, C]: global sums, formed before any log
        lp = lp + jnp.sum(f)
        freq = freq + jnp.sum(f * jnp.log2(1.0 + a * f))
    return lp, freq


def kl(masked: Float[Array, "*L V"], clean: Float[Array, "*L V"]) -> Float[Array, ""]:
    """S25: KL(clean ‖ masked) summed over the vocabulary, mean over positions, in fp32."""
    log_p = jax.nn.log_softmax(clean.astype(jnp.float32), axis=-1)
    log_q = jax.nn.log_softmax(masked.astype(jnp.float32), axis=-1)
    return jnp.mean(jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1))


def mse(pred: Float[Array, "*L d"], target: Float[Array, "*L d"]) -> Float[Array, ""]:
    """Sum of squared errors over the number of output elements."""
    return jnp.mean((pred.astype(jnp.float32) - target.astype(jnp.float32)) ** 2)


@dataclass(frozen=True)
class PlanEntry:
    """One entry of a recon plan: which sites are live and whether routing is uniform-k."""

    live: tuple[str, ...]
    routed: bool


def recon_plan(kind: PlanKind, table: SiteTable, k: int = 1) -> tuple[PlanEntry, ...]:
    """S10: the static entries of a stochastic-reconstruction plan.

    `chunks` takes sequential groups of `k` sites in canonical order (the last may be shorter),
    each with uniform-k routing inside the group.
    """
    names = table.names
    if kind == "all":
        return (PlanEntry(names, routed=False),)
    if kind == "per_site":
        return tuple(PlanEntry((n,), routed=False) for n in names)
    if kind == "chunks":
        return tuple(PlanEntry(names[i : i + k], routed=True) for i in range(0, len(names), k))
    return (PlanEntry(names, routed=True),)


def uniform_k_routing(
    key: Key[Array, ""], leading: tuple[int, ...], n_live: int
) -> Bool[Array, "*L n"]:
    """S11: per position draw `k ~ U{1..n_live}` and route a uniformly random k-subset of sites."""
    k_count, k_perm = jax.random.split(key)
    k = jax.random.randint(k_count, (*leading, 1), 1, n_live + 1)
    # The rank of each site in a uniform random order: the k lowest ranks are a uniform k-subset.
    ranks = jnp.argsort(jax.random.uniform(k_perm, (*leading, n_live)), axis=-1).argsort(axis=-1)
    return ranks < k
