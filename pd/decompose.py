"""The math of one site (SPEC §3)."""

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float


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
) -> Float[Array, "*L d_out"]:
    """`[*L, d_out]`: a live site's output; `None` masks are ones, `None` route is everywhere."""
    inner = x @ V
    ones = jnp.ones(inner.shape[:-1], inner.dtype)
    delta = ones if delta_mask is None else delta_mask
    # masked·inner@U + delta·(x@W − inner@U) = (inner·(mask − delta))@U + delta·(x@W): one
    # [C, d_out] matmul instead of two; the [d_in, d_out] delta matrix is never formed (SPEC §3).
    coeff = (1.0 if mask is None else mask) - delta[..., None]
    y = (inner * coeff) @ U + delta[..., None] * (x @ W)
    if route is None:
        return y
    return jnp.where(route[..., None], y, x @ W)
