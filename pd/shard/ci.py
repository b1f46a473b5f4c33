"""Placement of the chunkwise-transformer CI parameters (SPEC §4.1, §11): weights on their wide
axis, biases replicated, the stacked `chunks` axis left to the rules (unsharded by default)."""

from collections.abc import Mapping

import jax
from jax.sharding import Mesh, NamedSharding

from pd.ci import GroupParams
from pd.ci.chunkwise import ChunkwiseTransformer
from pd.shard import DEFAULT_RULES, MeshAxes, ShardingError, named_sharding

# Logical axes of one chunk's weights, by parameter name (after the leading `chunks` axis).
# Megatron-style: a matmul into the wide space (d_model, heads, mlp) splits its output
# columns, one out of it splits its input rows, so a pair needs one reduction and no gather.
WEIGHT_AXES: dict[str, tuple[str | None, ...]] = {
    "w_in": (None, "wide"),  # [input_dim, d_model]
    "q": (None, "wide"),  # [d_model, d_model]: output columns are heads
    "k": (None, "wide"),
    "v": (None, "wide"),
    "o": ("wide", None),  # [d_model, d_model]: input rows are heads
    "mlp_in": (None, "wide"),  # [d_model, mlp_hidden]
    "mlp_out": ("wide", None),  # [mlp_hidden, d_model]
    "w_out": ("wide", None),  # [d_model, ΣC]
}
BIASES = frozenset({"w_in_b", "mlp_in_b", "mlp_out_b", "w_out_b"})  # small: replicated

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
        if name in BIASES:
            axes: tuple[str | None, ...] = (None,) * (len(shape) - 1)
        elif name in WEIGHT_AXES:
            axes = WEIGHT_AXES[name]
        else:
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
