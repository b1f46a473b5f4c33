"""§12: the Llama-style target — validation, its site table (S2), the site hook (S3), taps (S4).

Logits against an independent Hugging Face reference are checked in `test_hf_loader.py`.
"""

from collections.abc import Callable

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float

from pd.decompose import FROZEN, Draw, LayerSites, Sites, decomposed_hook, layer_sites, site_weights
from pd.init import init_vu
from pd.targets.base import Target
from pd.targets.llama import KINDS, Llama, LlamaArch

ARCH = LlamaArch(vocab=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_mlp=48)
ALL = Llama(ARCH, kind_C=tuple((k, 3) for k in KINDS), layers=(0, 1))
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 50, size=(2, 7)), jnp.int32)
# Jitted: one compile instead of one per primitive in eager mode (the tests must be fast).
clean_logits: Callable[[hk.Params, Array], Array] = jax.jit(lambda p, t: ALL.forward(p, t, FROZEN))


@pytest.fixture(scope="module")
def params() -> hk.Params:
    """Init params rescaled to ≈ 1/sqrt(d) matrices and non-unit norms: O(1) logits, not ≈ 0."""

    def init(key: Array) -> hk.Params:
        p = ALL.init(key)
        keys = iter(jax.random.split(jax.random.fold_in(key, 1), len(p["~"])))
        scaled = {
            name: (w + 0.3 * jax.random.normal(next(keys), w.shape)) if "norm" in name else w * 9.0
            for name, w in p["~"].items()
        }
        return {"~": scaled}

    params: hk.Params = jax.jit(init)(jax.random.key(0))
    return params


def arch(
    d_model: int = 32, n_heads: int = 4, n_kv_heads: int = 2, head_dim: int = 0, **kw: float
) -> LlamaArch:
    return LlamaArch(
        vocab=int(kw.get("vocab", 50)),
        d_model=d_model,
        n_layers=2,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        d_mlp=int(kw.get("d_mlp", 48)),
        head_dim=head_dim,
        rms_eps=kw.get("rms_eps", 1e-5),
    )


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: arch(vocab=0), "vocab"),
        (lambda: arch(d_mlp=-1), "d_mlp"),
        (lambda: arch(n_kv_heads=3), "n_heads"),
        (lambda: arch(head_dim=5), "head_dim"),
        (lambda: arch(d_model=30), "d_model"),  # 30 does not split into 4 heads
        (lambda: arch(rms_eps=0.0), "rms_eps"),
    ],
)
def test_arch_is_validated_with_one_sentence(make: Callable[[], LlamaArch], field: str) -> None:
    with pytest.raises(ValueError, match=f"LlamaArch.{field} is") as e:
        make()
    assert ". " not in str(e.value) and "expected" in str(e.value)


def test_head_dim_defaults_to_d_model_over_heads_and_may_differ() -> None:
    assert ARCH.head_dim == 8
    wide = LlamaArch(
        vocab=50, d_model=32, n_layers=1, n_heads=4, n_kv_heads=1, d_mlp=8, head_dim=16
    )
    assert wide.site_shape("q") == (32, 64) and wide.site_shape("o") == (64, 32)
    assert wide.site_shape("k") == (32, 16)


@pytest.mark.parametrize(
    ("kind_C", "layers", "match"),
    [
        ((("qk", 2),), (0,), "'qk' is unknown"),
        ((("q", 2), ("q", 3)), (0,), "distinct kinds"),
        ((("q", 2),), (2,), "layer 2 is out of range"),
        ((("q", 2),), (0, 0), "distinct layers"),
        ((("q", 0),), (0,), "C is 0"),
    ],
)
def test_llama_sites_are_validated(
    kind_C: tuple[tuple[str, int], ...], layers: tuple[int, ...], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        Llama(ARCH, kind_C=kind_C, layers=layers)


def test_S2_a_subset_of_layers_and_kinds_gives_the_canonical_table() -> None:
    """Layer ascending, then q, k, v, o, gate, up, down — whatever order the config lists."""
    target = Llama(ARCH, kind_C=(("down", 5), ("v", 2), ("q", 3)), layers=(1, 0))
    assert target.table.names == (
        "layers.0.attn.q",
        "layers.0.attn.v",
        "layers.0.mlp.down",
        "layers.1.attn.q",
        "layers.1.attn.v",
        "layers.1.mlp.down",
    )
    spec = {s.name: (s.d_in, s.d_out, s.C) for s in target.table.sites}
    assert spec["layers.0.attn.q"] == (32, 32, 3)
    assert spec["layers.1.attn.v"] == (32, 16, 2)  # n_kv_heads · head_dim
    assert spec["layers.0.mlp.down"] == (48, 32, 5)
    assert isinstance(target, Target) and target.divergence == "kl"


def test_full_table_shapes_and_weights(params: hk.Params) -> None:
    assert len(ALL.table.names) == 14
    assert ALL.table.names[:7] == tuple(
        f"layers.0.{'attn' if k in 'qkvo' else 'mlp'}.{k}" for k in KINDS
    )
    assert [(s.layer, s.kind) for s in ALL.table.sites[7:]] == [(1, k) for k in KINDS]
    weights = ALL.weights(params)
    assert tuple(weights) == KINDS
    assert weights["gate"] is params["~"]["gate"] and weights["gate"].shape == (2, 32, 48)
    views = site_weights(ALL.table, weights)
    for s in ALL.table.sites:
        assert views[s.name].shape == (s.d_in, s.d_out)
    np.testing.assert_array_equal(
        np.asarray(views["layers.1.mlp.gate"]), np.asarray(params["~"]["gate"][1])
    )


def test_init_param_tree_is_layer_stacked() -> None:
    tied = LlamaArch(
        vocab=50, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_mlp=48, tie_embeddings=True
    )
    params: hk.Params = jax.jit(Llama(tied, kind_C=(("up", 2),), layers=(0,)).init)(
        jax.random.key(0)
    )
    p = params["~"]
    shapes = {name: w.shape for name, w in p.items()}
    assert shapes == {
        "embed": (50, 32),
        "attn_norm": (3, 32),
        "q": (3, 32, 32),
        "k": (3, 32, 16),
        "v": (3, 32, 16),
        "o": (3, 32, 32),
        "mlp_norm": (3, 32),
        "gate": (3, 32, 48),
        "up": (3, 32, 48),
        "down": (3, 48, 32),
        "final_norm": (32,),
    }  # tied: no head
    assert float(jnp.std(p["gate"])) == pytest.approx(0.02, rel=0.2)
    np.testing.assert_array_equal(np.asarray(p["final_norm"]), np.ones(32))


def _sites_of(target: Llama, hook: Callable[..., Array]) -> Sites:
    """`hook` with every decomposed kind's LayerSites (V/U drawn, CI 1: contents unused)."""
    table = target.table
    comps = init_vu(jax.random.key(0), table)
    ci = tuple(jnp.ones((len(g.names), *TOKENS.shape, g.C)) for g in table.groups)
    return Sites(hook, layer_sites(table, comps.V, comps.U, ci))


def test_S3_a_hook_with_VU_equal_to_W_reproduces_the_frozen_forward(params: hk.Params) -> None:
    """The layer body calls the hook once per decomposed kind, in canonical kind order, and the
    scan runs it in every layer; with `V = W`, `U = I` the decomposed path
    `((x V) ⊙ 1) U + (x W − (x V) U)` equals the frozen `x W` exactly."""
    calls: list[str] = []

    def decomposed(
        kind: str, s: LayerSites, x: Float[Array, "*L d_in"], W: Float[Array, "d_in d_out"]
    ) -> Float[Array, "*L d_out"]:
        calls.append(kind)
        V, U = W, jnp.eye(W.shape[1], dtype=W.dtype)
        inner = x @ V
        return (inner * 1.0) @ U + (x @ W - inner @ U)

    clean = clean_logits(params, TOKENS)
    out = jax.jit(lambda p: ALL.forward(p, TOKENS, _sites_of(ALL, decomposed)))(params)
    assert calls == list(KINDS)  # one body, traced once
    assert clean.dtype == jnp.float32 and clean.shape == (2, 7, 50)
    assert float(jnp.std(clean)) > 0.5  # non-degenerate logits
    np.testing.assert_array_equal(np.asarray(out), np.asarray(clean))


def test_only_table_kinds_reach_the_hook_and_other_layers_are_not_live(
    params: hk.Params,
) -> None:
    target = Llama(ARCH, kind_C=(("o", 2), ("gate", 2)), layers=(1,))
    calls: list[str] = []
    live: list[Array] = []

    def record(
        kind: str, s: LayerSites, x: Float[Array, "*L d_in"], W: Float[Array, "d_in d_out"]
    ) -> Float[Array, "*L d_out"]:
        calls.append(kind)
        live.append(s.live)
        return x @ W

    sites = _sites_of(target, record)
    np.testing.assert_array_equal(np.asarray(sites.layers["o"].live), [False, True])
    out = jax.jit(lambda p: target.forward(p, TOKENS, sites))(params)
    assert calls == ["o", "gate"]
    np.testing.assert_array_equal(np.asarray(out), np.asarray(clean_logits(params, TOKENS)))


def test_S4_taps_are_site_inputs_and_residual_streams(params: hk.Params) -> None:
    target = Llama(ARCH, kind_C=(("q", 2), ("o", 2), ("down", 2)), layers=(0, 1))
    taps, clean = jax.jit(target.taps)(params, TOKENS)
    assert set(taps) == {"resid", "in.q", "in.o", "in.down"}
    for s in target.table.sites:
        assert taps[f"in.{s.kind}"][s.layer].shape == (2, 7, s.d_in)
    assert taps["resid"].shape == (ARCH.n_layers + 1, 2, 7, 32)
    p = params["~"]
    np.testing.assert_array_equal(np.asarray(taps["resid"][0]), np.asarray(p["embed"][TOKENS]))
    # The residual stream changes across layers; q reads the attention norm of it.
    assert not np.allclose(np.asarray(taps["resid"][1]), np.asarray(taps["resid"][2]))
    from pd.targets.llama import rms_norm

    np.testing.assert_allclose(
        np.asarray(taps["in.q"][1]),
        np.asarray(rms_norm(taps["resid"][1], p["attn_norm"][1], ARCH.rms_eps)),
        rtol=1e-6,
    )
    np.testing.assert_array_equal(np.asarray(clean), np.asarray(clean_logits(params, TOKENS)))


def test_forward_is_causal_any_length_and_jits(params: hk.Params) -> None:
    forward = clean_logits
    full = forward(params, TOKENS)
    changed = forward(params, TOKENS.at[:, 4].set((TOKENS[:, 4] + 1) % 50))
    np.testing.assert_allclose(np.asarray(changed[:, :4]), np.asarray(full[:, :4]), atol=1e-5)
    assert not np.allclose(np.asarray(changed[:, 4:]), np.asarray(full[:, 4:]))
    # A prefix gives the prefix's logits (positions see only the past; RoPE is per position).
    np.testing.assert_allclose(
        np.asarray(forward(params, TOKENS[:, :1])), np.asarray(full[:, :1]), atol=1e-5
    )


def test_bf16_params_compute_in_bf16_and_return_fp32_logits(params: hk.Params) -> None:
    p16 = jax.tree.map(lambda w: w.astype(jnp.bfloat16), params)
    taps, logits = jax.jit(ALL.taps)(p16, TOKENS)
    assert logits.dtype == jnp.float32
    assert taps["resid"].dtype == jnp.bfloat16 and taps["in.q"].dtype == jnp.bfloat16
    # Against fp32 compute on the same (bf16-rounded) weights: only the bf16 arithmetic differs.
    ref = clean_logits(jax.tree.map(lambda w: w.astype(jnp.float32), p16), TOKENS)
    err = float(jnp.max(jnp.abs(logits - ref)))
    assert err < 0.05 * float(jnp.max(jnp.abs(ref)))


@pytest.mark.slow  # over 10 s: `make test-fast` leaves it to the full suite
def test_resume_from_the_clean_taps_equals_the_whole_forward_and_its_gradient() -> None:
    """A masked pass resumed at the first decomposed layer (layer 1 of 3) from the clean pass's
    residual stream gives the whole forward's logits and the same gradient on the components."""
    arch3 = LlamaArch(vocab=50, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_mlp=48)
    target = Llama(arch3, kind_C=(("q", 3), ("down", 3)), layers=(1, 2))
    frozen = jax.jit(target.init)(jax.random.key(1))
    frozen = jax.tree.map(lambda w: w * 9.0 if w.ndim > 1 else w, frozen)  # O(1) logits
    table = target.table
    comps = init_vu(jax.random.key(2), table)
    ci = tuple(
        jax.random.uniform(jax.random.key(3 + g), (len(grp.names), *TOKENS.shape, grp.C))
        for g, grp in enumerate(table.groups)
    )
    taps, _ = jax.jit(target.taps)(frozen, TOKENS)

    def logits(V: tuple[Array, ...], resumed: bool) -> Array:
        sites = Sites(decomposed_hook(Draw(jax.random.key(4))), layer_sites(table, V, comps.U, ci))
        if resumed:
            return target.resume(frozen, TOKENS, taps, sites)
        return target.forward(frozen, TOKENS, sites)

    whole, resumed = (jax.jit(logits, static_argnums=1)(comps.V, r) for r in (False, True))
    assert float(jnp.std(whole)) > 0.5
    np.testing.assert_allclose(np.asarray(resumed), np.asarray(whole), rtol=1e-5, atol=1e-5)
    grads = [
        jax.jit(jax.grad(lambda V, r=r: jnp.sum(jnp.sin(logits(V, r)))))(comps.V)
        for r in (False, True)
    ]
    for a, b in zip(*grads, strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5)
