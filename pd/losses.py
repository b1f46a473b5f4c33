"""Losses: faithfulness, importance minimality, output divergence, recon plans (SPEC §5)."""

from dataclasses import dataclass
from typing import Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Key

from pd.sites import SiteTable

PlanKind = Literal["all", "per_site", "subset"]


def faithfulness(
    W: tuple[Float[Array, "_n _d_in _d_out"], ...],
    V: tuple[Float[Array, "_n _d_in _C"], ...],
    U: tuple[Float[Array, "_n _C _d_out"], ...],
) -> Float[Array, ""]:
    """S17: `Σ_s ‖W_s − V_s U_s‖²_F / Σ_s numel(W_s)` from the fp32 masters."""
    total = sum(jnp.sum((w - v @ u) ** 2) for w, v, u in zip(W, V, U, strict=True))
    numel = float(sum(w.size for w in W))  # a float: an int over 2³¹ would overflow under jit
    return jnp.asarray(total, jnp.float32) / numel


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


def mse(pred: Float[Array, "*L d"], target: Float[Array, "*L d"]) -> Float[Array, ""]:
    """Sum of squared errors over the number of output elements."""
    return jnp.mean((pred.astype(jnp.float32) - target.astype(jnp.float32)) ** 2)


@dataclass(frozen=True)
class PlanEntry:
    """One entry of a recon plan: which sites are live and whether routing is uniform-k."""

    live: tuple[str, ...]
    routed: bool


def recon_plan(kind: PlanKind, table: SiteTable) -> tuple[PlanEntry, ...]:
    """S10: the static entries of a stochastic-reconstruction plan."""
    if kind == "all":
        return (PlanEntry(table.names, routed=False),)
    if kind == "per_site":
        return tuple(PlanEntry((n,), routed=False) for n in table.names)
    return (PlanEntry(table.names, routed=True),)


def uniform_k_routing(
    key: Key[Array, ""], leading: tuple[int, ...], n_live: int
) -> Bool[Array, "*L n"]:
    """S11: per position draw `k ~ U{1..n_live}` and route a uniformly random k-subset of sites."""
    k_count, k_perm = jax.random.split(key)
    k = jax.random.randint(k_count, (*leading, 1), 1, n_live + 1)
    # The rank of each site in a uniform random order: the k lowest ranks are a uniform k-subset.
    ranks = jnp.argsort(jax.random.uniform(k_perm, (*leading, n_live)), axis=-1).argsort(axis=-1)
    return ranks < k
