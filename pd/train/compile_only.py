"""`--compile-only`: trace, lower and compile `init_train_state` and `train_step` against abstract
inputs (`jax.ShapeDtypeStruct`s carrying their shardings) — nothing is allocated, so a
production-shaped run's compile cost can be measured on simulated CPU devices."""

import jax
import jax.numpy as jnp
from jax.stages import Compiled

from pd.compile_times import CompileTimes, recording
from pd.shard import ShardingError, make_mesh, named_sharding
from pd.shard.state import frozen_shardings, replicated
from pd.targets.configs import LlamaConfig
from pd.targets.llama import Llama
from pd.train.ahead import shape_dtype
from pd.train.config import ConfigError, RunConfig
from pd.train.init_state import jitted_init, state_shardings
from pd.train.run import make_recipe
from pd.train.step import make_train_step

# A language model's frozen weights are held in bf16, as a production run loads them.
FROZEN_DTYPE = jnp.bfloat16


def abstract(tree: object, shardings: object) -> object:
    """`ShapeDtypeStruct`s of `tree`'s leaves with the matching shardings."""
    return jax.tree.map(
        lambda leaf, s: shape_dtype(leaf.shape, leaf.dtype, sharding=s), tree, shardings
    )


def compile_only(config: RunConfig) -> tuple[CompileTimes, dict[str, float]]:
    """Lower and compile the run's initializer and step; returns the compile table and each
    compiled program's FLOPs as XLA's cost analysis counts them (per device)."""
    times, compiled = compile_programs(config)
    flops = {
        name: float((c.cost_analysis() or {}).get("flops", 0.0)) for name, c in compiled.items()
    }
    return times, flops


def compile_programs(config: RunConfig) -> tuple[CompileTimes, dict[str, Compiled]]:
    """The compile table and the compiled `init_train_state` and `train_step` of the run, for
    their cost and memory analyses."""
    if not isinstance(config.target, LlamaConfig):
        raise ConfigError(
            f"--compile-only needs a language-model target, not '{config.target.kind}'"
        )
    recipe = make_recipe(config)
    assert isinstance(recipe.target, Llama)
    try:
        mesh = make_mesh({"data": config.mesh.data, "model": config.mesh.model})
    except ShardingError as err:
        raise ConfigError(f"config key 'mesh': {err}") from None
    shardings = state_shardings(recipe, mesh)
    key = jax.eval_shape(lambda: jax.random.key(0))
    key = shape_dtype(key.shape, key.dtype, sharding=replicated(mesh))
    frozen_shape = jax.eval_shape(recipe.target.init, jax.random.key(0))
    frozen_shape = jax.tree.map(lambda a: shape_dtype(a.shape, FROZEN_DTYPE), frozen_shape)
    frozen = abstract(frozen_shape, frozen_shardings(recipe.target, frozen_shape, mesh))
    B, T = config.train.batch, config.target.seq_len
    batch = shape_dtype(
        (B, T), jnp.int32, sharding=named_sharding("batch", (B, T), ("batch", None), mesh)
    )
    with recording() as times:
        init = jitted_init(recipe, mesh)
        compiled = {"init_train_state": init.trace(key, key).lower().compile()}  # type: ignore[attr-defined]  # jit's AOT API
        state = abstract(jax.eval_shape(init, key, key), shardings)
        step = make_train_step(recipe, shardings)
        compiled["train_step"] = step.trace(state, frozen, batch, key).lower().compile()  # type: ignore[attr-defined]  # jit's AOT API
    return times, compiled
