"""The math of one site (SPEC §3) and the hook that runs it inside a target's layer scan.

A target calls `hook(kind, layer_sites, x, W)` for every decomposed matmul, where `layer_sites`
is the layer's slice of everything per site of that kind (`LayerSites`, stacked on a leading
layer axis outside the scan). The hook runs `site_out` where the site is live and the frozen
`x @ W` elsewhere, under a `lax.cond`: a site that is not live costs the frozen matmul (S2).
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, Key

from pd import rng
from pd.precision import matmul
from pd.sites import HostOrDevice, SiteTable


def make_mask(
    ci_lower: Float[Array, "*L C"], source: Float[Array, "*L Cp1"]
) -> tuple[Float[Array, "*L C"], Float[Array, " *L"]]:
    """S1: `(mask, delta_mask)` from CI and a source over C + 1 channels."""
    mask = ci_lower + (1.0 - ci_lower) * source[..., :-1]
    return mask, source[..., -1]


def site_out(
    x: Float[Array, "*L d_in"],
    W: Float[Array, "d_in d_out"],
    V: Float[Array, "d_in C"],
    U: Float[Array, "C d_out"],
    mask: Float[Array, "*L C"] | None = None,
    delta_mask: Float[Array, " *L"] | None = None,
    route: Bool[Array, " *L"] | None = None,
    products: tuple[Float[Array, "*L C"], Float[Array, "*L d_out"]] | None = None,
) -> Float[Array, "*L d_out"]:
    """`[*L, d_out]`: a live site's output; `None` masks are ones, `None` route is everywhere;
    `products` are `(x @ V, x @ W)` where the caller has them."""
    inner, frozen = (matmul(x, V), matmul(x, W)) if products is None else products
    ones = jnp.ones(inner.shape[:-1], inner.dtype)
    delta = ones if delta_mask is None else delta_mask
    # masked·inner@U + delta·(x@W − inner@U) = (inner·(mask − delta))@U + delta·(x@W): one
    # [C, d_out] matmul instead of two; the [d_in, d_out] delta matrix is never formed (SPEC §3).
    coeff = (1.0 if mask is None else mask) - delta[..., None]
    y = matmul(inner * coeff, U) + delta[..., None] * frozen
    if route is None:
        return y
    return jnp.where(route[..., None], y, frozen)


class LayerSites(NamedTuple):
    """One kind's sites at one layer (with a leading `[n_layers]` axis outside the scan).

    `source` is the persistent source (broadcast over the positions) where the hook's mode is
    `Persistent`, else None. `site_index` is the site's canonical index (the key tree's i); `column`
    its column in the plan entry's routes.

    `clean` says that the site's input in this pass is its clean-path input: the first site in
    canonical order's, or the only live site's (every other site is frozen). `products` are the
    site's `CleanProducts`, where the step has them; a pass reuses them where `clean`.
    """

    V: Float[Array, "d_in C"]
    U: Float[Array, "C d_out"]
    ci_lower: Float[Array, "*L C"]
    source: Float[Array, "*S Cp1"] | None
    site_index: Int[Array, ""]
    live: Bool[Array, ""]
    column: Int[Array, ""]
    clean: Bool[Array, ""]
    products: tuple[Float[Array, "*L C"], Float[Array, "*L d_out"] | None] | None


class CleanProducts(NamedTuple):
    """`x @ V` (`[n_g, *L, C]`) and `x @ W` (`[n_g, *L, d_out]`) of every site's clean-path
    input, per shape group: the first where the CI function reads it (`mlp`), the second where
    the target taps its sites' outputs (`pd.sites.output_tap`; else None). The passes reuse them
    at sites whose input is clean, so the loss gradients of every pass and of the CI function
    reach V through one product `xᵀ ∂inner` a step, and no pass repeats the clean `x @ W`
    (`docs/design.md`, "Clean products")."""

    inner: tuple[Float[Array, "_n ... _C"], ...]
    frozen: tuple[Float[Array, "_n ... _d_out"], ...] | None


# `hook(kind, sites, x, W) -> y`: every decomposed matmul `x @ W` of a target goes through it.
SiteHook = Callable[
    [str, LayerSites, Float[Array, "*L d_in"], Float[Array, "d_in d_out"]],
    Float[Array, "*L d_out"],
]


class SiteGrads(NamedTuple):
    """The running gradient of one kind's differentiated `LayerSites` fields, stacked per layer
    like them: zero in a layer without a site of the kind (where `by_kind` repeats a slot)."""

    V: Float[Array, "n_layers d_in C"]
    U: Float[Array, "n_layers C d_out"]
    ci_lower: Float[Array, "n_layers *L C"]
    source: Float[Array, "n_layers *S Cp1"] | None
    inner: Float[Array, "n_layers *L C"] | None

    @staticmethod
    def of(sites: LayerSites, like: "SiteGrads") -> "SiteGrads":
        """The fields of `sites` that `like` holds a gradient of."""
        inner = None if like.inner is None or sites.products is None else sites.products[0]
        source = None if like.source is None else sites.source
        return SiteGrads(sites.V, sites.U, sites.ci_lower, source, inner)


class Sites(NamedTuple):
    """What a target's forward runs its sites with: the hook and, per decomposed kind, the
    stacked `LayerSites` it scans over. A kind absent from `layers` runs `x @ W`.

    `into`, where given, is the running gradient of a loop over passes (`pd.loops.accumulate`
    with `adds_into`): a target whose layer scan is `pd.loops.scan_adding` adds its sites'
    gradients into it in place; a target that ignores it must not be given it."""

    hook: SiteHook
    layers: dict[str, LayerSites]
    into: dict[str, SiteGrads] | None = None


def frozen_hook(
    kind: str, sites: LayerSites, x: Float[Array, "*L d_in"], W: Float[Array, "d_in d_out"]
) -> Float[Array, "*L d_out"]:
    """The frozen path `x @ W` (S2, S3)."""
    del kind, sites
    return matmul(x, W)


FROZEN = Sites(frozen_hook, {})  # the clean forward: every site on its frozen path


def apply_site(
    hook: SiteHook,
    layer: dict[str, LayerSites],
    kind: str,
    x: Float[Array, "*L d_in"],
    W: Float[Array, "d_in d_out"],
) -> Float[Array, "*L d_out"]:
    """`hook` on a decomposed kind (one layer's `LayerSites` in `layer`), `x @ W` otherwise."""
    return hook(kind, layer[kind], x, W) if kind in layer else matmul(x, W)


def layer_of(sites: Sites, layer: int) -> dict[str, LayerSites]:
    """The `LayerSites` of one static layer, for targets that do not scan (toys)."""
    return {k: jax.tree.map(lambda a: a[layer], v) for k, v in sites.layers.items()}


@dataclass(frozen=True)
class Draw:
    """Fresh `U[0, 1)` sources; site i draws from `fold_in(key, i)` (SPEC §9)."""

    key: Key[Array, ""]


@dataclass(frozen=True)
class Constant:
    """Every channel `value` and the delta channel `delta` (monitors, zero masks, user masks)."""

    value: float
    delta: float = 0.0


@dataclass(frozen=True)
class Persistent:
    """The persistent adversarial source of each site, broadcast over its scope (S12)."""


SourceMode = Draw | Constant | Persistent


def decomposed_hook(mode: SourceMode, routes: Bool[Array, "*L n"] | None = None) -> SiteHook:
    """A hook running `site_out` with S1 masks where a site is live, `x @ W` elsewhere (S2)."""

    def hook(
        kind: str, s: LayerSites, x: Float[Array, "*L d_in"], W: Float[Array, "d_in d_out"]
    ) -> Float[Array, "*L d_out"]:
        def live(x: Float[Array, "*L d_in"]) -> Float[Array, "*L d_out"]:
            shape = (*x.shape[:-1], s.V.shape[-1] + 1)
            if isinstance(mode, Draw):
                source = rng.uniform(jax.random.fold_in(mode.key, s.site_index), shape)
            elif isinstance(mode, Constant):
                source = jnp.full(shape, mode.value).at[..., -1].set(mode.delta)
            else:
                assert s.source is not None, "a Persistent hook needs LayerSites.source"
                source = jnp.broadcast_to(s.source.astype(s.ci_lower.dtype), shape)
            mask, delta = make_mask(s.ci_lower, source)
            route = None if routes is None else routes[..., s.column]
            y = site_out(x, W, s.V, s.U, mask, delta, route, products(x))
            # The frozen path's dtype, as both branches must return one type.
            return y.astype(jnp.result_type(x, W))

        def products(
            x: Float[Array, "*L d_in"],
        ) -> tuple[Float[Array, "*L C"], Float[Array, "*L d_out"]]:
            """`(x @ V, x @ W)`: the step's clean products where the site's input is clean."""
            if s.products is None:
                return matmul(x, s.V), matmul(x, W)
            inner, out = s.products
            if out is None:
                return jax.lax.cond(s.clean, lambda: inner, lambda: matmul(x, s.V)), matmul(x, W)
            both: tuple[Float[Array, "*L C"], Float[Array, "*L d_out"]] = jax.lax.cond(
                s.clean, lambda: (inner, out), lambda: (matmul(x, s.V), matmul(x, W))
            )
            return both

        def frozen(x: Float[Array, "*L d_in"]) -> Float[Array, "*L d_out"]:
            out = None if s.products is None else s.products[1]
            if out is None:
                return matmul(x, W)
            y: Float[Array, "*L d_out"] = jax.lax.cond(s.clean, lambda: out, lambda: matmul(x, W))
            return y

        y: Float[Array, "*L d_out"] = jax.lax.cond(s.live, live, frozen, x)
        return y

    return hook


def layer_sites(
    table: SiteTable,
    V: tuple[Float[Array, "_n _d_in _C"], ...],
    U: tuple[Float[Array, "_n _C _d_out"], ...],
    ci_lower: tuple[Float[Array, "_n ... _C"], ...],
    sources: tuple[Float[Array, "_n ... _Cp1"], ...] | None = None,
    live: dict[str, Bool[Array, " n_layers"]] | None = None,
    products: CleanProducts | None = None,
) -> dict[str, LayerSites]:
    """Per decomposed kind, its sites' `LayerSites` stacked over the layers, from the per-group
    storage. `live` (default: every site) is per kind and layer; a layer without a site of the
    kind is never live. Route columns are 0 (a plan entry sets its own); the first site is
    `clean` (a plan entry with one live site makes that one clean too)."""
    out = {}
    for kind in table.kinds:
        lay = table.layout(kind)
        present = jnp.asarray(lay.present)
        out[kind] = LayerSites(
            V=table.by_kind(V, kind),
            U=table.by_kind(U, kind),
            ci_lower=table.by_kind(ci_lower, kind),
            source=None if sources is None else table.by_kind(sources, kind, c_groups=True),
            site_index=jnp.asarray([max(i, 0) for i in lay.indices], jnp.int32),
            live=present if live is None else present & live[kind],
            column=jnp.zeros(table.n_layers, jnp.int32),
            clean=jnp.asarray([i == 0 for i in lay.indices]),
            products=None if products is None else _products_of(table, products, kind),
        )
    return out


def layer_grads(
    table: SiteTable,
    V: tuple[Float[Array, "_n _d_in _C"], ...],
    U: tuple[Float[Array, "_n _C _d_out"], ...],
    ci_lower: tuple[Float[Array, "_n ... _C"], ...],
    sources: tuple[Float[Array, "_n ... _Cp1"], ...] | None,
    inner: tuple[Float[Array, "_n ... _C"], ...] | None,
) -> dict[str, SiteGrads]:
    """A running gradient in per-group storage, laid out per kind and layer as `layer_sites`
    lays out the fields it is the gradient of: zero in the layers without a site of the kind,
    so that the slot `by_kind` repeats there goes back to storage once."""
    out = {}
    for kind in table.kinds:
        out[kind] = SiteGrads(
            _present_rows(table, V, kind),
            _present_rows(table, U, kind),
            _present_rows(table, ci_lower, kind),
            None if sources is None else _present_rows(table, sources, kind, c_groups=True),
            None if inner is None else _present_rows(table, inner, kind),
        )
    return out


def _present_rows(
    table: SiteTable, stacked: tuple[Float[Array, "_n ..."], ...], kind: str, c_groups: bool = False
) -> Float[Array, "n_layers ..."]:
    """`table.by_kind(stacked, kind)`, zero in the layers without a site of the kind."""
    a = table.by_kind(stacked, kind, c_groups)
    present = table.layout(kind).present
    if all(present):
        return a
    keep = jnp.asarray(present).reshape(-1, *([1] * (a.ndim - 1)))
    return jnp.where(keep, a, jnp.zeros_like(a))


def _products_of(
    table: SiteTable, products: CleanProducts, kind: str
) -> tuple[Float[Array, "_L ... _C"], Float[Array, "_L ... _d_out"] | None]:
    """One kind's clean products, stacked per layer."""
    out = None if products.frozen is None else table.by_kind(products.frozen, kind)
    return table.by_kind(products.inner, kind), out


def site_weights(
    table: SiteTable, weights: dict[str, Float[HostOrDevice, "_L _d_in _d_out"]]
) -> dict[str, Float[HostOrDevice, "_d_in _d_out"]]:
    """`{site: W}` views of a target's per-kind stacked frozen weights."""
    return {s.name: weights[s.kind][s.layer] for s in table.sites}
