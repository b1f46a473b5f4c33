"""Per-site MLP CI functions `mlp`, `vector_mlp`, `shared_mlp` (SPEC §4).

Each is a single-site `hk.transform`; a shape group's parameters are that init vmapped over the
per-site keys, and its forward is the apply vmapped over the group (one RNG body per group).
"""

import itertools
import math
from typing import Literal

import haiku as hk
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from pd.precision import matmul

PerSiteCIKind = Literal["mlp", "vector_mlp", "shared_mlp"]


def gelu(x: Float[Array, "*s"]) -> Float[Array, "*s"]:
    """Exact GELU `x Φ(x)` through `erf`, as PyTorch computes it; `jax.nn.gelu` goes through
    `erfc`, which XLA expands on a CPU to a several times costlier piecewise form."""
    return 0.5 * x * (1.0 + jax.lax.erf(x * math.sqrt(0.5)))


def _kaiming(fan_in: int, gain: float) -> hk.initializers.Initializer:
    """Kaiming-normal fan-in: N(0, gain² / fan_in)."""
    return hk.initializers.RandomNormal(stddev=gain / math.sqrt(fan_in))


def _per_subcomponent_mlp(
    x: Float[Array, "..."],
    widths: tuple[int, ...],
    C: int,
    shared_input: bool,
) -> Float[Array, "*L C"]:
    """Independent MLPs, one per subcomponent: `k → widths… → 1` (weights `[C, fan_in, fan_out]`).

    `x` is `[*L, C, k]` (a separate input per subcomponent) or `[*L, k]` (one input shared by all).
    """
    sizes = (x.shape[-1], *widths, 1)
    h = x
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        last = i == len(sizes) - 2
        gain = 1.0 if last else math.sqrt(2.0)
        w = hk.get_parameter(f"w{i}", (C, fan_in, fan_out), init=_kaiming(fan_in, gain))
        b = hk.get_parameter(f"b{i}", (C, fan_out), init=jnp.zeros)
        # A layer of width 1 on either side is a broadcast product (and a sum), not a batched
        # dot: as a dot over C, XLA transposes the `[B, C, hidden]` activations on a CPU.
        if i == 0 and shared_input:  # one matmul [*L, k] @ [k, C * width]
            h = matmul(h, w.transpose(1, 0, 2).reshape(fan_in, -1)).reshape(*h.shape[:-1], C, -1)
        elif fan_in == 1:
            h = h * w[:, 0]
        elif fan_out == 1:
            h = jnp.sum(h * w[..., 0], axis=-1, keepdims=True)
        else:
            h = jnp.einsum("...ci,cio->...co", h, w)
        h = h + b
        if not last:
            h = gelu(h)
    return h[..., 0]


def _shared_mlp(
    h: Float[Array, "*L d_in"], widths: tuple[int, ...], C: int
) -> Float[Array, "*L C"]:
    """One MLP per site: `d_in → widths… → C`."""
    sizes = (h.shape[-1], *widths, C)
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        last = i == len(sizes) - 2
        gain = 1.0 if last else math.sqrt(2.0)
        w = hk.get_parameter(f"w{i}", (fan_in, fan_out), init=_kaiming(fan_in, gain))
        b = hk.get_parameter(f"b{i}", (fan_out,), init=jnp.zeros)
        h = matmul(h, w) + b
        if not last:
            h = gelu(h)
    return h


def site_ci_transform(kind: PerSiteCIKind, widths: tuple[int, ...], C: int) -> hk.Transformed:
    """`hk.Transformed` mapping one site's `(x [*L, d_in], V [d_in, C])` to CI logits `[*L, C]`."""

    def forward(x: Float[Array, "*L d_in"], V: Float[Array, "d_in C"]) -> Float[Array, "*L C"]:
        with hk.name_scope(kind):
            if kind == "mlp":
                # The scalar inner activation of each subcomponent is its MLP's only input.
                return _per_subcomponent_mlp(matmul(x, V)[..., None], widths, C, False)
            if kind == "vector_mlp":
                return _per_subcomponent_mlp(x, widths, C, True)
            return _shared_mlp(x, widths, C)

    net: hk.Transformed = hk.without_apply_rng(hk.transform(forward))
    return net
