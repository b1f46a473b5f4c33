"""A Llama-style language model (SPEC §12): RMSNorm, RoPE, grouped-query attention, SwiGLU.

The forward follows Hugging Face's `LlamaForCausalLM` so that `pd.targets.hf.load_hf` checkpoints
give the same logits. Weights are right-multiplied, `y = x @ W` with `W: [d_in, d_out]` (HF's
Linear weights transposed).

The layers run as one checkpointed body under `lax.scan` over layer-stacked weights, so the
program's size does not grow with depth. Haiku parameters, all module-less (under `"~"`), the
per-layer ones stacked on a leading `[n_layers]` axis:

| name | shape |
|---|---|
| `embed` | `[vocab, d_model]` |
| `final_norm` | `[d_model]` |
| `attn_norm`, `mlp_norm` | `[n_layers, d_model]` |
| `q` | `[n_layers, d_model, n_heads · head_dim]` |
| `k`, `v` | `[n_layers, d_model, n_kv_heads · head_dim]` |
| `o` | `[n_layers, n_heads · head_dim, d_model]` |
| `gate`, `up` | `[n_layers, d_model, d_mlp]` |
| `down` | `[n_layers, d_mlp, d_model]` |
| `head` | `[d_model, vocab]`, absent with tied embeddings (`head = embed.T`) |
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar, cast

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, Key

from pd import loops
from pd.decompose import FROZEN, LayerSites, SiteGrads, Sites, apply_site
from pd.precision import matmul
from pd.rope import rope, rope_tables
from pd.shard import gathered, stored
from pd.sites import SiteSpec, SiteTable, input_tap
from pd.targets.base import Divergence, FrozenAxes, FrozenShapes, LayerTaps, Taps, TargetBase

# How the layer body is checkpointed. "dots": the backward keeps the outputs of the layer's
# matmuls (projections and the decomposed path) and recomputes norms, RoPE and attention's
# batched dots; "full": it keeps only each layer's input and recomputes the layer (in a step's
# masked passes the layer scan's own backward does so, adding each layer's gradient into the
# running gradient of the passes: `Llama.adds_into`); "none": it keeps everything (fastest for
# a small model, whose activations are small).
Remat = Literal["dots", "full", "none"]
F = TypeVar("F", bound=Callable[..., object])


def checkpointed(body: F, remat: Remat) -> F:
    """`body` under `jax.checkpoint` with the policy of `remat`."""
    if remat == "none":
        return body
    dots = jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    # jax.checkpoint keeps the signature; its annotation does not say so.
    return cast(F, jax.checkpoint(body, policy=dots if remat == "dots" else None))


# The transformer kind order of canonical site order (SPEC §2).
KINDS = ("q", "k", "v", "o", "gate", "up", "down")
_ATTN_KINDS = ("q", "k", "v", "o")
_MASKED = float(np.finfo(np.float32).min)  # score of a masked (future) position
# The logical axes of the frozen parameters (`pd.shard`): every matrix over the whole mesh, on
# its input rows (per layer) or its vocabulary, gathered where it is used; norms replicated.
_FROZEN_AXES: dict[str, tuple[str | None, ...]] = {
    **{kind: (None, "d_in", None) for kind in KINDS},
    "attn_norm": (None, None),
    "mlp_norm": (None, None),
    "embed": ("vocab", None),
    "final_norm": (None,),
    "head": (None, "vocab"),
}
# A layer's slice of the sites' components, gathered in the layer body like the frozen W.
_V_AXES, _U_AXES = ("d_in", None), (None, "d_out")


@dataclass(frozen=True)
class LlamaArch:
    """Sizes of a Llama-style model; `head_dim = 0` resolves to `d_model // n_heads`."""

    vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_mlp: int
    head_dim: int = 0
    rope_base: float = 10000.0
    rms_eps: float = 1e-5
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        for name in ("vocab", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_mlp"):
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"LlamaArch.{name} is {value}, expected a positive integer")
        for name in ("rope_base", "rms_eps"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"LlamaArch.{name} is {value}, expected a positive number")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"LlamaArch.n_heads is {self.n_heads}, expected a multiple of "
                f"n_kv_heads ({self.n_kv_heads})"
            )
        if self.head_dim < 0:
            raise ValueError(f"LlamaArch.head_dim is {self.head_dim}, expected 0 or positive")
        if self.head_dim == 0:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"LlamaArch.d_model is {self.d_model}, expected a multiple of n_heads "
                    f"({self.n_heads}) when head_dim is 0"
                )
            object.__setattr__(self, "head_dim", self.d_model // self.n_heads)
        if self.head_dim % 2:
            raise ValueError(f"LlamaArch.head_dim is {self.head_dim}, expected an even number")

    def site_shape(self, kind: str) -> tuple[int, int]:
        """`(d_in, d_out)` of a projection kind."""
        d, q, kv = self.d_model, self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        shapes = {
            "q": (d, q),
            "k": (d, kv),
            "v": (d, kv),
            "o": (q, d),
            "gate": (d, self.d_mlp),
            "up": (d, self.d_mlp),
            "down": (self.d_mlp, d),
        }
        return shapes[kind]


def site_name(layer: int, kind: str) -> str:
    """`layers.{i}.attn.{q,k,v,o}` or `layers.{i}.mlp.{gate,up,down}`."""
    return f"layers.{layer}.{'attn' if kind in _ATTN_KINDS else 'mlp'}.{kind}"


@dataclass(frozen=True)
class Llama(TargetBase):
    """A Llama-style LM with the sites of `kind_C` decomposed in the layers `layers`."""

    arch: LlamaArch
    kind_C: tuple[tuple[str, int], ...]  # decomposed kinds and their C
    layers: tuple[int, ...]  # decomposed layers
    remat: Remat = "dots"
    table: SiteTable = field(init=False)
    _net: hk.Transformed = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        kinds = [k for k, _ in self.kind_C]
        for k in kinds:
            if k not in KINDS:
                raise ValueError(f"Llama kind {k!r} is unknown, expected one of {', '.join(KINDS)}")
        if not kinds or len(set(kinds)) != len(kinds):
            raise ValueError(
                f"Llama kind_C kinds are {kinds}, expected distinct kinds, at least one"
            )
        if not self.layers or len(set(self.layers)) != len(self.layers):
            raise ValueError(
                f"Llama layers are {list(self.layers)}, expected distinct layers, at least one"
            )
        for i in self.layers:
            if not 0 <= i < self.arch.n_layers:
                raise ValueError(
                    f"Llama layer {i} is out of range, expected 0 <= layer < {self.arch.n_layers}"
                )
        Cs = dict(self.kind_C)
        # Canonical order regardless of the order given: layer ascending, then KINDS (SPEC §2).
        order = [(i, k) for i in sorted(self.layers) for k in KINDS if k in Cs]
        sites = tuple(
            SiteSpec(site_name(i, k), *self.arch.site_shape(k), Cs[k], i, k) for i, k in order
        )
        object.__setattr__(self, "table", SiteTable(sites, self.arch.n_layers))
        object.__setattr__(self, "_net", hk.without_apply_rng(hk.transform(self._forward)))

    @property
    def divergence(self) -> Divergence:
        return "kl"

    @property
    def adds_into(self) -> bool:
        """With `remat = "full"` the backward recomputes each layer from its input anyway, so the
        layer scan's own backward (`pd.loops.scan_adding`) does it, adding into the running
        gradient."""
        return self.remat == "full"

    def logit_directions(
        self, params: hk.Params, site: str, write: Float[Array, "A d_out"]
    ) -> Float[Array, "A vocab"] | None:
        """`o` and `down` write the residual stream; the other kinds do not (None)."""
        if not site.endswith((".attn.o", ".mlp.down")):
            return None
        p = params["~"]
        head = p["embed"].T if self.arch.tie_embeddings else p["head"]
        out: Float[Array, "A vocab"] = (write * p["final_norm"]) @ head
        return out

    def init(self, key: Key[Array, ""]) -> hk.Params:
        """Small fp32 init for training in-process: matrices N(0, 0.02²), norm weights 1."""
        params: hk.Params = self._net.init(key, jnp.zeros((1, 1), jnp.int32), FROZEN)
        return params

    def frozen_axes(self, params: FrozenShapes) -> FrozenAxes:
        return {m: {n: _FROZEN_AXES[n] for n in p} for m, p in params.items()}

    def weights(self, params: hk.Params) -> dict[str, Float[Array, "L d_in d_out"]]:
        """Each decomposed kind's frozen `W: [n_layers, d_in, d_out]` (in the params' dtype)."""
        return {k: params["~"][k] for k in self.table.kinds}

    def apply(
        self, params: hk.Params, tokens: Int[Array, "B T"], sites: Sites
    ) -> tuple[Float[Array, "B T vocab"], Taps]:
        """fp32 logits and the taps: `in.{kind}`, every decomposed kind's input per layer, and
        `resid`, the residual stream entering each layer (`resid[n_layers]`: before the final
        norm). Every decomposed matmul goes through `sites.hook`."""
        out: tuple[Float[Array, "B T vocab"], Taps] = self._net.apply(params, tokens, sites)
        return out

    def resume(
        self, params: hk.Params, tokens: Int[Array, "B T"], taps: Taps, sites: Sites
    ) -> Float[Array, "B T vocab"]:
        """`forward`, starting from the clean residual stream entering the first decomposed
        layer (`taps["resid"]`): the layers before it are frozen in every masked pass, so the
        clean pass has computed them already, and no gradient flows through them."""
        start = min(self.layers)
        out: tuple[Float[Array, "B T vocab"], Taps] = self._net.apply(
            params, tokens, sites, start, taps["resid"][start]
        )
        return out[0]

    def _forward(
        self,
        tokens: Int[Array, "B T"],
        sites: Sites,
        start: int = 0,
        resid: Float[Array, "B T d"] | None = None,
    ) -> tuple[Float[Array, "B T vocab"], Taps]:
        """The logits (fp32) and the taps: the residual stream entering every layer from
        `start` and the final norm, and every decomposed kind's input per layer. From a layer
        `start > 0`, `resid` is the residual stream entering it."""
        a = self.arch
        B, T = tokens.shape
        hd, q_heads, kv_heads = a.head_dim, a.n_heads, a.n_kv_heads
        L, normal = a.n_layers, hk.initializers.RandomNormal(0.02)
        stacked = {k: hk.get_parameter(k, (L, *a.site_shape(k)), init=normal) for k in KINDS}
        for name in ("attn_norm", "mlp_norm"):
            stacked[name] = hk.get_parameter(name, (L, a.d_model), init=jnp.ones)
        embed = hk.get_parameter("embed", (a.vocab, a.d_model), init=normal)
        final_norm = hk.get_parameter("final_norm", (a.d_model,), init=jnp.ones)
        if a.tie_embeddings:
            W_head = embed.T
        else:
            W_head = hk.get_parameter("head", (a.d_model, a.vocab), init=normal)
        h = embed[tokens] if resid is None else resid
        cos, sin = rope_tables(T, hd, a.rope_base, h.dtype)
        # Built on device from iotas, not a [T, T] constant baked into the program.
        causal = jnp.arange(T)[:, None] >= jnp.arange(T)[None, :]
        recorded = self.table.kinds

        def layer(
            h: Float[Array, "B T d"], xs: tuple[dict[str, Array], dict[str, LayerSites]]
        ) -> tuple[Float[Array, "B T d"], LayerTaps]:
            w, here = _gathered_layer(*xs)

            def proj(kind: str, x: Float[Array, "B T d_in"]) -> Float[Array, "B T d_out"]:
                return apply_site(sites.hook, here, kind, x, w[kind])

            x_attn = rms_norm(h, w["attn_norm"], a.rms_eps)
            # q/k/v are sites before RoPE; the rotation is not part of any decomposed matmul.
            q = rope(proj("q", x_attn).reshape(B, T, q_heads, hd), cos, sin)
            k = rope(proj("k", x_attn).reshape(B, T, kv_heads, hd), cos, sin)
            v = proj("v", x_attn).reshape(B, T, kv_heads, hd)
            x_o = attention(q, k, v, causal).reshape(B, T, q_heads * hd)
            h_mid = h + proj("o", x_o)
            x_mlp = rms_norm(h_mid, w["mlp_norm"], a.rms_eps)
            x_down = jax.nn.silu(proj("gate", x_mlp)) * proj("up", x_mlp)
            inputs = {"q": x_attn, "k": x_attn, "v": x_attn, "o": x_o}
            inputs.update({"gate": x_mlp, "up": x_mlp, "down": x_down})
            taps = {input_tap(kind): inputs[kind] for kind in recorded}
            return h_mid + proj("down", x_down), {"resid": h, **taps}

        xs = _stored_layers(*jax.tree.map(lambda a: a[start:], (stacked, sites.layers)))
        h, taps = self._layers(layer, h, xs, sites, start)
        h = rms_norm(h, final_norm, a.rms_eps)
        # Vocabulary-parallel on a mesh: every device reads the whole batch's final stream (a
        # small gather) and computes the logits of its own slice of the vocabulary, so the head
        # is never gathered; the divergence reduces over the vocabulary across devices.
        h = stored("final stream", h, (None, None, None))
        logits = matmul(h, W_head, jnp.float32)
        return stored("logits", logits, (None, None, "vocab")), taps

    def _layers(
        self,
        layer: "Layer",
        h: Float[Array, "B T d"],
        xs: tuple[dict[str, Array], dict[str, LayerSites]],
        sites: Sites,
        start: int,
    ) -> tuple[Float[Array, "B T d"], Taps]:
        """The layer scan from layer `start`: the last stream and the taps (`resid` with the
        final one appended). In a pass inside `loops.accumulate` (`sites.into`) its backward
        adds into the running gradient, and it records no taps."""
        if sites.into is None:
            h, taps = loops.scan(checkpointed(layer, self.remat), h, xs)
            taps["resid"] = jnp.concatenate([taps["resid"], h[None]])
            return h, taps
        into = jax.tree.map(lambda a: a[start:], sites.into)

        def picked(xs: tuple[dict[str, Array], dict[str, LayerSites]]) -> dict[str, SiteGrads]:
            return {k: SiteGrads.of(s, into[k]) for k, s in xs[1].items()}

        return loops.scan_adding(lambda h, x: layer(h, x)[0], h, xs, into, picked), {}


Layer = Callable[
    [Float[Array, "B T d"], tuple[dict[str, Array], dict[str, LayerSites]]],
    tuple[Float[Array, "B T d"], LayerTaps],
]


def _stored_layers(
    w: dict[str, Array], layers: dict[str, LayerSites]
) -> tuple[dict[str, Array], dict[str, LayerSites]]:
    """The layer-stacked weights and components the layer scan slices, in their storage layout
    (`stored`), so that their gradients are built sharded."""
    w = {n: stored(f"frozen {n}", v, _FROZEN_AXES[n]) for n, v in w.items()}
    layers = {
        kind: s._replace(
            V=stored(f"V of {kind}", s.V, (None, *_V_AXES)),
            U=stored(f"U of {kind}", s.U, (None, *_U_AXES)),
        )
        for kind, s in layers.items()
    }
    return w, layers


def _gathered_layer(
    w: dict[str, Array], here: dict[str, LayerSites]
) -> tuple[dict[str, Array], dict[str, LayerSites]]:
    """One layer's frozen weights and components, whole inside the layer body (`gathered`)."""
    w = {n: gathered(f"frozen {n}", v, _FROZEN_AXES[n][1:]) for n, v in w.items()}
    here = {
        kind: s._replace(
            V=gathered(f"V of {kind}", s.V, _V_AXES), U=gathered(f"U of {kind}", s.U, _U_AXES)
        )
        for kind, s in here.items()
    }
    return w, here


def rms_norm(x: Float[Array, "*L d"], w: Float[Array, " d"], eps: float) -> Float[Array, "*L d"]:
    """HF `LlamaRMSNorm`: normalize in fp32, cast back to the weight's dtype, scale."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return w * normed.astype(w.dtype)


def attention(
    q: Float[Array, "B T H D"],
    k: Float[Array, "B T KV D"],
    v: Float[Array, "B T KV D"],
    causal: Bool[Array, "T T"],
) -> Float[Array, "B T H D"]:
    """Causal grouped-query attention; query head `h` reads KV head `h // (H / KV)` (HF's
    `repeat_kv` order), without materializing repeated keys. Scores and softmax in fp32."""
    B, T, H, D = q.shape
    KV = k.shape[2]
    qg = q.reshape(B, T, KV, H // KV, D)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32)
    scores = jnp.where(causal, scores / math.sqrt(D), _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(B, T, H, D)
