"""A user's own haiku model as a Target (`pd.targets.haiku_model`): sites by module-name patterns,
intercepted `hk.Linear` calls, one site per layer inside `hk.layer_stack` (S2–S4)."""

from collections.abc import Callable

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float

from pd.decompose import FROZEN, Constant, Sites, decomposed_hook, layer_sites
from pd.init import init_vu
from pd.sites import input_tap
from pd.targets.base import Target
from pd.targets.haiku_model import HaikuTarget, haiku_target

Fn = Callable[[Array], Array]


def mlp(x: Float[Array, "B 6"]) -> Float[Array, "B 3"]:
    return hk.nets.MLP([8, 5, 3], name="mlp")(x)


def attention_block(x: Float[Array, "B 4 8"]) -> Float[Array, "B 4 8"]:
    w_init = hk.initializers.VarianceScaling(1.0)
    attn = hk.MultiHeadAttention(num_heads=2, key_size=4, w_init=w_init, name="attn")
    h = x + attn(x, x, x)
    return h + hk.Linear(8, name="out")(jax.nn.gelu(hk.Linear(16, name="up")(h)))


def stacked(x: Float[Array, "B 6"]) -> Float[Array, "B 2"]:
    def block(h: Float[Array, "B 6"]) -> Float[Array, "B 6"]:
        return h + hk.Linear(6, name="down")(jax.nn.relu(hk.Linear(10, name="up")(h)))

    h = hk.layer_stack(3, name="stack")(block)(x)
    return hk.Linear(2, name="readout")(h)


class Dense(hk.Module):
    """A user's own linear module, not an hk.Linear: `x @ w + b` from its own parameters."""

    def __init__(self, size: int, name: str | None = None):
        super().__init__(name=name)
        self.size = size

    def __call__(self, x: Float[Array, "B d"]) -> Float[Array, "B e"]:
        w = hk.get_parameter("w", (x.shape[-1], self.size), init=hk.initializers.RandomNormal())
        return x @ w + hk.get_parameter("b", (self.size,), init=jnp.ones)


class Squashed(Dense):
    """A module with a `w` whose output is not linear in it: not a site."""

    def __call__(self, x: Float[Array, "B d"]) -> Float[Array, "B e"]:
        return jnp.tanh(super().__call__(x))


def own_modules(x: Float[Array, "B 6"]) -> Float[Array, "B 3"]:
    return Dense(3, name="dense_out")(Squashed(5, name="squashed")(Dense(5, name="dense_in")(x)))


CASES: list[tuple[Fn, tuple[int, ...], dict[str, int], int]] = [
    (mlp, (5, 6), {"mlp/~/linear_*": 4}, 3),
    (attention_block, (2, 4, 8), {"attn/query": 3, "attn/value": 3, "up": 5, "out": 5}, 4),
    (stacked, (5, 6), {"stack/*": 4, "readout": 2}, 7),
    (own_modules, (5, 6), {"dense_*": 3}, 2),
]


def _setup(case: int) -> tuple[HaikuTarget, hk.Params, Array, Fn]:
    fn, shape, patterns, _ = CASES[case]
    x = jax.random.normal(jax.random.key(case), shape)
    params = hk.transform(fn).init(jax.random.key(10 + case), x)
    return haiku_target(fn, params, x, patterns), params, x, fn


def _sites(target: Target, mode: Constant, x: Array, ci: float) -> Sites:
    table = target.table
    comps = init_vu(jax.random.key(0), table)
    lead = x.shape[:-1]
    lower = tuple(jnp.full((len(g.names), *lead, g.C), ci) for g in table.groups)
    return Sites(decomposed_hook(mode), layer_sites(table, comps.V, comps.U, lower))


@pytest.mark.parametrize("case", range(len(CASES)))
def test_masks_one_and_delta_one_reproduce_net_apply_bit_for_bit(case: int) -> None:
    target, params, x, fn = _setup(case)
    assert len(target.table.sites) == CASES[case][3]
    expected = np.asarray(jax.jit(hk.transform(fn).apply)(params, None, x))
    clean = jax.jit(lambda p, x: target.forward(p, x, FROZEN))(params, x)
    np.testing.assert_array_equal(np.asarray(clean), expected)
    sites = _sites(target, Constant(1.0, delta=1.0), x, 0.5)
    out = jax.jit(lambda p, x: target.forward(p, x, sites))(params, x)
    np.testing.assert_array_equal(np.asarray(out), expected)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_S3_a_live_site_computes_x_V_U_plus_the_frozen_bias(case: int) -> None:
    """CI 1, no delta: every decomposed module computes `x @ (V U) + b` — the model with each
    site's `w` replaced by `V U`, layer by layer inside a layer stack."""
    target, params, x, fn = _setup(case)
    table = target.table
    comps = init_vu(jax.random.key(0), table)
    V, U = table.views(comps.V), table.views(comps.U)
    replaced = {path: dict(entries) for path, entries in params.items()}
    for lin, _ in target.linears:
        names = [s.name for s in table.sites if s.kind == lin.path]
        vu = jnp.stack([V[n] @ U[n] for n in names])
        replaced[lin.path]["w"] = vu if lin.n_layers else vu[0]
    expected = jax.jit(hk.transform(fn).apply)(replaced, None, x)
    sites = _sites(target, Constant(0.0), x, 1.0)
    out = jax.jit(lambda p, x: target.forward(p, x, sites))(params, x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-5, atol=1e-5)
    assert not np.allclose(np.asarray(out), np.asarray(target.forward(params, x, FROZEN)))


def test_S4_taps_are_each_sites_input_per_layer() -> None:
    target, params, x, _ = _setup(2)
    taps, _ = jax.jit(target.taps)(params, x)
    p = params
    h = x
    for i in range(3):
        up_in = h
        down_in = jax.nn.relu(h @ p["stack/up"]["w"][i] + p["stack/up"]["b"][i])
        np.testing.assert_allclose(np.asarray(taps[input_tap("stack/up")][i]), up_in, atol=1e-5)
        np.testing.assert_allclose(np.asarray(taps[input_tap("stack/down")][i]), down_in, atol=1e-5)
        h = h + down_in @ p["stack/down"]["w"][i] + p["stack/down"]["b"][i]
    np.testing.assert_allclose(np.asarray(taps[input_tap("readout")][0]), h, atol=1e-5)
    assert [s.name for s in target.table.sites][:2] == ["stack/up/0", "stack/down/0"]


def test_a_pattern_that_matches_nothing_names_the_modules() -> None:
    x = jnp.zeros((2, 6))
    params = hk.transform(mlp).init(jax.random.key(0), x)
    with pytest.raises(ValueError, match=r"'mlp/linear_\*'.*mlp/~/linear_0"):
        haiku_target(mlp, params, x, {"mlp/linear_*": 4})


def test_a_module_with_a_w_it_is_not_linear_in_is_not_a_site() -> None:
    x = jax.random.normal(jax.random.key(0), (4, 6))
    params = hk.transform(own_modules).init(jax.random.key(1), x)
    target = haiku_target(own_modules, params, x, {"dense_*": 3})
    assert [lin.path for lin, _ in target.linears] == ["dense_in", "dense_out"]
    with pytest.raises(ValueError, match=r"'squashed' matches no linear module, expected one of"):
        haiku_target(own_modules, params, x, {"squashed": 3})
