"""Per-site MLP CI functions `mlp`, `vector_mlp`, `shared_mlp` (SPEC §4).

Each is a single-site `hk.transform`; a shape group's parameters are that init vmapped over the
per-site keys, and its forward is the apply vmapped over the group (one RNG body per group).
"""

import itertools
import math
from collections.abc import Callable
from typing import Literal

import haiku as hk
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from pd.precision import current, matmul

PerSiteCIKind = Literal["mlp", "vector_mlp", "shared_mlp"]


def gelu(x: Float[Array, "*s"]) -> Float[Array, "*s"]:
    """Exact GELU `x Φ(x)` through `erf`, as PyTorch computes it; `jax.nn.gelu` goes through
    `erfc`, which XLA expands on a CPU to a several times costlier piecewise form."""
    return 0.5 * x * (1.0 + jax.lax.erf(x * math.sqrt(0.5)))


# XLA neither fuses across it nor shares work computed on either side (jax leaves it untyped).
_barrier: Callable[[tuple[Array, ...]], tuple[Array, ...]] = jax.lax.optimization_barrier


@jax.custom_vjp
def _input_layer(x: Float[Array, "N k"], w: Float[Array, "k n"]) -> Float[Array, "N n"]:
    """`x @ w` for the input layer of `vector_mlp`, whose weight gradient `xᵀ @ ∂out` reads `xᵀ`
    written out in memory (behind an `optimization_barrier`, so that XLA keeps it).

    Under plain autodiff XLA's CPU backend contracts the batch with both operands transposed
    and picks the wide `∂out` (`[N, C · hidden]`) as the one to transpose, a slow dot; `xᵀ` is
    `k` rows, a cheap copy, after which the dot takes row-major operands. The default TMS
    recipe's step took 0.83× the time, `tms_40-10`'s 0.81× (`docs/performance.md`)."""
    return x @ w


def _input_layer_fwd(
    x: Float[Array, "N k"], w: Float[Array, "k n"]
) -> tuple[Float[Array, "N n"], tuple[Float[Array, "N k"], Float[Array, "k n"]]]:
    return x @ w, (x, w)


def _input_layer_bwd(
    res: tuple[Float[Array, "N k"], Float[Array, "k n"]], g: Float[Array, "N n"]
) -> tuple[Float[Array, "N k"], Float[Array, "k n"]]:
    x, w = res
    (xT,) = _barrier((x.T,))
    return g @ w.T, xT @ g


_input_layer.defvjp(_input_layer_fwd, _input_layer_bwd)


@jax.custom_vjp
def gelu_out(h: Float[Array, "*L C H"], w: Float[Array, "C H"]) -> Float[Array, "*L C"]:
    """A subcomponent MLP's output layer of width 1 on its last GELU: `Σ_k gelu(h_k) w_k`.

    The gradient recomputes the GELU from `h`, once for `∂h` and once for `∂w`, behind
    `optimization_barrier`s. Plain autodiff lets XLA share one `erf` between the forward and
    both, which on a CPU writes and re-reads more `[*L, C, H]` arrays than recomputing costs:
    the TMS step took 0.91× the time, ResidMLP's 0.90× (`docs/performance.md`).
    """
    return jnp.sum(gelu(h) * w, axis=-1)


def _gelu_out_fwd(
    h: Float[Array, "*L C H"], w: Float[Array, "C H"]
) -> tuple[Float[Array, "*L C"], tuple[Float[Array, "*L C H"], Float[Array, "C H"]]]:
    return gelu_out(h, w), (h, w)


def _gelu_out_bwd(
    res: tuple[Float[Array, "*L C H"], Float[Array, "C H"]], g: Float[Array, "*L C"]
) -> tuple[Float[Array, "*L C H"], Float[Array, "C H"]]:
    h, w = _barrier(res)
    cdf = 0.5 * (1.0 + jax.lax.erf(h * math.sqrt(0.5)))
    dh = g[..., None] * w * (cdf + h * jnp.exp(-0.5 * h * h) / math.sqrt(2 * math.pi))
    h2, g2 = _barrier((res[0], g))  # ∂w's own GELU, in its own fusion
    return dh, jnp.sum(gelu(h2) * g2[..., None], axis=tuple(range(g.ndim - 1)))


gelu_out.defvjp(_gelu_out_fwd, _gelu_out_bwd)


def _kaiming(fan_in: int, gain: float) -> hk.initializers.Initializer:
    """Kaiming-normal fan-in: N(0, gain² / fan_in)."""
    return hk.initializers.RandomNormal(stddev=gain / math.sqrt(fan_in))


def _layer(
    a: Float[Array, "..."], w: Float[Array, "C fan_in fan_out"], shared_input: bool
) -> Float[Array, "... C fan_out"]:
    """One layer of the per-subcomponent MLPs, without its bias.

    A layer of width 1 on either side is a broadcast product (and a sum), not a batched dot: as
    a dot over C, XLA transposes the `[B, C, hidden]` activations on a CPU.
    """
    C, fan_in, _ = w.shape
    if shared_input:  # one matmul [*L, k] @ [k, C * width]
        w2 = w.transpose(1, 0, 2).reshape(fan_in, -1)
        a2 = a.reshape(-1, fan_in)
        # bf16 keeps its own gradient, where this layout gained nothing
        out = matmul(a2, w2) if current() == "bf16" else _input_layer(a2, w2)
        return out.reshape(*a.shape[:-1], C, -1)
    if fan_in == 1:
        return a * w[:, 0]
    if w.shape[-1] == 1:
        return jnp.sum(a * w[..., 0], axis=-1, keepdims=True)
    return jnp.einsum("...ci,cio->...co", a, w)


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
    h = x  # each layer's pre-activation
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        last = i == len(sizes) - 2
        gain = 1.0 if last else math.sqrt(2.0)
        w = hk.get_parameter(f"w{i}", (C, fan_in, fan_out), init=_kaiming(fan_in, gain))
        b = hk.get_parameter(f"b{i}", (C, fan_out), init=jnp.zeros)
        if i == 0:
            h = _layer(h, w, shared_input) + b
        elif last:  # the last GELU and this output layer of width 1 as one function
            h = gelu_out(h, w[..., 0])[..., None] + b
        else:
            h = _layer(gelu(h), w, False) + b
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
    """`hk.Transformed` mapping one site's network input to CI logits `[*L, C]`: its inner
    activations `x @ V` (`[*L, C]`) for `mlp`, its input `x` (`[*L, d_in]`) otherwise."""

    def forward(a: Float[Array, "*L _"]) -> Float[Array, "*L C"]:
        with hk.name_scope(kind):
            if kind == "mlp":
                # The scalar inner activation of each subcomponent is its MLP's only input.
                return _per_subcomponent_mlp(a[..., None], widths, C, False)
            if kind == "vector_mlp":
                return _per_subcomponent_mlp(a, widths, C, True)
            return _shared_mlp(a, widths, C)

    net: hk.Transformed = hk.without_apply_rng(hk.transform(forward))
    return net
