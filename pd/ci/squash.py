"""The two leaky-hard squashings of CI logits (SPEC S5, S6)."""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

ALPHA = 0.01


@jax.custom_vjp
def lower_leaky_hard(x: Float[Array, "*s"]) -> Float[Array, "*s"]:
    """`clip(x, 0, 1)` forward; the gradient-sign-gated leaky backward of S6."""
    return jnp.clip(x, 0.0, 1.0)


def _lower_fwd(x: Float[Array, "*s"]) -> tuple[Float[Array, "*s"], Float[Array, "*s"]]:
    return jnp.clip(x, 0.0, 1.0), x


def _lower_bwd(x: Float[Array, "*s"], g: Float[Array, "*s"]) -> tuple[Float[Array, "*s"]]:
    # x <= 0: leak only a negative upstream gradient (which would raise x under descent), so a
    # dead subcomponent can come back but is never pushed further below zero.
    below = jnp.where(g < 0, ALPHA * g, 0.0)
    inside = g
    return (jnp.where(x <= 0, below, jnp.where(x <= 1, inside, 0.0)),)


lower_leaky_hard.defvjp(_lower_fwd, _lower_bwd)


def upper_leaky_hard(x: Float[Array, "*s"]) -> Float[Array, "*s"]:
    """`1 + α(x − 1)` above 1, 0 below 0, `x` between; ordinary autodiff (S6).

    Written with `where`, not `clip`: `clip`'s gradient is 0.5 at x = 0 and x = 1, where the
    reference's `torch.clamp` gives 1, and with zero-initialized CI biases the logits of
    all-zero toy inputs sit exactly at x = 0 on the first step.
    """
    return jnp.where(x > 1, 1.0 + ALPHA * (x - 1.0), jnp.where(x < 0, 0.0, x))
