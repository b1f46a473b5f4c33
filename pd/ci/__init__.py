"""Causal-importance functions: squashing and the per-site MLP family (SPEC §4)."""

from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import haiku as hk
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Key

from pd.ci.mlp import PerSiteCIKind, site_ci_transform
from pd.ci.squash import lower_leaky_hard, upper_leaky_hard
from pd.sites import SiteTable, input_tap

GroupParams = tuple[hk.Params, ...]
# Clean-path activations by name, stacked over the layers (S4; see `pd.targets.base.Taps`).
Taps = dict[str, Float[Array, "_n B ..."]]


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
    """A CI function: parameters from the CI key, and CI of every site from the taps (§4)."""

    def init(self, ci_key: Key[Array, ""]) -> GroupParams: ...

    def ci(
        self, params: GroupParams, taps: Taps, V: tuple[Float[Array, "_n _d_in _C"], ...]
    ) -> CI: ...


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
            x = jnp.zeros((1, grp.d_in), jnp.float32)
            V = jnp.zeros((grp.d_in, grp.C), jnp.float32)
            out.append(jax.vmap(self._net(g).init, in_axes=(0, None, None))(keys, x, V))
        return tuple(out)

    def apply(
        self,
        params: GroupParams,
        inputs: tuple[Float[Array, "_n ... _d_in"], ...],
        V: tuple[Float[Array, "_n _d_in _C"], ...],
    ) -> CI:
        """CI of every site from its input `x` (and `V`, for the `mlp` kind), per group."""
        logits = tuple(
            jax.vmap(self._net(g).apply)(params[g], inputs[g], V[g])
            for g in range(len(self.table.groups))
        )
        return squash(logits)

    def ci(self, params: GroupParams, taps: Taps, V: tuple[Float[Array, "_n _d_in _C"], ...]) -> CI:
        """CI of every site from its own input, read from its kind's input tap."""
        inputs = self.table.from_kinds({k: taps[input_tap(k)] for k in self.table.kinds})
        return self.apply(params, inputs, V)
