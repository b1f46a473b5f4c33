"""Placement of every `TrainState` leaf (SPEC §11), from the shardings of the parameters."""

import operator
from collections.abc import Sequence

import jax
import optax
from jax.sharding import Mesh, NamedSharding

from pd.shard import ShardingError, _spec, named_sharding
from pd.state import Components, TrainState
from pd.targets.base import FrozenShapes, Target


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, _spec())


def like_params(opt_state: optax.OptState, params: object, mesh: Mesh) -> optax.OptState:
    """An optimizer state's shardings: every subtree shaped like the parameters (Adam's moments)
    is placed like them; everything else (step counts) is replicated."""
    structure = jax.tree.structure(params)

    def is_params(node: object) -> bool:
        return bool(operator.eq(jax.tree.structure(node), structure))

    placed: optax.OptState = jax.tree.map(
        lambda node: params if is_params(node) else replicated(mesh), opt_state, is_leaf=is_params
    )
    return placed


def train_state_shardings(
    abstract: TrainState,
    components: Components,
    ci_params: object,
    sources: Sequence[NamedSharding],
    mesh: Mesh,
) -> TrainState:
    """Every leaf's NamedSharding, given those of the components, CI parameters and sources."""
    sources = tuple(sources)
    if len(sources) != len(abstract.sources):
        raise ShardingError(
            f"sources: {len(sources)} shardings for {len(abstract.sources)} C groups, expected one"
        )
    sharded: TrainState = TrainState(
        step=replicated(mesh),  # type: ignore[arg-type]  # a tree of shardings in the state layout
        components=components,
        ci_params=ci_params,  # type: ignore[arg-type]  # a tree of shardings in the params layout
        opt_components=like_params(abstract.opt_components, components, mesh),
        opt_ci=like_params(abstract.opt_ci, ci_params, mesh),
        sources=sources,  # type: ignore[arg-type]  # shardings in the sources layout
        source_opt=like_params(abstract.source_opt, sources, mesh),  # type: ignore[arg-type]  # shardings in the state layout
    )
    return sharded


def frozen_shardings(target: Target, frozen: FrozenShapes, mesh: Mesh) -> object:
    """The frozen target's placement, from its logical axes (`Target.frozen_axes`): a language
    model's matrices over the whole mesh, gathered one layer at a time where they are used."""
    axes = target.frozen_axes(frozen)
    return {
        m: {
            n: named_sharding(f"frozen {m}/{n}", leaf.shape, axes[m][n], mesh)
            for n, leaf in p.items()
        }
        for m, p in frozen.items()
    }
