"""Placement of a CI function's parameters (SPEC §4.1, §11), from the logical axes the function
gives each one (`CIFunction.param_axes`): the chunkwise transformer's weights on their wide
axis over `model` and their other axis over `data`, biases replicated, the stacked `chunks` axis
left to the rules; a per-site function's parameters split over every device after the sites'
axis."""

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import jax
from jax.sharding import Mesh, NamedSharding
from jaxtyping import Array, Key

from pd.ci import GroupParams, KeyPath, LogicalAxes
from pd.shard import DEFAULT_RULES, MeshAxes, ShardingError, named_sharding


@runtime_checkable
class Placeable(Protocol):
    """What placing parameters needs of a CI function (or of the chunkwise transformer)."""

    def init(self, ci_key: Key[Array, ""]) -> GroupParams: ...
    def param_axes(self, path: KeyPath, ndim: int) -> LogicalAxes: ...


def ci_param_shardings(
    ci_fn: Placeable, mesh: Mesh, rules: Mapping[str, MeshAxes] = DEFAULT_RULES
) -> object:
    """Every parameter's NamedSharding, shaped like `ci_fn.init`'s output (for `jax.jit`'s
    `out_shardings`). A size that does not divide its mesh axes raises ShardingError naming
    the parameter; so does a parameter without logical axes, rather than being replicated."""
    shapes: GroupParams = jax.eval_shape(ci_fn.init, jax.random.key(0))  # nothing computed

    def placed(path: tuple[object, ...], leaf: jax.ShapeDtypeStruct) -> NamedSharding:
        what = "CI parameter " + "/".join(
            str(getattr(k, "key", getattr(k, "idx", k))) for k in path
        )
        try:
            axes = ci_fn.param_axes(path, leaf.ndim)
        except ValueError as err:
            raise ShardingError(str(err)) from None
        return named_sharding(what, leaf.shape, axes, mesh, rules)

    return jax.tree_util.tree_map_with_path(placed, shapes)
