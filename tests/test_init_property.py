"""I1/I2 as properties: the stacked, sharded initializers equal unrolled per-site references
(jit against jit, `array_equal`) over random seeds, site sets, storage dtypes and 1 or 4
simulated devices, and every leaf has the PartitionSpec of its logical axes (SPEC §10, §11)."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import AxisType, Mesh

from pd.adversary import init_sources
from pd.init import init_vu
from pd.shard import source_shardings, vu_shardings
from pd.sites import SiteSpec, SiteTable

# A few fixed shape buckets (each compile is cached across examples); dims divide 4 devices.
SITE = st.tuples(st.sampled_from([4, 8]), st.sampled_from([4, 8]), st.sampled_from([2, 3]))


def _table(shapes: list[tuple[int, int, int]]) -> SiteTable:
    return SiteTable(tuple(SiteSpec(f"s{i}", d, o, c) for i, (d, o, c) in enumerate(shapes)))


# The per-site references, jitted once per shape (not once per site and example).
@partial(jax.jit, static_argnums=(1, 2))
def _normal(key: jax.Array, fan_in: int, fan_out: int) -> jax.Array:
    return jax.random.normal(key, (fan_in, fan_out)) / jnp.sqrt(jnp.float32(fan_in))


@partial(jax.jit, static_argnums=(1, 2))
def _uniform(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype) -> jax.Array:
    return jax.random.uniform(key, shape).astype(dtype)


def _unrolled_vu(table: SiteTable, key: jax.Array) -> list[tuple[np.ndarray, np.ndarray]]:
    keys = jax.random.split(key, 2 * len(table.sites))
    out = []
    for i, s in enumerate(table.sites):
        v, u = _normal(keys[2 * i], s.d_in, s.C), _normal(keys[2 * i + 1], s.C, s.d_out)
        out.append((np.asarray(v), np.asarray(u)))
    return out


@pytest.mark.slow  # over 10 s: `make test-fast` leaves it to the full suite
@given(
    seed=st.integers(0, 2**31 - 1),
    shapes=st.lists(SITE, min_size=1, max_size=5),
    devices=st.sampled_from([1, 4]),
)
def test_i1_vu_sharded_batched_equals_unrolled(
    seed: int, shapes: list[tuple[int, int, int]], devices: int
) -> None:
    table = _table(shapes)
    mesh = make_mesh_of(devices)
    shardings = vu_shardings(table, mesh)
    key = jax.random.key(seed)
    comps = jax.jit(init_vu, static_argnums=1, out_shardings=shardings)(key, table)
    for (v_ref, u_ref), name in zip(_unrolled_vu(table, key), table.names, strict=True):
        np.testing.assert_array_equal(np.asarray(table.view(comps.V, name)), v_ref)
        np.testing.assert_array_equal(np.asarray(table.view(comps.U, name)), u_ref)
    for leaf in comps.V:
        assert tuple(leaf.sharding.spec) == (None, ("data", "model"), None)
    for leaf in comps.U:
        assert tuple(leaf.sharding.spec) == (None, None, ("data", "model"))


@given(
    seed=st.integers(0, 2**31 - 1),
    shapes=st.lists(SITE, min_size=1, max_size=5),
    devices=st.sampled_from([1, 4]),
    bf16=st.booleans(),
    per_example=st.booleans(),
)
def test_i1_sources_sharded_batched_equal_unrolled(
    seed: int, shapes: list[tuple[int, int, int]], devices: int, bf16: bool, per_example: bool
) -> None:
    table = _table(shapes)
    mesh = make_mesh_of(devices)
    scope = (8,) if per_example else (1,)
    dtype = jnp.bfloat16 if bf16 else jnp.float32
    shardings = source_shardings(table, scope, per_example, mesh)
    key = jax.random.key(seed)
    sources = jax.jit(init_sources, static_argnums=(1, 2, 3, 4), out_shardings=shardings)(
        key, 0, table, scope, dtype
    )
    keys = jax.random.split(jax.random.fold_in(key, 0), len(table.sites))
    for i, site in enumerate(table.sites):
        draw = _uniform(keys[i], (*scope, site.C + 1), dtype)
        g, slot = table.c_where(site.name)
        np.testing.assert_array_equal(np.asarray(sources[g][slot]), np.asarray(draw))
    expected = ("data",) if per_example else (None,)
    assert all(tuple(s.sharding.spec)[1:2] == expected for s in sources)


def make_mesh_of(devices: int) -> Mesh:
    """A (data, model) mesh over the first `devices` simulated CPU devices (conftest makes 4)."""
    grid = np.asarray(jax.devices()[:devices]).reshape(devices, 1)
    return Mesh(grid, ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
