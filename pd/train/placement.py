"""Where a run's arrays live, decided once per run (`placement_of`): `OneDevice` or `OnMesh`.
Every way a single-device run differs from one sharded over a `(data, model)` mesh is a method
of these two classes; `run`, the compile-ahead helper and the batches call them without asking
which they have."""

from dataclasses import dataclass
from typing import ClassVar

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, SingleDeviceSharding
from jaxtyping import Array, Key

from pd.shard import ShardingError, global_batch, make_mesh
from pd.shard.state import frozen_shardings
from pd.state import TrainState
from pd.targets.base import Target
from pd.train.config import ConfigError, RunConfig
from pd.train.init_state import abstract_state, init_train_state, state_shapes, state_shardings
from pd.train.kinds import Batches, HostBatches, TargetKind
from pd.train.objective import Recipe
from pd.train.step import Sampler


@dataclass(frozen=True)
class OneDevice:
    """Everything on the default device. The step program draws its own batches (`sampler`),
    and the initializer and the step may compile while the target trains or loads
    (`starts_early`)."""

    starts_early: ClassVar[bool] = True

    def shardings(self, recipe: Recipe) -> TrainState | None:
        """The state's placements for the step program's `in/out_shardings`: jit's own."""
        del recipe
        return None

    @property
    def sharding(self) -> SingleDeviceSharding:
        """The default device's sharding, where every leaf of the state is placed."""
        return SingleDeviceSharding(jax.devices()[0])

    def abstract_state(self, recipe: Recipe) -> TrainState:
        """The state's shapes and dtypes, each leaf placed on the default device."""
        sharding = self.sharding
        return abstract_state(recipe, jax.tree.map(lambda _: sharding, state_shapes(recipe)))

    def init(self, recipe: Recipe, init_key: Key[Array, ""], src_key: Key[Array, ""]) -> TrainState:
        """A fresh state, committed to the device as a restored one is (jit's own output is
        not): a fresh and a resumed run then lower the same programs, so a resumed run finds
        them in the persistent compilation cache. Committing moves nothing."""
        state = init_train_state(recipe, init_key, src_key)
        placed: TrainState = jax.device_put(state, self.sharding)
        return placed

    def batches(self, host: HostBatches) -> Batches:
        return lambda step: jnp.asarray(host(step))

    def frozen(self, target: Target, params: hk.Params) -> hk.Params:
        del target
        return params

    def sampler(self, kind: TargetKind, target: Target, batch: int) -> Sampler | None:
        """Where the step program draws its batches on the device (toys), else None."""
        return kind.sampler(target, batch)


@dataclass(frozen=True)
class OnMesh:
    """Every array over `mesh` (SPEC §11): the state by `state_shardings`, the frozen weights by
    `frozen_shardings`, each batch split over `data` from the host. Nothing starts before the
    target is loaded: on several hosts, a background computation could order collectives
    unlike another host's."""

    mesh: Mesh
    starts_early: ClassVar[bool] = False

    def shardings(self, recipe: Recipe) -> TrainState:
        return state_shardings(recipe, self.mesh)

    def abstract_state(self, recipe: Recipe) -> TrainState:
        return abstract_state(recipe, self.shardings(recipe))

    def init(self, recipe: Recipe, init_key: Key[Array, ""], src_key: Key[Array, ""]) -> TrainState:
        return init_train_state(recipe, init_key, src_key, self.mesh)

    def batches(self, host: HostBatches) -> Batches:
        return lambda step: global_batch(np.asarray(host(step)), self.mesh)

    def frozen(self, target: Target, params: hk.Params) -> hk.Params:
        placed: hk.Params = jax.device_put(params, frozen_shardings(target, params, self.mesh))
        return placed

    def sampler(self, kind: TargetKind, target: Target, batch: int) -> Sampler | None:
        del kind, target, batch  # batches are placed from the host
        return None


Placement = OneDevice | OnMesh
ONE_DEVICE = OneDevice()


def placement_of(config: RunConfig) -> Placement:
    """The run's placement: one device, unless `mesh` asks for more than one or the run spans
    processes."""
    m = config.mesh
    if m.data * m.model == 1 and jax.process_count() == 1:
        return ONE_DEVICE
    try:
        return OnMesh(make_mesh({"data": m.data, "model": m.model}))
    except ShardingError as err:
        raise ConfigError(f"config key 'mesh': {err}") from None
