"""A run's placement is decided once (`placement_of`); each placement puts the state, the frozen
weights and the batches where §11 says, and both give the same values."""

import jax
import numpy as np
import pytest

from pd.train.config import ConfigError, load_config
from pd.train.init_state import state_shardings
from pd.train.kinds import kind_of
from pd.train.placement import ONE_DEVICE, OnMesh, placement_of
from pd.train.recipe import make_batches, make_recipe

# A small ResidMLP whose sizes divide over 4 devices (TMS's 5 features do not).
SMALL = ["C=4", "train.batch=16", "target.n_features=8", "target.d_embed=8", "target.d_mlp=4"]


def test_one_device_unless_the_mesh_asks_for_more() -> None:
    assert placement_of(load_config("resid_mlp1", SMALL)) is ONE_DEVICE
    on_mesh = placement_of(load_config("resid_mlp1", [*SMALL, "mesh.data=4"]))
    assert isinstance(on_mesh, OnMesh) and on_mesh.mesh.devices.size == 4
    n = jax.device_count() + 1
    batches = [f"train.batch={16 * n}", f"eval.batch={16 * n}"]
    with pytest.raises(ConfigError, match="config key 'mesh'"):
        placement_of(load_config("resid_mlp1", [*SMALL, *batches, f"mesh.data={n}"]))


def test_placements_put_the_state_and_batches_where_they_say() -> None:
    config = load_config("resid_mlp1", [*SMALL, "eval.batch=16", "mesh.data=4"])
    recipe, on_mesh = make_recipe(config), placement_of(config)
    assert isinstance(on_mesh, OnMesh)
    like = on_mesh.abstract_state(recipe)
    for leaf, want in zip(
        jax.tree.leaves(like), jax.tree.leaves(state_shardings(recipe, on_mesh.mesh)), strict=True
    ):
        assert leaf.sharding == want
    device = jax.devices()[0]
    single = ONE_DEVICE.abstract_state(recipe)
    assert all(leaf.sharding.device_set == {device} for leaf in jax.tree.leaves(single))
    # A fresh state is committed to the device as a restored one is (jit's output is not), so
    # both lower the same programs.
    fresh = ONE_DEVICE.init(recipe, jax.random.key(0), jax.random.key(1))
    for leaf, want in zip(jax.tree.leaves(fresh), jax.tree.leaves(single), strict=True):
        assert leaf.committed and leaf.sharding == want.sharding
    assert ONE_DEVICE.shardings(recipe) is None
    # toys draw their batches in the step program on one device, from the host on a mesh
    kind = kind_of(config.target)
    assert ONE_DEVICE.sampler(kind, recipe.target, 16) is not None
    assert on_mesh.sampler(kind, recipe.target, 16) is None

    key = jax.random.key(0)
    here, spread = (make_batches(config, recipe, key, p)(3) for p in (ONE_DEVICE, on_mesh))
    assert len(spread.sharding.device_set) == 4
    np.testing.assert_array_equal(np.asarray(here), np.asarray(spread))
