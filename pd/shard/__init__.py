"""Logical axes → mesh axes: mesh construction, the rule table and loud divisibility checks."""

import math
from collections.abc import Callable, Mapping, Sequence

import jax
import numpy as np
from jax import Array
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec

from pd.sites import SiteTable
from pd.state import Components

MeshAxes = str | tuple[str, ...] | None

# SPEC §11 defaults: the batch over data; V/U masters ZeRO-style over every device (C never
# sharded); chunk-transformer weights on their wide axis; sources follow their scope.
DEFAULT_RULES: dict[str, MeshAxes] = {
    "batch": "data",
    "d_in": ("data", "model"),
    "d_out": ("data", "model"),
    "wide": "model",
}


_spec: Callable[..., PartitionSpec] = PartitionSpec  # its constructor is unannotated upstream
_from_local: Callable[[NamedSharding, np.ndarray, tuple[int, ...]], Array] = (
    jax.make_array_from_process_local_data  # unannotated upstream
)


class ShardingError(ValueError):
    """A dimension that does not divide its mesh axes (never silently replicated)."""


def make_mesh(axes: Mapping[str, int]) -> Mesh:
    """A mesh with Auto axis types (haiku's matmuls need them): over every device of a
    multi-process run, over the first devices of a single process."""
    n, available = math.prod(axes.values()), jax.device_count()
    if n > available or (jax.process_count() > 1 and n != available):
        raise ShardingError(
            f"mesh {dict(axes)} has {n} devices, expected "
            f"{'at most ' if jax.process_count() == 1 else ''}the {available} available"
        )
    return jax.make_mesh(
        tuple(axes.values()),
        tuple(axes),
        axis_types=(AxisType.Auto,) * len(axes),
        devices=jax.devices()[:n],
    )


def partition_spec(
    what: str,
    shape: Sequence[int],
    logical: Sequence[str | None],
    mesh: Mesh | AbstractMesh,
    rules: Mapping[str, MeshAxes] = DEFAULT_RULES,
) -> PartitionSpec:
    """The PartitionSpec of an array from its logical axes; names the array when one doesn't fit."""
    if len(shape) != len(logical):
        raise ShardingError(f"{what}: shape {tuple(shape)} has no logical axes {tuple(logical)}")
    parts: list[MeshAxes] = []
    for size, name in zip(shape, logical, strict=True):
        axes = rules.get(name) if name is not None else None
        if axes is not None:
            names = (axes,) if isinstance(axes, str) else axes
            ways = math.prod(mesh.shape[a] for a in names)
            if size % ways:
                raise ShardingError(
                    f"{what}: axis '{name}' of size {size} does not divide over mesh axes "
                    f"{names} of {ways} devices"
                )
        parts.append(axes)
    return _spec(*parts)


def named_sharding(
    what: str,
    shape: Sequence[int],
    logical: Sequence[str | None],
    mesh: Mesh,
    rules: Mapping[str, MeshAxes] = DEFAULT_RULES,
) -> NamedSharding:
    return NamedSharding(mesh, partition_spec(what, shape, logical, mesh, rules))


def vu_shardings(
    table: SiteTable, mesh: Mesh, rules: Mapping[str, MeshAxes] = DEFAULT_RULES
) -> Components:
    """Placement of the stacked V/U masters: V on `d_in`, U on `d_out`, C never sharded."""
    V = tuple(
        named_sharding(
            f"V of {g.names}", (len(g.names), g.d_in, g.C), (None, "d_in", None), mesh, rules
        )
        for g in table.groups
    )
    U = tuple(
        named_sharding(
            f"U of {g.names}", (len(g.names), g.C, g.d_out), (None, None, "d_out"), mesh, rules
        )
        for g in table.groups
    )
    return Components(V, U)  # type: ignore[arg-type]  # a tree of shardings in the Components layout


def source_shardings(
    table: SiteTable, scope: tuple[int, ...], per_example: bool, mesh: Mesh
) -> tuple[NamedSharding, ...]:
    """Sources per C group: shared scopes replicated, per-example scopes with the batch."""
    logical = (None, "batch" if per_example else None, *(None,) * len(scope))
    return tuple(
        named_sharding(f"sources of {g.names}", (len(g.names), *scope, g.C + 1), logical, mesh)
        for g in table.c_groups
    )


def global_batch(x: Array | np.ndarray, mesh: Mesh) -> Array:
    """Shard a batch that every process computes whole (a pure function of seed and step) over
    the mesh's `data` axis. Given the whole batch, `jax.make_array_from_process_local_data` puts
    on each device of this process the rows that device holds, however the mesh lays the
    processes out (along `data`, along `model`, or both)."""
    sharding = named_sharding("batch", x.shape, ("batch", *(None,) * (x.ndim - 1)), mesh)
    return _from_local(sharding, np.asarray(x), x.shape)


def initialize_distributed(coordinator: str, num_processes: int, process_id: int) -> None:
    """Multi-process JAX from explicit settings only (never inferred from the environment)."""
    if not 0 <= process_id < num_processes:
        raise ShardingError(
            f"process_id {process_id} is outside {num_processes} processes, "
            f"expected 0 to {num_processes - 1}"
        )
    jax.distributed.initialize(
        coordinator_address=coordinator, num_processes=num_processes, process_id=process_id
    )
