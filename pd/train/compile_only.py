"""`--compile-only`: trace, lower and compile `init_train_state` and `train_step` against abstract
inputs (`jax.ShapeDtypeStruct`s carrying their shardings) — nothing is allocated, so a
production-shaped run's compile cost can be measured on simulated CPU devices."""

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.stages import Compiled

from pd.compile_times import CompileTimes, recording
from pd.shard import ShardingError, make_mesh, named_sharding
from pd.shard.state import frozen_shardings, replicated
from pd.train.config import ConfigError, RunConfig
from pd.train.init_state import jitted_init, state_shardings
from pd.train.kinds import kind_of
from pd.train.run import make_recipe
from pd.train.step import make_train_step
from pd.xla import shape_dtype


def abstract(tree: object, shardings: object) -> object:
    """`ShapeDtypeStruct`s of `tree`'s leaves with the matching shardings."""
    return jax.tree.map(
        lambda leaf, s: shape_dtype(leaf.shape, leaf.dtype, sharding=s), tree, shardings
    )


@dataclass(frozen=True)
class Memory:
    """A compiled program's memory on one device, in bytes, from XLA's `memory_analysis()`."""

    arguments: int
    outputs: int
    aliased: int  # outputs that reuse an argument's buffer (the donated train state)
    temporaries: int

    @property
    def peak(self) -> int:
        """Arguments, outputs not aliased to them and temporaries: the program's footprint."""
        return self.arguments + self.outputs - self.aliased + self.temporaries


def memory(compiled: Compiled) -> Memory | None:
    """The program's memory per device; None where the backend gives no analysis."""
    m = compiled.memory_analysis()
    if m is None:
        return None
    return Memory(
        m.argument_size_in_bytes,
        m.output_size_in_bytes,
        m.alias_size_in_bytes,
        m.temp_size_in_bytes,
    )


@dataclass(frozen=True)
class CompileReport:
    """What `--compile-only` measures: the compile table, each program's FLOPs as XLA's cost
    analysis counts them (loop bodies once) and the step's memory, all per device."""

    times: CompileTimes
    flops: dict[str, float]
    step_memory: Memory | None


def compile_only(config: RunConfig) -> CompileReport:
    """Lower and compile the run's initializer and step, and report what it costs."""
    times, compiled = compile_programs(config)
    flops = {
        name: float((c.cost_analysis() or {}).get("flops", 0.0)) for name, c in compiled.items()
    }
    return CompileReport(times, flops, memory(compiled["train_step"]))


def compile_programs(config: RunConfig) -> tuple[CompileTimes, dict[str, Compiled]]:
    """The compile table and the compiled `init_train_state` and `train_step` of the run, for
    their cost and memory analyses."""
    kind = kind_of(config.target)
    recipe = make_recipe(config, kind)
    frozen_shape = kind.checkpoint_shapes(recipe.target)
    if frozen_shape is None:
        raise ConfigError(
            f"--compile-only needs a language-model target, not '{config.target.kind}'"
        )
    try:
        mesh = make_mesh({"data": config.mesh.data, "model": config.mesh.model})
    except ShardingError as err:
        raise ConfigError(f"config key 'mesh': {err}") from None
    shardings = state_shardings(recipe, mesh)
    key = jax.eval_shape(lambda: jax.random.key(0))
    key = shape_dtype(key.shape, key.dtype, sharding=replicated(mesh))
    frozen = abstract(frozen_shape, frozen_shardings(recipe.target, frozen_shape, mesh))
    B, T = config.train.batch, kind.seq_len
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
