"""The whole initial `TrainState` as one pure `(init_key, src_key) → state` function, jitted as
`init_train_state` with every leaf's placement as `out_shardings` (SPEC §10, §11)."""

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jaxtyping import Array, Key

from pd.adversary import Sources, init_source_adam, init_sources, scope_shape
from pd.init import init_ci_fn, init_vu
from pd.precision import DTYPES
from pd.shard import source_shardings, vu_shardings
from pd.shard.ci import ci_param_shardings
from pd.shard.state import train_state_shardings
from pd.state import TrainState
from pd.train.objective import Recipe
from pd.train.optim import ci_optimizer, component_optimizer
from pd.xla import init_options, one_per_value


def source_scope(recipe: Recipe) -> tuple[int, ...]:
    adv = recipe.loss.adversary
    return scope_shape(adv.scope, recipe.train.batch, recipe.seq_len)


def initial_state(recipe: Recipe, init_key: Key[Array, ""], src_key: Key[Array, ""]) -> TrainState:
    """Stacked V/U, CI parameters, sources and every optimizer state (SPEC §9 key tree)."""
    comps = init_vu(init_key, recipe.table)
    ci_params = init_ci_fn(init_key, recipe.ci_fn)
    sources: Sources = ()
    if recipe.loss.adversary.coeff > 0:
        # The adversarial term is term t = len(recon) in the source key tree (SPEC §9).
        sources = init_sources(src_key, len(recipe.loss.recon), recipe.table, source_scope(recipe))
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        components=comps,
        ci_params=ci_params,
        opt_components=component_optimizer(recipe.train).init(comps),
        opt_ci=ci_optimizer(recipe.train).init(ci_params),
        sources=sources,
        source_opt=init_source_adam(sources, DTYPES[recipe.train.moment_dtype]),
    )


def state_shardings(recipe: Recipe, mesh: Mesh) -> TrainState:
    """Where every leaf lives (SPEC §11): V/U and every CI weight over the whole mesh (ZeRO-3),
    sources by scope, optimizer moments like their parameters."""
    abstract = state_shapes(recipe)
    ci_params = ci_param_shardings(recipe.ci_fn, mesh)
    sources: tuple[NamedSharding, ...] = ()
    if abstract.sources:
        per_example = recipe.loss.adversary.scope in ("bc", "bsc")
        sources = source_shardings(recipe.table, source_scope(recipe), per_example, mesh)
    return train_state_shardings(
        abstract, vu_shardings(recipe.table, mesh), ci_params, sources, mesh
    )


def abstract_state(recipe: Recipe, shardings: TrainState) -> TrainState:
    """The state's shapes and dtypes, each leaf with its placement in `shardings`: what a
    checkpoint is restored into (`pd.train.placement` gives the placements)."""
    # ShapeDtypeStruct's constructor is unannotated upstream.
    struct: Callable[..., jax.ShapeDtypeStruct] = jax.ShapeDtypeStruct
    placed: TrainState = jax.tree.map(
        lambda a, s: struct(a.shape, a.dtype, sharding=s), state_shapes(recipe), shardings
    )
    return placed


def state_shapes(recipe: Recipe) -> TrainState:
    """The state's shapes and dtypes; nothing is computed or compiled."""
    shapes: TrainState = jax.eval_shape(
        lambda: initial_state(recipe, jax.random.key(0), jax.random.key(1))
    )
    return shapes


InitFn = Callable[[Key[Array, ""], Key[Array, ""]], TrainState]


@one_per_value
def jitted_init(recipe: Recipe, mesh: Mesh | None) -> InitFn:
    """`init_train_state` under jit; on a mesh, with every leaf's placement as out_shardings."""

    def init_train_state(init_key: Key[Array, ""], src_key: Key[Array, ""]) -> TrainState:
        return initial_state(recipe, init_key, src_key)

    out = None if mesh is None else state_shardings(recipe, mesh)
    fn: InitFn = jax.jit(init_train_state, out_shardings=out, compiler_options=init_options())
    return fn


def init_train_state(
    recipe: Recipe, init_key: Key[Array, ""], src_key: Key[Array, ""], mesh: Mesh | None = None
) -> TrainState:
    """The initial state, made under jit; on a mesh each device makes only its own shards."""
    return jitted_init(recipe, mesh)(init_key, src_key)
