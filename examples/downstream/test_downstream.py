"""Tests a project writes for its own code on pd, with pd's test setup (conftest.py) and pd's
hypothesis strategies (`pd.testing`). From any folder, against the installed pd:

    pytest path/to/examples/downstream --hypothesis-profile=ci
"""

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jaxtyping import Array, Float, TypeCheckError

from pd.decompose import FROZEN
from pd.sites import SiteTable, input_tap
from pd.testing import SmallTarget, batches, mlp_targets, site_tables, tms_target, tms_targets
from pd.train.kinds import OwnTarget


def test_the_plugin_runs_jax_on_four_cpu_devices() -> None:
    assert jax.default_backend() == "cpu"
    assert len(jax.devices()) == 4


@given(site_tables())
def test_every_site_has_its_own_slot_of_the_stacked_storage(table: SiteTable) -> None:
    """Per-group storage filled with each site's index: every site's view holds its own index,
    and a kind's per-layer stack (`by_kind`) goes back to the same storage (`from_kinds`)."""
    assert sorted(table.group_order) == sorted(table.names)
    stacked = tuple(
        jnp.stack([jnp.full((g.d_in, g.d_out), table.index(n), jnp.float32) for n in g.names])
        for g in table.groups
    )
    for i, site in enumerate(table.sites):
        group = table.groups[table.where(site.name)[0]]
        assert (group.d_in, group.d_out, group.C) == (site.d_in, site.d_out, site.C)
        np.testing.assert_array_equal(
            table.view(stacked, site.name), np.full((site.d_in, site.d_out), i)
        )
        assert table.by_kind(stacked, site.kind).shape[0] == table.n_layers
    per_kind = {kind: table.by_kind(stacked, kind) for kind in table.kinds}
    for storage, back in zip(stacked, table.from_kinds(per_kind), strict=True):
        np.testing.assert_array_equal(back, storage)


@given(st.data())
def test_the_clean_forward_is_the_model_without_pd(data: st.DataObject) -> None:
    """Every site frozen, a target computes its reference forward (written without pd) and taps
    each site's input, `[B, d_in]`, at its layer."""
    small: SmallTarget = data.draw(mlp_targets() | tms_targets())
    x: Float[Array, "B d"] = data.draw(batches(small.d_in))
    taps, out = jax.jit(small.target.taps)(small.params, x)
    expected = jax.jit(small.reference)(small.params, x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-6, atol=1e-6)
    for site in small.target.table.sites:
        assert taps[input_tap(site.kind)][site.layer].shape == (x.shape[0], site.d_in)


def test_pd_checks_shapes_at_run_time() -> None:
    """jaxtyping's checks of pd are on: TMS refuses an input without its batch axis."""
    small = tms_target(5, 2, 0, C=3, seed=0)
    with pytest.raises(TypeCheckError):
        small.target.forward(small.params, jnp.ones(5), FROZEN)


def test_the_tiny_target_is_a_haiku_mlp_with_pure_batches(tiny_target: OwnTarget) -> None:
    x = tiny_target.batches(3)
    np.testing.assert_array_equal(x, tiny_target.batches(3))
    assert not np.array_equal(x, tiny_target.batches(4))
    out = tiny_target.target.forward(tiny_target.frozen, x, FROZEN)
    plain: hk.Transformed = hk.without_apply_rng(
        hk.transform(lambda x: hk.nets.MLP([16, 8], name="mlp")(x))
    )
    np.testing.assert_array_equal(out, plain.apply(tiny_target.frozen, x))
    assert tiny_target.target.table.names == ("mlp/~/linear_0", "mlp/~/linear_1")
