"""`U[0, 1)` and Bernoulli draws equal bit for bit to `jax.random.uniform` and
`jax.random.bernoulli`, with JAX's hash written out so that XLA can vectorize it on a CPU.

JAX draws a threefry key's bits as Threefry-2x32 (20 rounds) of each element's row-major index.
On a CPU it lowers that hash as a loop of five trips, to keep compiles short, with the rotation
amounts carried through the loop: about 9 ns per element on a 2-core machine, against 2.5 ns
with the rounds unrolled and constant rotations, as here. On accelerators JAX's own lowering is
already unrolled, so other backends draw with JAX. A TMS 5-2 step (four `[B, 21]` sources and
its batch) took 0.79× the time at batch 1024 and 0.82× at 4096 (`bench/draws.py`;
`docs/performance.md`). The keys still come from `jax.random.fold_in` and `split`.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, Key, UInt32

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)  # Threefry's key-schedule constant


def _threefry2x32(
    key: UInt32[Array, "2"], x0: UInt32[Array, " n"], x1: UInt32[Array, " n"]
) -> tuple[UInt32[Array, " n"], UInt32[Array, " n"]]:
    """Threefry-2x32 with 20 rounds (Salmon et al. 2011): 4 rounds, then a key injection, 5×."""
    ks = (key[0], key[1], key[0] ^ key[1] ^ _PARITY)
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = ((x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))) ^ x0
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def bits(key: Key[Array, ""], shape: tuple[int, ...]) -> UInt32[Array, "..."]:
    """`jax.random.bits(key, shape)` as JAX draws it by default (`jax_threefry_partitionable`):
    for a threefry key, the two words of the hash of each element's row-major index (high word 0
    below 2³² elements) xor-ed. Other keys and backends go to JAX."""
    n = math.prod(shape)
    if jax.default_backend() != "cpu" or jax.random.key_impl(key) != "threefry2x32" or n >= 2**32:
        return jax.random.bits(key, shape)
    half = (n + 1) // 2

    def hash_half(h: Int[Array, ""]) -> UInt32[Array, " half"]:
        index = jax.lax.iota(jnp.uint32, half) + h.astype(jnp.uint32) * np.uint32(half)
        hi, lo = _threefry2x32(jax.random.key_data(key), jnp.zeros_like(index), index)
        return hi ^ lo

    # Two halves as a loop, because a loop's outputs are materialized: the hash runs once per
    # element, where XLA would otherwise fuse it into every fusion that reads the draw (about
    # five per mask source) and the step gained half as much. A loop of one trip XLA inlines.
    halves: UInt32[Array, "2 half"] = jax.lax.map(hash_half, jnp.arange(2))
    return halves.reshape(-1)[:n].reshape(shape)


def uniform(
    key: Key[Array, ""], shape: tuple[int, ...], minval: float = 0.0, maxval: float = 1.0
) -> Float[Array, "..."]:
    """`jax.random.uniform(key, shape, jnp.float32, minval, maxval)`: 23 random mantissa bits
    under the exponent of 1, minus 1, scaled."""
    mantissa = (bits(key, shape) >> np.uint32(9)) | np.uint32(0x3F800000)
    floats = jax.lax.bitcast_convert_type(mantissa, jnp.float32) - 1.0
    return jnp.maximum(minval, floats * (maxval - minval) + minval)


def bernoulli(key: Key[Array, ""], p: float, shape: tuple[int, ...]) -> Bool[Array, "..."]:
    """`jax.random.bernoulli(key, p, shape)`."""
    return uniform(key, shape) < p
