"""Losses: faithfulness, importance minimality, output divergence, recon plans (SPEC §5)."""

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name as _checkpoint_name
from jaxtyping import Array, Bool, Float, Int, Key

from pd import loops, rng
from pd.shard import gathered, stored
from pd.sites import SiteTable, take

PlanKind = Literal["all", "per_site", "subset", "chunks"]


_RESIDUAL = "faithfulness residual"
checkpoint_name: Callable[[Array, str], Array] = _checkpoint_name  # unannotated upstream


def faithfulness(
    table: SiteTable,
    W: dict[str, Float[Array, "_L _d_in _d_out"]],
    V: tuple[Float[Array, "_n _d_in _C"], ...],
    U: tuple[Float[Array, "_n _C _d_out"], ...],
) -> Float[Array, ""]:
    """S17: `Σ_s ‖W_s − V_s U_s‖²_F / Σ_s numel(W_s)` from the fp32 masters.

    `W[kind]` is the target's layer-stacked frozen weight of a kind; each kind's sites are one
    scan over its layers (a Python loop over the few kinds, never over sites or layers). On a
    mesh, W and V keep their rows where they are stored and one layer's U is gathered at a time,
    so no `[d_in, d_out]` product is ever formed for more than one layer.
    """
    total = jnp.zeros((), jnp.float32)
    numel = 0.0  # a float: an int over 2³¹ would overflow under jit

    # The backward keeps each layer's residual `W − VU` (the size of W's shard) and gathers U
    # again; it never keeps a gathered U, nor recomputes the product.
    @partial(jax.checkpoint, policy=jax.checkpoint_policies.save_only_these_names(_RESIDUAL))
    def layer(
        carry: None, xs: tuple[Float[Array, "i o"], Float[Array, "i c"], Float[Array, "c o"]]
    ) -> tuple[None, Float[Array, ""]]:
        w, v, u = xs
        u = gathered("U", u, (None, "d_out"), exact=True)
        residual = checkpoint_name(w.astype(jnp.float32) - v @ u, _RESIDUAL)
        return None, jnp.sum(residual**2)

    for kind in table.kinds:
        w = take(W[kind], table.present_layers(kind))
        v = stored("V", table.of_kind(V, kind), (None, "d_in", None))
        u = stored("U", table.of_kind(U, kind), (None, None, "d_out"))
        total = total + jnp.sum(loops.scan(layer, None, (w, v, u))[1])
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


class PlanArrays(NamedTuple):
    """A plan as data, one row per entry: per kind and layer whether the site is live and its
    route column, and the number of live sites (the step maps over the rows)."""

    live: dict[str, Bool[Array, "n_entries n_layers"]]
    column: dict[str, Int[Array, "n_entries n_layers"]]
    n_live: Int[Array, " n_entries"]


def plan_arrays(entries: tuple[PlanEntry, ...], table: SiteTable) -> PlanArrays:
    """The static arrays of a plan; a site's route column is its position in its entry."""
    n, L = len(entries), table.n_layers
    live = {kind: np.zeros((n, L), bool) for kind in table.kinds}
    column = {kind: np.zeros((n, L), np.int32) for kind in table.kinds}
    for j, entry in enumerate(entries):
        for c, name in enumerate(entry.live):
            site = table.spec(name)
            live[site.kind][j, site.layer] = True
            column[site.kind][j, site.layer] = c
    return PlanArrays(
        {k: jnp.asarray(v) for k, v in live.items()},
        {k: jnp.asarray(v) for k, v in column.items()},
        jnp.asarray([len(e.live) for e in entries], jnp.int32),
    )


def uniform_k_routing(
    key: Key[Array, ""], leading: tuple[int, ...], width: int, n_live: Int[Array, ""] | int
) -> Bool[Array, "*L width"]:
    """S11: per position draw `k ~ U{1..n_live}` and route a uniformly random k-subset of the
    first `n_live` of `width` columns (the others, padding of a shorter entry, never route)."""
    k_count, k_perm = jax.random.split(key)
    k = jax.random.randint(k_count, (*leading, 1), 1, n_live + 1)
    # The rank of each site in a uniform random order: the k lowest ranks are a uniform k-subset;
    # padding columns draw 2, above every real draw, so they rank last.
    draws = rng.uniform(k_perm, (*leading, width))
    draws = jnp.where(jnp.arange(width) < n_live, draws, 2.0)
    ranks = jnp.argsort(draws, axis=-1).argsort(axis=-1)
    return ranks < k
