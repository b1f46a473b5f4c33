"""The compute dtype of a step's matmuls (`train.compute_dtype`), set at trace time.

Under `compute("bf16")` every matmul pd writes (`matmul`: the sites, the frozen path, the toy
targets' own matmuls, the CI functions' input layers) casts both operands to bfloat16 and
accumulates in float32; parameters, optimizer state, elementwise work and the losses stay
float32. Outside it (the default, SPEC N3) `matmul` is `a @ b`.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array, BFloat16, Float

ComputeDtype = Literal["fp32", "bf16"]

_dtype: list[ComputeDtype] = ["fp32"]


@contextmanager
def compute(dtype: ComputeDtype) -> Iterator[None]:
    """Trace the matmuls inside the block in `dtype`."""
    _dtype.append(dtype)
    try:
        yield
    finally:
        _dtype.pop()


def current() -> ComputeDtype:
    """The compute dtype being traced."""
    return _dtype[-1]


def matmul(a: Float[Array, "*s k"], b: Float[Array, "k n"]) -> Float[Array, "*s n"]:
    """`a @ b`; in bf16 compute, of the bf16-rounded operands accumulated in float32, in `a @ b`'s
    own dtype, and so are the two matmuls of its gradient."""
    if current() == "fp32":
        return a @ b
    f32 = jnp.float32
    out: Float[Array, "*s n"] = _bf16_matmul(a.astype(f32), b.astype(f32))
    return out.astype(jnp.result_type(a, b))


def to_bf16(x: Float[Array, "*s"]) -> BFloat16[Array, "*s"]:
    """`x.astype(bfloat16)` for a float32 `x`, bit for bit (round to nearest even, NaNs
    included), written as integer operations: XLA's CPU backend emits a lone float32-to-bfloat16
    `convert` as a tiled loop through stack buffers, and this one as an ordinary elementwise
    loop, about twice as fast (README, "bf16 gains little")."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    quiet_nan = (bits & jnp.uint32(0xFF800000)) | 0x400000  # its sign kept, as XLA's convert
    upper = (jnp.where(jnp.isnan(x), quiet_nan, rounded) >> 16).astype(jnp.uint16)
    out: BFloat16[Array, "*s"] = jax.lax.bitcast_convert_type(upper, jnp.bfloat16)
    return out


Residuals = tuple[BFloat16[Array, "*s k"], BFloat16[Array, "k n"]]


def _fwd(a: Float[Array, "*s k"], b: Float[Array, "k n"]) -> tuple[Float[Array, "*s n"], Residuals]:
    # The backward keeps the rounded operands, not the float32 ones: half the memory, and no
    # second conversion of each activation (5-7 % of a ResidMLP-1 step on a CPU).
    a16, b16 = to_bf16(a), to_bf16(b)
    return jnp.matmul(a16, b16, preferred_element_type=jnp.float32), (a16, b16)


@jax.custom_vjp
def _bf16_matmul(a: Float[Array, "*s k"], b: Float[Array, "k n"]) -> Float[Array, "*s n"]:
    return _fwd(a, b)[0]


def _bwd(
    res: Residuals, g: Float[Array, "*s n"]
) -> tuple[Float[Array, "*s k"], Float[Array, "k n"]]:
    a16, b16 = res
    g16 = to_bf16(g)  # once, for both matmuls
    ga = jax.lax.dot_general(
        g16, b16, (((g.ndim - 1,), (1,)), ((), ())), preferred_element_type=jnp.float32
    )
    a2, g2 = a16.reshape(-1, a16.shape[-1]), g16.reshape(-1, g16.shape[-1])
    gb = jax.lax.dot_general(a2, g2, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    return ga, gb


_bf16_matmul.defvjp(_fwd, _bwd)
