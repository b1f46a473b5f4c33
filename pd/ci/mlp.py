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

PerSiteCIKind = Literal["mlp", "vector_mlp", "shared_mlp"]


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
        equation = "...i,cio->...co" if i == 0 and shared_input else "...ci,cio->...co"
        h = jnp.einsum(equation, h, w) + b
        if not last:
            h = jax.nn.gelu(h, approximate=False)
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
        h = h @ w + b
        if not last:
            h = jax.nn.gelu(h, approximate=False)
    return h


def site_ci_transform(kind: PerSiteCIKind, widths: tuple[int, ...], C: int) -> hk.Transformed:
    """`hk.Transformed` mapping one site's `(x [*L, d_in], V [d_in, C])` to CI logits `[*L, C]`."""

    def forward(x: Float[Array, "*L d_in"], V: Float[Array, "d_in C"]) -> Float[Array, "*L C"]:
        with hk.name_scope(kind):
            if kind == "mlp":
                # The scalar inner activation of each subcomponent is its MLP's only input.
                return _per_subcomponent_mlp((x @ V)[..., None], widths, C, False)
            if kind == "vector_mlp":
                return _per_subcomponent_mlp(x, widths, C, True)
            return _shared_mlp(x, widths, C)

    net: hk.Transformed = hk.without_apply_rng(hk.transform(forward))
    return net
