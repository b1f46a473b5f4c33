"""A group's jitted programs: one member's functions, vmapped over the members and sharded
over the devices along the member axis."""

import dataclasses
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar, cast

import haiku as hk
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Key

from pd.init import key_tree
from pd.state import TrainState
from pd.targets.base import Batch
from pd.targets.configs import TargetConfig
from pd.train.ahead import compile_for
from pd.train.config import ConfigError, RunConfig
from pd.train.init_state import initial_state
from pd.train.kinds import TargetKind, kind_of, reseeded
from pd.train.objective import Metrics, Recipe, state_monitors
from pd.train.recipe import make_recipe
from pd.train.step import Sampler, faith_warmup, step_fn, steps_fn
from pd.train.sweep.spec import Member, SweepSpec
from pd.xla import compiler_options, init_options, shape_dtype

_spec: Callable[..., P] = P  # its constructor is unannotated upstream
MEMBERS = _spec("members")  # the leading axis of every per-member array
SHARED = _spec()


@dataclass(frozen=True)
class Group:
    """Members that share one recipe, so one compiled program; their target kinds."""

    recipe: Recipe
    members: tuple[Member, ...]
    kinds: tuple[TargetKind, ...]

    @property
    def sampler(self) -> Sampler | None:
        """Where the program draws the members' batches (toys: S18); else they come from the
        host."""
        return self.kinds[0].sampler(self.recipe.target, self.recipe.train.batch)


def static_config(config: RunConfig) -> RunConfig:
    """What the members of one group share: the config without its name and seeds."""
    target = reseeded(config.target, 0) or config.target
    return dataclasses.replace(config, name="run", seed=0, target=target)


def group_members(spec: SweepSpec) -> list[Group]:
    """The members grouped by their static config, each group checked before anything runs."""
    names = [m.name for m in spec.members]
    if not names:
        raise ConfigError("a sweep needs at least one member, expected one seed or more")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"sweep member '{repeated[0]}' is named twice, expected unique names")
    by_static: dict[RunConfig, list[Member]] = {}
    for member in spec.members:
        by_static.setdefault(static_config(member.config), []).append(member)
    groups = []
    for members in by_static.values():
        config = members[0].config
        mesh = config.mesh
        if mesh.data * mesh.model != 1 or config.distributed.coordinator:
            raise ConfigError(
                f"config key 'mesh' is {mesh.data}x{mesh.model} (coordinator "
                f"'{config.distributed.coordinator}'), expected 1x1 and no coordinator in a sweep "
                "(each member runs on one device; the sweep spreads its members over the devices)"
            )
        if config.train.wandb != "off":
            raise ConfigError(
                f"config key 'train.wandb' is '{config.train.wandb}', expected 'off' in a sweep "
                "(its members would be W&B runs open at once in one process, which pd does not "
                "support)"
            )
        kinds: dict[TargetConfig, TargetKind] = {}
        for m in members:
            if m.config.target not in kinds:
                kinds[m.config.target] = kind_of(m.config.target)
        recipe = make_recipe(config, kinds[config.target])
        for kind in kinds.values():
            kind.check_inputs()
        groups.append(Group(recipe, tuple(members), tuple(kinds[m.config.target] for m in members)))
    return groups


F = TypeVar("F", bound=Callable[..., object])


def per_member(
    f: F, mesh: Mesh, options: dict[str, str], in_specs: tuple[P, ...], donate: bool = False
) -> F:
    """`f` of one member, vmapped over the members' leading axis (`MEMBERS` arguments; `SHARED`
    ones are broadcast) and sharded over `mesh`'s member axis, under jit with the compiler
    `options`; `donate`: the first argument's buffers."""
    in_axes = tuple(0 if spec == MEMBERS else None for spec in in_specs)
    mapped = jax.vmap(f, in_axes=in_axes)
    sharded = jax.shard_map(mapped, mesh=mesh, in_specs=in_specs, out_specs=MEMBERS)
    donate_argnums = (0,) if donate else ()
    return cast(F, jax.jit(sharded, donate_argnums=donate_argnums, compiler_options=options))


# `train_step` over stacked members: states, frozen (stacked or shared), batches, run keys.
StackedStep = Callable[[TrainState, hk.Params, Batch, Key[Array, " n"]], tuple[TrainState, Metrics]]


# `train_steps` over stacked members: states, frozen, run keys, the (shared) number of steps.
StackedSteps = Callable[
    [TrainState, hk.Params, Key[Array, " n"], jax.Array], tuple[TrainState, Metrics]
]


@dataclass(frozen=True)
class Programs:
    """A group's jitted functions over stacked members, named as a single run's are."""

    init: Callable[[Key[Array, " n"], Key[Array, " n"]], TrainState]
    warmup: Callable[[TrainState, hk.Params], TrainState]
    step: StackedStep
    steps: StackedSteps | None  # toys (it returns the monitors too)
    monitors: Callable[[TrainState, hk.Params, Batch], Metrics] | None  # the others


def make_programs(group: Group, mesh: Mesh, stacked_frozen: bool) -> Programs:
    recipe = group.recipe
    frozen = MEMBERS if stacked_frozen else SHARED
    options = compiler_options(recipe.ci_fn)

    def init_train_state(init_key: Key[Array, ""], src_key: Key[Array, ""]) -> TrainState:
        return initial_state(recipe, init_key, src_key)

    def faithfulness_warmup(state: TrainState, frozen: hk.Params) -> TrainState:
        return state._replace(components=faith_warmup(recipe, state.components, frozen))

    def monitor_step(state: TrainState, frozen: hk.Params, x: Batch) -> Metrics:
        return state_monitors(recipe, state, frozen, x)  # as `pd.train.run` computes them

    steps = monitors = None
    if (sample := group.sampler) is not None:
        steps_of_one = steps_fn(recipe, sample)
        steps = per_member(steps_of_one, mesh, options, (MEMBERS, frozen, MEMBERS, SHARED), True)
    else:
        monitors = per_member(monitor_step, mesh, options, (MEMBERS, frozen, MEMBERS))
    return Programs(
        init=per_member(init_train_state, mesh, options | init_options(), (MEMBERS, MEMBERS)),
        warmup=per_member(faithfulness_warmup, mesh, options, (MEMBERS, frozen), donate=True),
        step=per_member(step_fn(recipe), mesh, options, (MEMBERS, frozen, MEMBERS, MEMBERS), True),
        steps=steps,
        monitors=monitors,
    )


def stacked_keys(seeds: list[int]) -> tuple[Key[Array, " n"], Key[Array, " n"], Key[Array, " n"]]:
    """The members' init, source and run keys (`pd.init.key_tree` of each seed), stacked."""
    trees = [key_tree(seed) for seed in seeds]
    init, src, run = (jnp.stack([tree[j] for tree in trees]) for j in range(3))
    return init, src, run


def compile_ahead(
    pool: ThreadPoolExecutor,
    programs: Programs,
    group: Group,
    mesh: Mesh,
    seeds: list[int],
    stacked_frozen: bool,
) -> list[Future[None]]:
    """Begin compiling on `pool`, while the targets train or load, the programs that the chunk
    of members with `seeds` calls first, for its shapes and placements: the initializer, and
    where the target's shapes are known before it is trained (toys, a caller's jittable target)
    the warmup and the steps, as a run does (`pd.train.ahead`)."""
    on_members = NamedSharding(mesh, MEMBERS)
    init, src, run = jax.device_put(stacked_keys(seeds), on_members)
    futures = [pool.submit(compile_for, programs.init, init, src)]
    frozen = group.kinds[0].frozen_shapes(group.recipe.target)
    if frozen is None:
        return futures

    def placed(shape: jax.ShapeDtypeStruct, sharding: NamedSharding) -> jax.ShapeDtypeStruct:
        return shape_dtype(shape.shape, shape.dtype, sharding=sharding)

    # The program's outputs are placed along the member axis (`per_member`'s out_specs).
    state = jax.tree.map(lambda a: placed(a, on_members), jax.eval_shape(programs.init, init, src))
    if stacked_frozen:
        n = len(seeds)
        frozen = jax.tree.map(
            lambda a: shape_dtype((n, *a.shape), a.dtype, sharding=on_members), frozen
        )
    else:
        frozen = jax.tree.map(lambda a: placed(a, NamedSharding(mesh, SHARED)), frozen)
    if group.recipe.train.faith_warmup_steps > 0:
        futures.append(pool.submit(compile_for, programs.warmup, state, frozen))
    if programs.steps is not None:
        n_steps = shape_dtype((), jnp.int32)
        futures.append(pool.submit(compile_for, programs.steps, state, frozen, run, n_steps))
    return futures
