"""Placement of the chunkwise-transformer CI parameters (SPEC §4.1, §11): weights on their wide
axis over `model` and their other axis over `data` (`pd.ci.chunkwise.WEIGHT_AXES`), biases
replicated, the stacked `chunks` axis left to the rules (unsharded by default)."""

from collections.abc import Mapping

import jax
from jax.sharding import Mesh, NamedSharding

from pd.ci import GroupParams
from pd.ci.chunkwise import WEIGHT_AXES, ChunkwiseTransformer, param_axes
from pd.shard import DEFAULT_RULES, MeshAxes, ShardingError, named_sharding

# Shaped like `ChunkwiseTransformer.init`'s output: one dict of modules of parameters.
ChunkShardings = tuple[dict[str, dict[str, NamedSharding]], ...]


def chunk_param_shardings(
    ct: ChunkwiseTransformer, mesh: Mesh, rules: Mapping[str, MeshAxes] = DEFAULT_RULES
) -> ChunkShardings:
    """Every stacked parameter's NamedSharding, for `jax.jit(ct.init, out_shardings=…)`.

    A wide size that does not divide its mesh axes raises ShardingError naming the parameter;
    an unknown parameter name raises too, rather than silently replicating a new weight.
    """
    abstract: GroupParams = jax.eval_shape(lambda: ct.init(jax.random.key(0)))  # no compile

    def placed(module: str, name: str, shape: tuple[int, ...]) -> NamedSharding:
        what = f"chunkwise CI parameter {module}/{name}"
        axes = param_axes(name, len(shape) - 1)
        if axes is None:
            raise ShardingError(
                f"{what} has no logical axes, expected one of {sorted(WEIGHT_AXES)} or a bias"
            )
        return named_sharding(what, shape, ("chunks", *axes), mesh, rules)

    return tuple(
        {
            module: {name: placed(module, name, leaf.shape) for name, leaf in params.items()}
            for module, params in group.items()
        }
        for group in abstract
    )


def per_site_param_shardings(
    params: object, mesh: Mesh, rules: Mapping[str, MeshAxes] = DEFAULT_RULES
) -> object:
    """The placement of a per-site CI function's parameters (`[n_sites, …]` per shape group,
    here their shapes), each split over
    every device on its axis after the sites' (`spread`: a subcomponent MLP's C, a shared MLP's
    fan-in or width); one that does not divide raises ShardingError naming the parameter."""

    def placed(path: tuple[object, ...], leaf: jax.ShapeDtypeStruct) -> NamedSharding:
        what = f"per-site CI parameter {jax.tree_util.keystr(path)}"
        logical = (None, "spread", *(None,) * (leaf.ndim - 2))
        return named_sharding(what, leaf.shape, logical, mesh, rules)

    return jax.tree_util.tree_map_with_path(placed, params)
