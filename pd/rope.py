"""Rotate-half rotary position embeddings, shared by the Llama target and the chunkwise CI
function. The frequencies are NumPy constants, never parameters (S27; PITFALLS 6)."""

import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import DTypeLike
from jaxtyping import Float


def rope_tables(
    T: int, head_dim: int, base: float, dtype: DTypeLike
) -> tuple[Float[Array, "T half"], Float[Array, "T half"]]:
    """cos/sin of positions 0..T-1 at frequencies `1 / base^(2j / head_dim)`, computed in fp32
    (as Hugging Face does: the angles a checkpoint was trained with), then cast to `dtype`."""
    inv_freq = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    angles = np.outer(np.arange(T, dtype=np.float32), inv_freq)
    return jnp.asarray(np.cos(angles), dtype), jnp.asarray(np.sin(angles), dtype)


def rope(
    x: Float[Array, "B T H D"], cos: Float[Array, "T half"], sin: Float[Array, "T half"]
) -> Float[Array, "B T H D"]:
    """Rotate-half RoPE per head: `cat(x1·cos − x2·sin, x2·cos + x1·sin)` over the two halves."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
