"""Persistent adversarial sources: stacked per C group, ascended by optax's Adam and projected
onto [0, 1] (SPEC §6)."""

from functools import partial
from typing import Literal

import jax
import jax.numpy as jnp
import optax
from jax.typing import DTypeLike
from jaxtyping import Array, Float, Key

from pd.sites import SiteTable

Scope = Literal["c", "bc", "sc", "bsc"]
Sources = tuple[Float[Array, "_n ... _Cp1"], ...]


# S15's Adam state: optax's; whatever the sources' storage dtype (S22) its second moment is
# fp32 and its first is in `train.moment_dtype` (fp32 unless set).
SourceAdam = optax.ScaleByAdamState


def scope_shape(scope: Scope, batch: int, seq_len: int = 0) -> tuple[int, ...]:
    """The source's leading shape: `c` / `sc` shared over the batch (toys / sequences), `bc` /
    `bsc` one per example; the sequence scopes also span the `seq_len` positions."""
    shared = scope in ("c", "sc")
    lead = (1,) if shared else (batch,)
    return lead if scope in ("c", "bc") else (*lead, seq_len)


def init_sources(
    src_key: Key[Array, ""],
    term: int,
    table: SiteTable,
    scope: tuple[int, ...],
    dtype: DTypeLike = jnp.float32,
) -> Sources:
    """`U[0, 1)` in fp32, cast to `dtype`; site i draws from `split(fold_in(src_key, t), n)[i]`."""
    keys = jax.random.split(jax.random.fold_in(src_key, term), len(table.sites))
    out = []
    for g, grp in enumerate(table.c_groups):
        idx = jnp.asarray(table.c_group_indices(g))
        draw = partial(jax.random.uniform, shape=(*scope, grp.C + 1), dtype=jnp.float32)
        # lax.map: one RNG body per C group, no single draw spanning several sites (see init_vu).
        out.append(jax.lax.map(draw, keys[idx]).astype(dtype))
    return tuple(out)


def init_source_adam(sources: Sources, mu_dtype: DTypeLike = jnp.float32) -> SourceAdam:
    """Zero moments (distinct buffers: the step donates its state), the first in `mu_dtype`, the
    second in fp32, and a zero count."""
    adam = optax.scale_by_adam(mu_dtype=mu_dtype)
    state = adam.init(tuple(s.astype(jnp.float32) for s in sources))
    assert isinstance(state, optax.ScaleByAdamState)
    return state


def ascend(
    sources: Sources,
    state: SourceAdam,
    grads: Sources,
    lr: Float[Array, ""],
    b1: float,
    b2: float,
    eps: float,
) -> tuple[Sources, SourceAdam]:
    """S15: one Adam ascent step, `lr · m̂ / (sqrt(v̂) + eps)` (optax's `scale_by_adam`, eps
    after the sqrt), then the projection onto [0, 1]."""
    g32 = tuple(g.astype(jnp.float32) for g in grads)  # bf16 gradients: moment dtype first
    mu_dtype = jax.tree.leaves(state.mu)[0].dtype if sources else None  # keeps its dtype
    adam = optax.scale_by_adam(b1=b1, b2=b2, eps=eps, mu_dtype=mu_dtype)
    direction, new_state = adam.update(g32, state)
    assert isinstance(direction, tuple) and isinstance(new_state, optax.ScaleByAdamState)
    # Per C group: optax's projection takes scalar bounds only for a leaf, not for a tuple.
    new = tuple(
        optax.projections.projection_hypercube(s.astype(jnp.float32) + lr * d).astype(s.dtype)
        for s, d in zip(sources, direction, strict=True)
    )
    return new, new_state
