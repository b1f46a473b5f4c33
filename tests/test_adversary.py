"""§6: persistent sources — init per C group (I1), optax's Adam ascent against S15 by hand,
clamping, fp32 moments for bf16 sources (S22)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd.adversary import ascend, init_source_adam, init_sources
from pd.sites import SiteSpec, SiteTable


def _table() -> SiteTable:
    """Kind `a` in layers 0 and 1 (one C group of two sites), kind `b` in layer 0."""
    a0, a1 = SiteSpec("a.0", 3, 2, 4, 0, "a"), SiteSpec("a.1", 3, 2, 4, 1, "a")
    return SiteTable((a0, SiteSpec("b.0", 2, 3, 5, 0, "b"), a1))


def test_i1_sources_stacked_per_c_group_equal_the_unrolled_draws() -> None:
    table = _table()
    key = jax.random.key(3)
    stacked = jax.jit(init_sources, static_argnums=(1, 2, 3))(key, 2, table, (1,))
    assert [s.shape for s in stacked] == [(2, 1, 5), (1, 1, 6)]
    keys = jax.random.split(jax.random.fold_in(key, 2), 3)
    for i, site in enumerate(table.sites):
        g, slot = table.c_where(site.name)
        ref = jax.jit(lambda k, C=site.C: jax.random.uniform(k, (1, C + 1)))(keys[i])
        np.testing.assert_array_equal(np.asarray(stacked[g][slot]), np.asarray(ref))
    assert all(float(s.min()) >= 0.0 and float(s.max()) < 1.0 for s in stacked)


def test_s15_one_adam_ascent_by_hand_with_eps_after_the_sqrt() -> None:
    src = (jnp.asarray([[0.5, 0.5, 0.999]]),)
    g = (jnp.asarray([[2.0, -1.0, 3.0]]),)
    state = init_source_adam(src)
    lr, b1, b2, eps = 0.1, 0.5, 0.99, 1e-8
    new, state = ascend(src, state, g, jnp.float32(lr), b1, b2, eps)
    # step 1: m̂ = g, v̂ = g², update = lr · g / (|g| + eps) = ±lr
    expected = [0.5 + lr * 2 / (2 + eps), 0.5 - lr * 1 / (1 + eps), 1.0]  # the last one is clamped
    np.testing.assert_allclose(np.asarray(new[0]), [expected], rtol=1e-6)
    assert int(np.asarray(state.count)) == 1
    mu = state.mu
    assert isinstance(mu, tuple)
    np.testing.assert_allclose(np.asarray(mu[0]), (1 - b1) * np.asarray(g[0]), rtol=1e-6)
    # step 2 with a zero gradient: m = b1·m1, v = b2·v1; bias-corrected ratio by hand
    new2, state = ascend(new, state, (jnp.zeros((1, 3)),), jnp.float32(lr), b1, b2, eps)
    m = b1 * (1 - b1) * 2.0
    v = b2 * (1 - b2) * 4.0
    step2 = lr * (m / (1 - b1**2)) / (math.sqrt(v / (1 - b2**2)) + eps)
    assert float(new2[0][0, 0]) == pytest.approx(expected[0] + step2, rel=1e-5)
    assert float(new2[0][0, 2]) == 1.0  # clamped after every update, not only the last


def test_s22_bf16_sources_keep_fp32_moments_and_their_storage_dtype() -> None:
    src = (jnp.full((1, 3), 0.5, jnp.bfloat16),)
    state = init_source_adam(src)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves((state.mu, state.nu)))
    g = (jnp.asarray([[1e-3, -1e-3, 0.0]], jnp.bfloat16),)
    new, state = ascend(src, state, g, jnp.float32(0.01), 0.5, 0.99, 1e-8)
    assert new[0].dtype == jnp.bfloat16
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves((state.mu, state.nu)))
