"""§3: masks (S1), the frozen path of non-live sites (S2), the recon target (S3)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd.decompose import (
    FROZEN,
    Constant,
    Sites,
    decomposed_hook,
    layer_sites,
    make_mask,
    site_out,
)
from pd.state import Components
from pd.targets.tms import TMS


def _site(key: int = 0) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    k = jax.random.split(jax.random.key(key), 4)
    return (
        jax.random.normal(k[0], (6, 3)),
        jax.random.normal(k[1], (3, 2)),
        jax.random.normal(k[2], (3, 4)),
        jax.random.normal(k[3], (4, 2)),
    )


def test_s1_mask_interpolates_ci_and_source_and_delta_is_raw() -> None:
    ci = jnp.asarray([[0.0, 0.5, 1.0]])
    source = jnp.asarray([[0.2, 0.2, 0.2, 0.7]])
    mask, delta = make_mask(ci, source)
    np.testing.assert_allclose(np.asarray(mask), [[0.2, 0.6, 1.0]], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(delta), [0.7])


def test_s1_all_ones_masks_reproduce_the_frozen_output() -> None:
    x, W, V, U = _site()
    out = site_out(x, W, V, U, jnp.ones((6, 4)), jnp.ones((6,)))
    np.testing.assert_allclose(np.asarray(out), np.asarray(x @ W), atol=1e-5)


def test_site_out_hand_computed_with_masks_and_route() -> None:
    x = jnp.asarray([[1.0, 2.0]])
    W = jnp.asarray([[1.0], [1.0]])
    V = jnp.asarray([[1.0, 0.0], [0.0, 1.0]])
    U = jnp.asarray([[2.0], [0.5]])
    # inner = [1, 2]; masked [0.5·1, 0·2] @ U = 1; delta = x@W − inner@U = 3 − 3 = 0
    out = site_out(x, W, V, U, jnp.asarray([[0.5, 0.0]]), jnp.asarray([1.0]))
    np.testing.assert_allclose(np.asarray(out), [[1.0]])
    routed_off = site_out(
        x, W, V, U, jnp.asarray([[0.5, 0.0]]), jnp.asarray([1.0]), jnp.asarray([False])
    )
    np.testing.assert_allclose(np.asarray(routed_off), [[3.0]])


def test_s2_non_live_sites_run_the_frozen_path_and_get_no_gradient() -> None:
    target = TMS(5, 2, 0, 0.05, C=4)
    k = jax.random.split(jax.random.key(1), 3)
    W1 = jax.random.normal(k[0], (5, 2))
    frozen = {"~": {"linear1": W1, "linear2": W1.T, "b": jnp.zeros(5)}}
    table = target.table
    comps = Components(
        V=tuple(jax.random.normal(k[1], (1, g.d_in, g.C)) for g in table.groups),
        U=tuple(jax.random.normal(k[2], (1, g.C, g.d_out)) for g in table.groups),
    )
    x = jax.random.uniform(jax.random.key(2), (8, 5))

    def output(c: Components) -> jax.Array:
        # linear1 live with every mask 0.5 (CI 0.5 under a source of 0) and no delta channel.
        ci = tuple(jnp.full((1, 8, g.C), 0.5) for g in table.groups)
        live = {"linear1": jnp.asarray([True]), "linear2": jnp.asarray([False])}
        sites = layer_sites(table, c.V, c.U, ci, live=live)
        return target.forward(frozen, x, Sites(decomposed_hook(Constant(0.0)), sites))

    # linear2 is not live: the output equals the frozen linear2 applied to the decomposed linear1.
    g1, s1 = table.where("linear1")
    h = site_out(x, W1, comps.V[g1][s1], comps.U[g1][s1], jnp.full((8, 4), 0.5), jnp.zeros((8,)))
    np.testing.assert_allclose(
        np.asarray(output(comps)), np.asarray(jax.nn.relu(h @ W1.T)), atol=1e-5
    )
    grads = jax.grad(lambda c: jnp.sum(output(c) ** 2))(comps)
    g2, _ = table.where("linear2")
    assert float(jnp.abs(grads.V[g2]).max()) == 0.0 and float(jnp.abs(grads.U[g2]).max()) == 0.0
    assert float(jnp.abs(grads.V[g1]).max()) > 0.0


def test_s3_recon_target_is_the_frozen_forward() -> None:
    target = TMS(5, 2, 1, 0.05, C=3)
    W1 = jax.random.normal(jax.random.key(3), (5, 2))
    frozen = target.expand({"W1": W1, "b": jnp.full((5,), -0.1)})
    x = jax.random.uniform(jax.random.key(4), (4, 5))
    clean = target.forward(frozen, x, FROZEN)
    np.testing.assert_allclose(
        np.asarray(clean), np.asarray(jax.nn.relu(x @ W1 @ W1.T - 0.1)), atol=1e-6
    )


def test_shape_annotations_are_checked_at_run_time() -> None:
    import jaxtyping

    x, W, V, U = _site()
    # V has C = 4 but the mask claims C = 3: jaxtyping's import hook (on for the whole suite)
    # rejects the call before any math happens.
    with pytest.raises(jaxtyping.TypeCheckError):
        site_out(x, W, V, U, jnp.ones((6, 3)), jnp.ones((6,)))
