"""Logical axes → mesh axes: mesh construction, the rule table and loud divisibility checks."""

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec
from jaxtyping import Float

from pd import precision
from pd.sites import SiteTable
from pd.state import Components

MeshAxes = str | tuple[str, ...] | None

# SPEC §11 storage: the batch over data; every trained leaf and the frozen weights over the
# whole mesh (ZeRO-3): V/U and the frozen matrices on their input (V, W) or output (U) rows, the
# vocabulary of the embedding and head over every device (C never sharded); a CI weight on its
# wide axis over `model` (Megatron pairs) and on its other axis, `fsdp`, over `data`; a per-site
# CI weight on its axis after the sites' (`spread`) over every device; sources follow their scope.
DEFAULT_RULES: dict[str, MeshAxes] = {
    "batch": "data",
    "d_in": ("data", "model"),
    "d_out": ("data", "model"),
    "vocab": ("data", "model"),
    "wide": "model",
    "fsdp": "data",
    "spread": ("data", "model"),
}
# Where a weight is used (one layer's or one chunk's slice, inside the scanned body): whole on
# the data axis, still split on the model-parallel axes.
GATHERED_RULES: dict[str, MeshAxes] = {"batch": "data", "wide": "model"}


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


_placement: list[Mesh | None] = [None]
_constrain: Callable[[Array, NamedSharding], Array] = jax.lax.with_sharding_constraint


@contextmanager
def placement(mesh: Mesh | None) -> Iterator[None]:
    """Trace the block's `gathered` weights on `mesh` (None: one device, nothing to gather)."""
    _placement.append(mesh)
    try:
        yield
    finally:
        _placement.pop()


def stored(what: str, x: Float[Array, "*s"], logical: Sequence[str | None]) -> Float[Array, "*s"]:
    """`x` held in the layout its logical axes give it by `DEFAULT_RULES` on the mesh being
    traced (nothing without one). Put on a weight stack before the scan that slices it, it
    makes the gradient, which the scan's backward builds one slice at a time, be built in that
    layout too, never whole; put on an activation, it says where that activation lives."""
    mesh = _placement[-1]
    if mesh is None:
        return x
    return _constrain(x, named_sharding(what, x.shape, logical, mesh, DEFAULT_RULES))


def gathered(
    what: str, x: Float[Array, "*s"], logical: Sequence[str | None], exact: bool = False
) -> Float[Array, "*s"]:
    """One scanned slice of a weight stored over the whole mesh (`DEFAULT_RULES`), whole where it
    is used (`GATHERED_RULES`): the all-gather happens in the body, so one layer's or one chunk's
    weights are whole at a time, and the gradient leaves it reduce-scattered to the storage
    layout, never a full replica.

    In bf16 compute (and not `exact`) the stored float32 shard is rounded to bfloat16 before
    the gather: half the bytes move and are held, and the matmuls, which round their operands,
    see the values they see on one device. The weight's gradient is summed over the devices in
    float32 (the matmul's accumulation), rounded to bfloat16 once per pass and layer, and
    accumulated into the float32 gradient of the shard.
    """
    mesh = _placement[-1]
    if mesh is None:
        return x
    # The first constraint's transpose reduce-scatters the gradient into the storage layout.
    x = _constrain(x, named_sharding(what, x.shape, logical, mesh, DEFAULT_RULES))
    if precision.current() == "bf16" and not exact and x.dtype == jnp.float32:
        x = x.astype(jnp.bfloat16)
    return _constrain(x, named_sharding(what, x.shape, logical, mesh, GATHERED_RULES))


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
