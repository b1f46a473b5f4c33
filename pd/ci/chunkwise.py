"""The chunkwise-transformer CI function (SPEC §4.1): one pre-norm bidirectional transformer per
chunk of sites, parameters stacked on a leading `n_chunks` axis and applied with `lax.scan`."""

import itertools
import math
from dataclasses import dataclass

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Key

from pd import loops
from pd.ci import CI, GroupParams, Inner, KeyPath, LogicalAxes, Taps, squash
from pd.precision import matmul
from pd.rope import rope, rope_tables
from pd.shard import gathered, stored
from pd.sites import SiteTable

ROPE_BASE = 10000.0

# Logical axes (`pd.shard`) of one chunk's weights, by parameter name (after the leading
# `chunks` axis). Megatron-style on `model`: a matmul into the wide space (d_model, heads, mlp)
# splits its output columns, one out of it splits its input rows, so a pair needs one reduction
# and no gather. The other axis (`fsdp`) is split over `data` in storage and gathered inside the
# scanned chunk body, one chunk at a time.
WEIGHT_AXES: dict[str, tuple[str | None, ...]] = {
    "w_in": ("fsdp", "wide"),  # [input_dim, d_model]
    "q": ("fsdp", "wide"),  # [d_model, d_model]: output columns are heads
    "k": ("fsdp", "wide"),
    "v": ("fsdp", "wide"),
    "o": ("wide", "fsdp"),  # [d_model, d_model]: input rows are heads
    "mlp_in": ("fsdp", "wide"),  # [d_model, mlp_hidden]
    "mlp_out": ("wide", "fsdp"),  # [mlp_hidden, d_model]
    "w_out": ("wide", "fsdp"),  # [d_model, ΣC]
}
BIASES = frozenset({"w_in_b", "mlp_in_b", "mlp_out_b", "w_out_b"})  # small: replicated


def weight_axes(name: str, ndim: int) -> tuple[str | None, ...] | None:
    """One chunk's parameter's logical axes (a bias: none), None for an unknown name."""
    if name in BIASES:
        return (None,) * ndim
    return WEIGHT_AXES.get(name)


@dataclass(frozen=True)
class Chunk:
    """The layers whose entering residual stream a chunk reads (concatenated in order) and the
    sites it predicts (in slot order)."""

    layers: tuple[int, ...]
    sites: tuple[str, ...]


@dataclass(frozen=True)
class ChunkwiseTransformer:
    """Homogeneous chunks: equal input width and the identical per-slot C tuple (asserted)."""

    chunks: tuple[Chunk, ...]
    d_resid: int  # width of the residual stream
    site_C: tuple[tuple[str, int], ...]  # C of every site
    d_model: int
    n_blocks: int
    n_heads: int
    mlp_hidden: int

    def __post_init__(self) -> None:
        Cs = dict(self.site_C)
        widths = {len(c.layers) * self.d_resid for c in self.chunks}
        slots = {tuple(Cs[s] for s in c.sites) for c in self.chunks}
        if len(widths) != 1:
            raise ValueError(f"chunks have input widths {sorted(widths)}, expected one width")
        if len(slots) != 1:
            raise ValueError(
                f"chunks have per-slot C tuples {sorted(slots)}, expected one tuple in one order"
            )
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(
                f"d_model {self.d_model} must split into {self.n_heads} heads of even width"
            )
        for name, value in (
            ("d_model", self.d_model),
            ("n_blocks", self.n_blocks),
            ("n_heads", self.n_heads),
            ("mlp_hidden", self.mlp_hidden),
        ):
            if value <= 0:
                raise ValueError(f"chunkwise transformer {name} is {value}, expected > 0")

    @property
    def input_dim(self) -> int:
        return len(self.chunks[0].layers) * self.d_resid

    @property
    def slot_C(self) -> tuple[int, ...]:
        Cs = dict(self.site_C)
        return tuple(Cs[s] for s in self.chunks[0].sites)

    def param_axes(self, path: KeyPath, ndim: int) -> LogicalAxes:
        """A stacked parameter's axes: `chunks`, then its own by name (`WEIGHT_AXES`; a bias
        has none); ValueError for a name in neither."""
        name = str(getattr(path[-1], "key", path[-1]))
        axes = weight_axes(name, ndim - 1)
        if axes is None:
            raise ValueError(
                f"chunkwise CI parameter {name} has no logical axes, expected one of "
                f"{sorted(WEIGHT_AXES)} or a bias"
            )
        return ("chunks", *axes)

    def net(self) -> hk.Transformed:
        """One chunk: `[B, T, input_dim]` → per-slot logits `[B, T, C_j]`."""
        d, heads, slot_C = self.d_model, self.n_heads, self.slot_C
        head_dim = d // heads

        def linear(name: str, h: Array, n_out: int, std: float, bias: bool) -> Array:
            w = hk.get_parameter(name, (h.shape[-1], n_out), init=hk.initializers.RandomNormal(std))
            out = matmul(h, w)
            if bias:
                out = out + hk.get_parameter(f"{name}_b", (n_out,), init=jnp.zeros)
            return out

        def forward(h: Float[Array, "B T input_dim"]) -> tuple[Float[Array, "B T _C"], ...]:
            h = linear("w_in", h, d, math.sqrt(2.0 / h.shape[-1]), bias=True)
            T = h.shape[-2]
            # S27: a constant shared by every chunk, never a parameter.
            cos, sin = rope_tables(T, head_dim, ROPE_BASE, jnp.float32)
            qkv_init = hk.initializers.RandomUniform(-1 / math.sqrt(d), 1 / math.sqrt(d))
            for i in range(self.n_blocks):
                with hk.name_scope(f"block_{i}"):
                    x = rms_norm(h)
                    q, k, v = (
                        matmul(x, hk.get_parameter(n, (d, d), init=qkv_init)).reshape(
                            *x.shape[:-1], heads, head_dim
                        )
                        for n in ("q", "k", "v")
                    )
                    q, k = rope(q, cos, sin), rope(k, cos, sin)
                    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
                    attn = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
                    o = hk.get_parameter("o", (d, d), init=qkv_init)
                    h = h + matmul(attn.reshape(x.shape), o)
                    x = rms_norm(h)
                    x = jax.nn.gelu(
                        linear("mlp_in", x, self.mlp_hidden, math.sqrt(2.0 / d), True),
                        approximate=False,
                    )
                    h = h + linear("mlp_out", x, d, math.sqrt(1.0 / self.mlp_hidden), True)
            # One glued [d_model, ΣC] draw, sliced per slot.
            logits = linear("w_out", h, sum(slot_C), math.sqrt(1.0 / d), bias=True)
            bounds = np.cumsum((0, *slot_C))
            return tuple(logits[..., a:b] for a, b in itertools.pairwise(bounds))

        net: hk.Transformed = hk.without_apply_rng(hk.transform(forward))
        return net

    def init(self, ci_key: Key[Array, ""]) -> GroupParams:
        """Chunk i's parameters from `fold_in(ci_key, i)`, vmapped: one RNG body (I2)."""
        keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
            ci_key, jnp.arange(len(self.chunks), dtype=jnp.uint32)
        )
        x = jnp.zeros((1, 1, self.input_dim), jnp.float32)
        return (jax.vmap(self.net().init, in_axes=(0, None))(keys, x),)

    def apply(
        self, params: GroupParams, resid: Float[Array, "_L B T _d"]
    ) -> tuple[Float[Array, "n_chunks B T _C"], ...]:
        """Per slot, the logits of every chunk `[n_chunks, B, T, C_j]`: chunks run under
        `lax.scan` over the stacked parameters, each reading its layers of `resid`."""
        layers = jnp.asarray([c.layers for c in self.chunks])  # [n_chunks, layers per chunk]
        h = rms_norm(resid[layers])  # [n_chunks, k, B, T, d]
        n, k, B, T, d = h.shape
        inputs = jnp.moveaxis(h, 1, -2).reshape(n, B, T, k * d)  # each chunk's taps, concatenated
        net = self.net()

        # Checkpointed: the backward recomputes a chunk (its weights' gather included) instead
        # of keeping every chunk's activations and gathered weights as residuals.
        @jax.checkpoint
        def body(carry: None, xs: tuple[hk.Params, Array]) -> tuple[None, tuple[Array, ...]]:
            chunk_params, h = xs
            whole = {
                m: {n: gathered(_what(m, n), v, _axes(n, v)) for n, v in p.items()}
                for m, p in chunk_params.items()
            }
            return None, net.apply(whole, h)

        chunks = {  # the storage layout, so that the gradients are built sharded (`stored`)
            m: {n: stored(_what(m, n), v, ("chunks", *_axes(n, v[0]))) for n, v in p.items()}
            for m, p in params[0].items()
        }
        _, per_slot = loops.scan(body, None, (chunks, inputs))
        return tuple(per_slot)


@dataclass(frozen=True)
class ChunkwiseCI:
    """The chunkwise transformer behind the CI interface: its logits stacked per shape group."""

    transformer: ChunkwiseTransformer
    table: SiteTable

    def __post_init__(self) -> None:
        predicted = [s for c in self.transformer.chunks for s in c.sites]
        if sorted(predicted) != sorted(self.table.names):
            raise ValueError(
                f"chunks predict sites {predicted}, expected each of {list(self.table.names)} once"
            )

    def init(self, ci_key: Key[Array, ""]) -> GroupParams:
        return self.transformer.init(ci_key)

    def inner(self, taps: Taps, V: tuple[Float[Array, "_n _d_in _C"], ...]) -> Inner | None:
        del taps, V
        return None  # the transformer reads the residual stream only

    def ci(self, params: GroupParams, taps: Taps, inner: Inner | None) -> CI:
        del inner
        per_slot = self.transformer.apply(params, taps["resid"])
        where = {
            s: (j, i) for i, c in enumerate(self.transformer.chunks) for j, s in enumerate(c.sites)
        }
        return squash(self.table.gather_groups(dict(enumerate(per_slot)), where))

    def param_axes(self, path: KeyPath, ndim: int) -> LogicalAxes:
        return self.transformer.param_axes(path, ndim)

    @property
    def many_small_dots(self) -> bool:
        return False


def _what(module: str, name: str) -> str:
    return f"chunkwise CI parameter {module}/{name}"


def _axes(name: str, leaf: Array) -> tuple[str | None, ...]:
    axes = weight_axes(name, leaf.ndim)
    assert axes is not None, f"chunkwise CI parameter {name} has no logical axes"
    return axes


def rms_norm(x: Float[Array, "*L d"]) -> Float[Array, "*L d"]:
    """Weightless RMSNorm in fp32 with eps = float32 machine epsilon."""
    x32 = x.astype(jnp.float32)
    eps = float(np.finfo(np.float32).eps)
    return x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)


def layer_chunks(table: SiteTable, layers_per_chunk: int) -> tuple[Chunk, ...]:
    """The sites in chunks of `layers_per_chunk` consecutive decomposed layers; a chunk reads
    the residual stream entering each of its layers."""
    by_layer: dict[int, list[str]] = {}
    for site in table.sites:
        by_layer.setdefault(site.layer, []).append(site.name)
    layers = sorted(by_layer)
    groups = [layers[i : i + layers_per_chunk] for i in range(0, len(layers), layers_per_chunk)]
    return tuple(Chunk(tuple(g), tuple(s for i in g for s in by_layer[i])) for g in groups)


def chunkwise_ci(
    table: SiteTable,
    d_resid: int,
    layers_per_chunk: int,
    d_model: int,
    n_blocks: int,
    n_heads: int,
    mlp_hidden: int,
) -> ChunkwiseCI:
    """The chunkwise-transformer CI function over a layered model's sites (SPEC §4.1)."""
    chunks = layer_chunks(table, layers_per_chunk)
    site_C = tuple((s.name, s.C) for s in table.sites)
    transformer = ChunkwiseTransformer(
        chunks, d_resid, site_C, d_model, n_blocks, n_heads, mlp_hidden
    )
    return ChunkwiseCI(transformer, table)
