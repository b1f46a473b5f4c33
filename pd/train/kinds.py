"""What differs between toy targets and language models, decided once (`kind_of`): the model,
its frozen weights, its batches and its evaluation."""

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import cast

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jaxtyping import Array, Int, Key, PyTree

from pd.shard import global_batch
from pd.targets.base import Batch, Target, ToyTarget, as_toy
from pd.targets.configs import FactoryConfig, LlamaConfig, TargetConfig, ToyConfig
from pd.targets.lm import build_llama, load_llama, token_labels, token_source
from pd.targets.train import TrainedTarget, load_or_train, trained_shapes
from pd.train.config import ConfigError, RunConfig
from pd.train.evaluate import Evaluate, KnownAnswer, evaluate_toy, toy_answer
from pd.train.evaluate_masks import evaluate_masks
from pd.train.step import Sampler, ToySampler, make_sampler

Batches = Callable[[int], Batch]  # the global batch of a step (S18), placed on the mesh
Labels = Callable[[list[int]], list[str]]  # token ids → their text, for figures
HostBatches = Callable[[int], np.ndarray | jax.Array]
# `(seed, batch size, target, run key) → batches`
MakeBatches = Callable[[int, int, Target, Key[Array, ""]], HostBatches]


@dataclass(frozen=True)
class TargetKind:
    """One kind of target, bound to its config."""

    build: Callable[[int], Target]  # C → the target
    seq_len: int  # positions per example beyond the batch (0 for toys)
    check_inputs: Callable[[], object]  # opens what the run reads, before any compile
    load_frozen: Callable[[Target], TrainedTarget]
    batches: MakeBatches
    eval_batches: MakeBatches  # held-out data where the target has it, else `batches`
    evaluate: Evaluate
    known: Callable[[Target], KnownAnswer | None]  # for the known-answer metrics and figures
    labels: Labels | None = None
    # Where a step can draw its own batches (toys, a caller's jittable ones): `(target, batch
    # size) → the batch of a step`, and the frozen weights' shapes before they are loaded.
    sampler: Callable[[Target, int], Sampler] | None = None
    frozen_shapes: Callable[[Target], PyTree[jax.ShapeDtypeStruct]] | None = None
    # The config as `config.json` records it: what the run really used.
    recorded: Callable[[RunConfig], RunConfig] = lambda config: config


def _toy_batches(seed: int, batch: int, target: Target, run_key: Key[Array, ""]) -> HostBatches:
    """Drawn on device from `fold_in(fold_in(run_key, step), 0)` (S18)."""
    del seed  # in run_key
    sample = make_sampler(as_toy(target), batch)
    return lambda step: sample(run_key, jnp.asarray(step, jnp.int32))


def _toy_sampler(target: Target, batch: int) -> Sampler:
    return ToySampler(as_toy(target), batch)


def _lm_batches(
    cfg: LlamaConfig,
    held_out: bool,
    seed: int,
    batch: int,
    target: Target,
    run_key: Key[Array, ""],
) -> HostBatches:
    """Windows of the tokens drawn host-side by a Philox generator keyed `(seed, step)`."""
    del target, run_key
    tokens = token_source(cfg, held_out)
    return lambda step: tokens.batch(seed, step, batch, cfg.seq_len)


def _check_lm_inputs(cfg: LlamaConfig) -> None:
    for held_out in (False, True):  # each part must hold a window
        token_source(cfg, held_out).batch(0, 0, 1, cfg.seq_len)


def _load_toy(cfg: ToyConfig, target: Target) -> TrainedTarget:
    toy: ToyTarget = as_toy(target)
    return load_or_train(cfg, toy)


@dataclass(frozen=True)
class OwnTarget:
    """A target of the caller's own, for `run`: any Target (`pd.targets.haiku.haiku_target`
    makes one from a haiku model), its frozen parameters and its batches. `batches(step)` must be
    a pure function of the step (S18); the evaluation reads steps counting down from
    `EVAL_FOLD` of `eval_batches` (default: `batches`). `seq_len` fixes the shape of
    sequence-scoped adversarial sources (0: no sequence axis). `known` declares the answer a
    decomposition should find, for the known-answer metrics and figures (toy models).

    `jittable`: `batches` is also a jax function of a traced int32 step (jax.numpy and
    jax.random, no host data). A single-device run then draws each step's batch inside its step
    program and takes the steps between logged steps as one call, as it does for pd's toys: no
    host round trip per step. Arrays it closes over become constants of that program (S18
    keeps the frozen weights out of it): a key or a small table, not a dataset."""

    target: Target
    frozen: hk.Params
    batches: Callable[[int], Batch]
    eval_batches: Callable[[int], Batch] | None = None
    seq_len: int = 0
    known: KnownAnswer | None = None
    jittable: bool = False


@dataclass(frozen=True)
class StepBatches:
    """A caller's jittable `batches(step)` as the step program's sampler (S18's key is pd's)."""

    batches: Callable[[int], Batch]

    def __call__(self, run_key: Key[Array, ""], step: Int[Array, ""]) -> Batch:
        del run_key
        batches = cast(Callable[[Int[Array, ""]], Batch], self.batches)  # traced, as declared
        return batches(step)


def _check_jittable(own: OwnTarget) -> None:
    """A `jittable` caller's batches trace with a traced step, to `batches(0)`'s shape."""
    if not own.jittable:
        return
    want = jax.eval_shape(lambda: jnp.asarray(own.batches(0)))
    try:
        got = jax.eval_shape(StepBatches(own.batches), jax.random.key(0), jnp.int32(0))
    except Exception as err:  # whatever the caller's function raises under tracing
        raise ConfigError(
            f"OwnTarget.jittable is True but batches(step) cannot be traced with a traced step "
            f"({type(err).__name__}: {str(err).splitlines()[0]}), expected a jax function of the "
            "step (or jittable=False)"
        ) from None
    if (got.shape, got.dtype) != (want.shape, want.dtype):
        raise ConfigError(
            f"OwnTarget.jittable is True but batches(step) traced gives {got.dtype}"
            f"{list(got.shape)} where batches(0) gives {want.dtype}{list(want.shape)}, expected "
            "the same batch"
        )


def _own_recorded(own: OwnTarget, config: RunConfig) -> RunConfig:
    """The config a caller's target ran with: the target as one given in Python (`pd.load` asks
    for it again) unless a factory names it, its sites' C where they share one (the config's is
    not read), and the size of its batches in place of `train.batch` (nor is that)."""
    target = config.target if isinstance(config.target, FactoryConfig) else FactoryConfig()
    Cs = {site.C for site in own.target.table.sites}
    C = Cs.pop() if len(Cs) == 1 else config.C
    batch = int(np.shape(own.batches(0))[0])
    train = dataclasses.replace(config.train, batch=batch)
    return dataclasses.replace(config, target=target, C=C, train=train)


def own_kind(own: OwnTarget) -> TargetKind:
    """The kind of a caller's target: nothing to build, load or train."""
    evaluation = own.eval_batches or own.batches
    sampler = StepBatches(own.batches)  # one object: the run's programs are made for it once
    return TargetKind(
        build=lambda C: own.target,
        seq_len=own.seq_len,
        check_inputs=partial(_check_jittable, own),
        load_frozen=lambda target: TrainedTarget.of(own.frozen, "given in Python"),
        batches=lambda seed, batch, target, run_key: own.batches,
        eval_batches=lambda seed, batch, target, run_key: evaluation,
        evaluate=partial(evaluate_masks, known=own.known),
        known=lambda target: own.known,
        sampler=(lambda target, batch: sampler) if own.jittable else None,
        frozen_shapes=(lambda target: jax.eval_shape(lambda: own.frozen)) if own.jittable else None,
        recorded=partial(_own_recorded, own),
    )


def resolve_factory(cfg: FactoryConfig) -> OwnTarget:
    """Call the function `cfg.factory` names (`"package.module:function"`) for its OwnTarget."""
    spec = cfg.factory
    module_name, sep, attr = spec.partition(":")
    want = "'package.module:function' naming a function that returns a pd.train.OwnTarget"
    if not spec:
        raise ConfigError(
            f"config key 'target.factory' is empty, expected {want} (a target given to "
            "run(own=...) in Python must be given again: pd.load(run_dir, own=...))"
        )
    if not sep or not module_name or not attr:
        raise ConfigError(f"config key 'target.factory' is {spec!r}, expected {want}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(
            f"config key 'target.factory' is {spec!r}, whose module cannot be imported ({err}), "
            f"expected {want}"
        ) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError(
            f"config key 'target.factory' is {spec!r}, but module '{module_name}' has no "
            f"function '{attr}', expected {want}"
        )
    own = factory()
    if not isinstance(own, OwnTarget):
        raise ConfigError(
            f"config key 'target.factory' is {spec!r}, whose function returned a "
            f"{type(own).__name__}, expected a pd.train.OwnTarget"
        )
    return own


def kind_of(cfg: TargetConfig, own: OwnTarget | None = None) -> TargetKind:
    """The one place that tells language models from toys and from a caller's own targets
    (`own`, or the one `cfg` names by its factory)."""
    if own is not None:
        return own_kind(own)
    if isinstance(cfg, FactoryConfig):
        return own_kind(resolve_factory(cfg))
    if isinstance(cfg, LlamaConfig):
        return TargetKind(
            build=partial(build_llama, cfg),
            seq_len=cfg.seq_len,
            check_inputs=partial(_check_lm_inputs, cfg),
            load_frozen=partial(load_llama, cfg),
            batches=partial(_lm_batches, cfg, False),
            eval_batches=partial(_lm_batches, cfg, bool(cfg.text)),
            evaluate=evaluate_masks,
            known=lambda target: None,
            labels=partial(token_labels, cfg) if cfg.text else None,
        )
    return TargetKind(
        build=cfg.build,
        seq_len=0,
        check_inputs=lambda: None,
        load_frozen=partial(_load_toy, cfg),
        batches=_toy_batches,
        eval_batches=_toy_batches,
        evaluate=lambda recipe, state, frozen, _, run_key, cfg: evaluate_toy(
            recipe, state, frozen, run_key, cfg
        ),
        known=lambda target: toy_answer(as_toy(target)),
        sampler=_toy_sampler,
        frozen_shapes=lambda target: trained_shapes(as_toy(target)),
    )


def placed(batches: HostBatches, mesh: Mesh | None) -> Batches:
    """Batches on the mesh (built with `make_array_from_process_local_data`), or as they are."""
    if mesh is None:
        return lambda step: jnp.asarray(batches(step))
    return lambda step: global_batch(np.asarray(batches(step)), mesh)
