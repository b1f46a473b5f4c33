"""The compute dtype of a step's matmuls (`train.compute_dtype`), set at trace time.

Under `compute("bf16")` every matmul pd writes (`matmul`: the sites, the frozen path, the toy
targets' own matmuls, the CI functions' input layers) casts both operands to bfloat16 and
accumulates in float32; parameters, optimizer state, elementwise work and the losses stay
float32. Outside it (the default, SPEC N3) `matmul` is `a @ b`.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, BFloat16, Float

ComputeDtype = Literal["fp32", "bf16"]
DTYPES: dict[ComputeDtype, jnp.dtype] = {
    "fp32": jnp.dtype(jnp.float32),
    "bf16": jnp.dtype(jnp.bfloat16),
}

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


def matmul(
    a: Float[Array, "*s k"], b: Float[Array, "k n"], out_dtype: DTypeLike | None = None
) -> Float[Array, "*s n"]:
    """`a @ b`; in bf16 compute, of the bf16-rounded operands accumulated in float32, in `a @ b`'s
    own dtype (or `out_dtype`), and so are the two matmuls of its gradient. An operand already
    in bfloat16 (a frozen weight held so) is used as it is, never widened."""
    if current() == "fp32":
        if out_dtype is None:
            return a @ b
        return jnp.matmul(a, b, preferred_element_type=out_dtype)
    a, b = _varying_alike(_operand(a), _operand(b))
    out: Float[Array, "*s n"] = _bf16_matmul(a, b, a.dtype, b.dtype)
    return out.astype(jnp.result_type(a, b) if out_dtype is None else out_dtype)


def _varying_alike(
    a: Float[Array, "*s k"], b: Float[Array, "k n"]
) -> tuple[Float[Array, "*s k"], Float[Array, "k n"]]:
    """`a` and `b`, each made varying over the manual mesh axes (inside `shard_map`) over which
    the other varies. A custom VJP must give each operand's cotangent that operand's type, and a
    shared operand's (a frozen weight's, in a sweep over members) would vary with the other's;
    cast outside the custom VJP, jax's own transpose of the cast sums it over those axes."""
    axes = _varying(a) | _varying(b)

    def cast(x: Array) -> Array:
        missing = tuple(sorted(axes - _varying(x)))
        return jax.lax.pcast(x, missing, to="varying") if missing else x

    return cast(a), cast(b)


def _varying(x: Array) -> frozenset[str]:
    """The manual mesh axes over which `x` varies (none outside `shard_map`)."""
    return frozenset(jax.typeof(x).manual_axis_type.varying)


def _operand(x: Float[Array, "*s"]) -> Float[Array, "*s"]:
    return x if x.dtype == jnp.bfloat16 else x.astype(jnp.float32)


def _rounded(x: Float[Array, "*s"]) -> BFloat16[Array, "*s"]:
    return x if x.dtype == jnp.bfloat16 else to_bf16(x)


def to_bf16(x: Float[Array, "*s"]) -> BFloat16[Array, "*s"]:
    """`x.astype(bfloat16)` for a float32 `x`, bit for bit (round to nearest even, NaNs
    included), written as integer operations: XLA's CPU backend emits a lone float32-to-bfloat16
    `convert` as a tiled loop through stack buffers, and this one as an ordinary elementwise
    loop, about twice as fast (`docs/performance.md`)."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    quiet_nan = (bits & jnp.uint32(0xFF800000)) | 0x400000  # its sign kept, as XLA's convert
    upper = (jnp.where(jnp.isnan(x), quiet_nan, rounded) >> 16).astype(jnp.uint16)
    out: BFloat16[Array, "*s"] = jax.lax.bitcast_convert_type(upper, jnp.bfloat16)
    return out


# jax.lax.optimization_barrier is untyped; on one array it returns that array.
_barrier: Callable[[Array], Array] = jax.lax.optimization_barrier

Residuals = tuple[BFloat16[Array, "..."], BFloat16[Array, "k n"]]


def _transposed(x: Float[Array, "m k"]) -> BFloat16[Array, "k m"]:
    """`x.T` rounded to bfloat16 in memory: the barrier keeps XLA from folding the transpose
    into the dot that reads it. Rounded from the float32 `x` in the same pass, not copied from
    its rounded twin: that copy made the ResidMLP-1 bf16 step 1.05× slower."""
    return _barrier(_rounded(x.T))


def _fwd(
    a: Float[Array, "*s k"], b: Float[Array, "k n"], a_dtype: jnp.dtype, b_dtype: jnp.dtype
) -> tuple[Float[Array, "*s n"], Residuals]:
    # The backward keeps the rounded operands, not the float32 ones: half the memory, and no
    # second conversion of each activation (5-7 % of a ResidMLP-1 step on a CPU). The weight
    # gradient contracts the rows of `a` and of the cotangent, and XLA's CPU backend has bf16
    # kernels only for a left operand contracted on its last axis (it computes the others in
    # float32), so one of the two is transposed in memory: `a` here when it is the narrower.
    k, n = b.shape
    del a_dtype, b_dtype
    a16, b16 = _rounded(a), _rounded(b)
    out = jnp.matmul(a16, b16, preferred_element_type=jnp.float32)
    return out, ((_transposed(a.reshape(-1, k)) if k <= n else a16), b16)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _bf16_matmul(
    a: Float[Array, "*s k"], b: Float[Array, "k n"], a_dtype: jnp.dtype, b_dtype: jnp.dtype
) -> Float[Array, "*s n"]:
    """`a @ b` of bf16-rounded operands in float32; the gradients come back in the operands'
    dtypes (`a_dtype`, `b_dtype`: float32, or bfloat16 for an operand held so)."""
    return _fwd(a, b, a_dtype, b_dtype)[0]


def _bwd(
    a_dtype: jnp.dtype, b_dtype: jnp.dtype, res: Residuals, g: Float[Array, "*s n"]
) -> tuple[Float[Array, "*s k"], Float[Array, "k n"]]:
    a_res, b16 = res
    k, n = b16.shape
    f32 = jnp.float32
    g16 = to_bf16(g)
    ga = jax.lax.dot_general(
        g16, b16, (((g.ndim - 1,), (1,)), ((), ())), preferred_element_type=f32
    )
    if k <= n:  # a_res is aᵀ, [k, rows]
        gb = jnp.matmul(a_res, g16.reshape(-1, n), preferred_element_type=f32)
    else:  # the cotangent is the narrower: gbᵀ = gᵀ a, an [n, k] array transposed back (behind
        # a barrier too, or XLA folds that transpose into the dot's operands)
        gbT = jnp.matmul(
            _transposed(g.reshape(-1, n)), a_res.reshape(-1, k), preferred_element_type=f32
        )
        gb = _barrier(gbT).T
    return ga.astype(a_dtype), gb.astype(b_dtype)


_bf16_matmul.defvjp(_fwd, _bwd)
