"""§11: logical axes map to mesh axes by rule; a dimension that does not divide is an error."""

import jax
import pytest
from jax.sharding import AbstractMesh

from pd.shard import ShardingError, make_mesh, partition_spec


def test_rules_map_logical_axes_to_mesh_axes() -> None:
    mesh = make_mesh({"data": jax.device_count(), "model": 1})
    spec = partition_spec("V", (3, 8, 5), (None, "d_in", "components"), mesh)
    assert tuple(spec) == (None, ("data", "model"), None)  # C is never sharded
    assert tuple(partition_spec("x", (4, 7), ("batch", None), mesh)) == ("data", None)


def test_a_non_dividing_dimension_names_the_array_axis_and_sizes() -> None:
    mesh = AbstractMesh((4, 2), ("data", "model"))  # the rule table needs only the axis sizes
    with pytest.raises(ShardingError, match=r"V: axis 'd_in' of size 12 does not divide"):
        partition_spec("V", (1, 12, 5), (None, "d_in", None), mesh)  # 12 over 4 × 2 devices
    spec = partition_spec("V", (1, 16, 5), (None, "d_in", None), mesh)
    assert tuple(spec) == (None, ("data", "model"), None)


def test_a_mesh_cannot_ask_for_more_devices_than_exist() -> None:
    with pytest.raises(ShardingError, match="expected at most the 4 available"):
        make_mesh({"data": jax.device_count() + 1})
    assert make_mesh({"data": 2, "model": 1}).devices.size == 2  # a single process may use fewer
