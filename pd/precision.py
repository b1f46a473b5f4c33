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
from jaxtyping import Array, Float

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


def matmul(a: Float[Array, "*s k"], b: Float[Array, "k n"]) -> Float[Array, "*s n"]:
    """`a @ b`; in bf16 compute, of the bf16-rounded operands accumulated in float32, in `a @ b`'s
    own dtype, and so are the two matmuls of its gradient."""
    if _dtype[-1] == "fp32":
        return a @ b
    out: Float[Array, "*s n"] = _bf16_matmul(a, b).astype(jnp.result_type(a, b))
    return out


def _dot(a: Float[Array, "*s k"], b: Float[Array, "k n"]) -> Float[Array, "*s n"]:
    bf16 = jnp.bfloat16
    return jnp.matmul(a.astype(bf16), b.astype(bf16), preferred_element_type=jnp.float32)


Residuals = tuple[Float[Array, "*s k"], Float[Array, "k n"]]


@jax.custom_vjp
def _bf16_matmul(a: Float[Array, "*s k"], b: Float[Array, "k n"]) -> Float[Array, "*s n"]:
    return _dot(a, b)


def _fwd(a: Float[Array, "*s k"], b: Float[Array, "k n"]) -> tuple[Float[Array, "*s n"], Residuals]:
    return _dot(a, b), (a, b)


def _bwd(res: Residuals, g: Float[Array, "*s n"]) -> Residuals:
    a, b = res
    ga = _dot(g, b.T).astype(a.dtype)
    gb = _dot(a.reshape(-1, a.shape[-1]).T, g.reshape(-1, g.shape[-1])).astype(b.dtype)
    return ga, gb


_bf16_matmul.defvjp(_fwd, _bwd)
