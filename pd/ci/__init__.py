"""Causal-importance functions: squashing and the per-site MLP family (SPEC §4)."""

from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import haiku as hk
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Key

from pd.ci.mlp import PerSiteCIKind, site_ci_transform
from pd.ci.squash import lower_leaky_hard, upper_leaky_hard
from pd.precision import matmul
from pd.sites import SiteTable, input_tap

GroupParams = tuple[hk.Params, ...]
KeyPath = tuple[object, ...]  # a parameter's place in `GroupParams` (jax's key path)
LogicalAxes = tuple[str | None, ...]
# Clean-path activations by name, stacked over the layers (S4; see `pd.targets.base.Taps`).
Taps = dict[str, Float[Array, "_n B ..."]]
# Each site's inner activations `x @ V` on its clean path, `[n_g, *L, C]` per shape group.
Inner = tuple[Float[Array, "_n ... _C"], ...]


class CI(NamedTuple):
    """CI per shape group, `[n_g, *L, C]` each (S5: both squashings of the same logits)."""

    logits: tuple[Float[Array, "_n ... _C"], ...]
    lower: tuple[Float[Array, "_n ... _C"], ...]
    upper: tuple[Float[Array, "_n ... _C"], ...]


def squash(logits: tuple[Float[Array, "_n ... _C"], ...]) -> CI:
    """S5: `lower` (masks only) and `upper` (importance minimality only) from the same logits."""
    return CI(
        logits=logits,
        lower=tuple(lower_leaky_hard(x) for x in logits),
        upper=tuple(upper_leaky_hard(x) for x in logits),
    )


@runtime_checkable
class CIFunction(Protocol):
    """A CI function: parameters from the CI key, and CI of every site from the taps and, for
    a function that reads them, the sites' clean inner activations (§4)."""

    def init(self, ci_key: Key[Array, ""]) -> GroupParams: ...

    def inner(self, taps: Taps, V: tuple[Float[Array, "_n _d_in _C"], ...]) -> Inner | None:
        """The clean inner activations the function reads, or None if it reads none. The step
        computes them once and the masked passes reuse them (`pd.decompose.CleanProducts`)."""
        ...

    def ci(self, params: GroupParams, taps: Taps, inner: Inner | None) -> CI: ...

    def param_axes(self, path: KeyPath, ndim: int) -> LogicalAxes:
        """The logical axes (`pd.shard`'s rule table places them) of the parameter at `path`
        in `init`'s output; ValueError for a parameter the function does not know."""
        ...

    @property
    def many_small_dots(self) -> bool:
        """Whether the function is many small per-subcomponent networks (a compiler option
        helps those on a CPU)."""
        ...


@dataclass(frozen=True)
class PerSiteCI:
    """One CI network per site, parameters stacked per shape group (leading axis `n_g`)."""

    table: SiteTable
    kind: PerSiteCIKind
    hidden: tuple[int, ...]

    def _net(self, g: int) -> hk.Transformed:
        return site_ci_transform(self.kind, self.hidden, self.table.groups[g].C)

    def init(self, ci_key: Key[Array, ""]) -> GroupParams:
        """Stacked parameters; site `i` (canonical order) draws from `fold_in(ci_key, i)` (§9)."""
        out = []
        for g, grp in enumerate(self.table.groups):
            idx = jnp.asarray(self.table.group_indices(g), dtype=jnp.uint32)
            keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(ci_key, idx)
            a = jnp.zeros((1, grp.C if self.kind == "mlp" else grp.d_in), jnp.float32)
            out.append(jax.vmap(self._net(g).init, in_axes=(0, None))(keys, a))
        return tuple(out)

    def apply(self, params: GroupParams, inputs: tuple[Float[Array, "_n ... _"], ...]) -> CI:
        """CI of every site from its network's input, per group: the inner activations for the
        `mlp` kind, the site's input otherwise."""
        logits = tuple(
            jax.vmap(self._net(g).apply)(params[g], inputs[g])
            for g in range(len(self.table.groups))
        )
        return squash(logits)

    def _inputs(self, taps: Taps) -> tuple[Float[Array, "_n ... _d_in"], ...]:
        """Each site's input, read from its kind's input tap, per group."""
        return self.table.from_kinds({k: taps[input_tap(k)] for k in self.table.kinds})

    def inner(self, taps: Taps, V: tuple[Float[Array, "_n _d_in _C"], ...]) -> Inner | None:
        """`x @ V` of every site's clean input for the `mlp` kind, whose only input it is."""
        if self.kind != "mlp":
            return None
        return tuple(jax.vmap(matmul)(x, v) for x, v in zip(self._inputs(taps), V, strict=True))

    def ci(self, params: GroupParams, taps: Taps, inner: Inner | None) -> CI:
        """CI of every site from its clean inner activations (`mlp`) or its own input."""
        if self.kind == "mlp":
            assert inner is not None, "the mlp CI function reads the inner activations"
            return self.apply(params, inner)
        return self.apply(params, self._inputs(taps))

    def param_axes(self, path: KeyPath, ndim: int) -> LogicalAxes:
        """`[n_sites, …]`: the sites' axis kept whole, the next (a subcomponent MLP's C, a
        shared MLP's fan-in or width) split over every device (`spread`)."""
        del path
        return (None, "spread", *(None,) * (ndim - 2))

    @property
    def many_small_dots(self) -> bool:
        return self.kind in ("mlp", "vector_mlp")
