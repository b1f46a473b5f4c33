"""Persistent adversarial sources: stacked per C group, ascended by Adam with a clamp (SPEC §6)."""

from functools import partial
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, Float, Int, Key

from pd.sites import SiteTable

Scope = Literal["c", "bc", "sc", "bsc"]
Sources = tuple[Float[Array, "_n ... _Cp1"], ...]


class SourceAdam(NamedTuple):
    """Adam moments (fp32) and the number of updates so far (for bias correction)."""

    m: tuple[Float[Array, "_n ... _Cp1"], ...]
    v: tuple[Float[Array, "_n ... _Cp1"], ...]
    n_updates: Int[Array, ""]


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


def init_source_adam(sources: Sources) -> SourceAdam:
    # m and v must be distinct buffers: the step donates its state.
    m = tuple(jnp.zeros(s.shape, jnp.float32) for s in sources)
    v = tuple(jnp.zeros(s.shape, jnp.float32) for s in sources)
    return SourceAdam(m, v, jnp.zeros((), jnp.int32))


def ascend(
    sources: Sources,
    state: SourceAdam,
    grads: Sources,
    lr: Float[Array, ""],
    b1: float,
    b2: float,
    eps: float,
) -> tuple[Sources, SourceAdam]:
    """S15: one Adam ascent step, `lr · m̂ / (sqrt(v̂) + eps)`, then clamp to [0, 1]."""
    n_updates = state.n_updates + 1
    t = n_updates.astype(jnp.float32)
    new_src, new_m, new_v = [], [], []
    for src, m, v, g in zip(sources, state.m, state.v, grads, strict=True):
        g = g.astype(m.dtype)  # bf16 gradients are cast to the moment dtype first
        m = b1 * m + (1.0 - b1) * g
        v = b2 * v + (1.0 - b2) * g * g
        update = lr * (m / (1.0 - b1**t)) / (jnp.sqrt(v / (1.0 - b2**t)) + eps)
        new_src.append(jnp.clip(src.astype(jnp.float32) + update, 0.0, 1.0).astype(src.dtype))
        new_m.append(m)
        new_v.append(v)
    return tuple(new_src), SourceAdam(tuple(new_m), tuple(new_v), n_updates)
