"""What differs between pd's toys, language models and a caller's own targets, decided once
(`kind_of`): a `TargetKind` builds the model, loads its frozen weights, gives its batches and
evaluates a decomposition of it. This is the one module that tells target and config types
apart."""

import abc
import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import cast

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, Key, PyTree

from pd.state import TrainState
from pd.targets.base import Batch, Target, ToyTarget
from pd.targets.configs import FactoryConfig, LlamaConfig, TargetConfig, ToyConfig
from pd.targets.llama import Llama
from pd.targets.lm import build_llama, load_llama, token_ids, token_labels, token_source
from pd.targets.train import TrainedTarget, load_or_train, trained_shapes
from pd.train.config import ConfigError, EvalConfig, RunConfig
from pd.train.evaluate import EVAL_FOLD, KnownAnswer, evaluate_toy, toy_answer
from pd.train.evaluate_masks import evaluate_masks
from pd.train.objective import Recipe
from pd.train.step import Sampler, ToySampler, make_sampler
from pd.xla import shape_dtype

Batches = Callable[[int], Batch]  # the global batch of a step (S18), placed on the mesh
Labels = Callable[[list[int]], list[str]]  # token ids → their text, for figures
Encoder = Callable[[str], list[int]]  # text → token ids
HostBatches = Callable[[int], np.ndarray | jax.Array]
# A language model's frozen weights are held in bf16, as a production run loads them.
FROZEN_DTYPE = jnp.bfloat16


@dataclass(frozen=True)
class Draw:
    """What a run's batches are a function of, besides the step (S18)."""

    seed: int  # the run's
    size: int  # examples per batch
    target: Target
    run_key: Key[Array, ""]


class TargetKind(abc.ABC):
    """One kind of target, bound to its config. The defaults are those of a target with no known
    answer whose batches come from the host."""

    given_frozen: bool = False  # the frozen weights are the caller's (pd.load compares them)

    @property
    def seq_len(self) -> int:
        """Positions per example beyond the batch (0: no sequence axis)."""
        return 0

    @property
    def labels(self) -> Labels | None:
        """Token ids → their text, for figures, where the target has text."""
        return None

    @property
    def encoder(self) -> Encoder | None:
        """Text → token ids, where the target reads text."""
        return None

    @abc.abstractmethod
    def build(self, C: int) -> Target: ...

    def check_inputs(self) -> None:
        """Open what the run reads, before any compile; a problem is a ConfigError or
        DataError. Nothing, where the run reads nothing beyond the config."""
        return None

    @abc.abstractmethod
    def load_frozen(self, target: Target) -> TrainedTarget: ...

    @abc.abstractmethod
    def batches(self, draw: Draw, held_out: bool = False) -> HostBatches:
        """The batch of a step; `held_out`: from the data kept for evaluation where the target
        has such data."""

    def evaluate(
        self,
        recipe: Recipe,
        state: TrainState,
        frozen: hk.Params,
        batches: Batches,
        run_key: Key[Array, ""],
        cfg: EvalConfig,
    ) -> dict[str, float]:
        """The flat summary of a decomposition (SPEC §13)."""
        known = self.known(recipe.target)
        return evaluate_masks(recipe, state, frozen, batches, run_key, cfg, known)

    def known(self, target: Target) -> KnownAnswer | None:
        """The answer a decomposition should find, for the known-answer metrics and figures."""
        return None

    def figure_batch(self, eval_batches: Batches) -> Batch | None:
        """The evaluation batch the figures draw their CI over (None: the figures need none)."""
        return eval_batches(EVAL_FOLD)

    def sampler(self, target: Target, batch: int) -> Sampler | None:
        """Where a step can draw its own batches of `batch` examples, the sampler it calls."""
        return None

    def frozen_shapes(self, target: Target) -> PyTree[jax.ShapeDtypeStruct] | None:
        """The frozen weights' shapes before they are trained or loaded, where the kind knows
        them."""
        return None

    def checkpoint_shapes(self, target: Target) -> PyTree[jax.ShapeDtypeStruct] | None:
        """The frozen weights' shapes and dtypes as a loaded checkpoint holds them, for
        `--compile-only` (None: the kind loads no checkpoint)."""
        return None

    def residual_width(self, target: Target) -> int | None:
        """The width of the residual stream a chunkwise CI function reads (None: no such
        stream)."""
        return None

    def recorded(self, config: RunConfig) -> RunConfig:
        """The config as `config.json` records it: what the run really used."""
        return config


def as_toy(target: Target) -> ToyTarget:
    """`target` as one of pd's toys, or a TypeError naming what it is."""
    if not isinstance(target, ToyTarget):
        raise TypeError(f"{type(target).__name__} is not a toy target with a known answer")
    return target


def as_llama(target: Target) -> Llama:
    """`target` as a language model, or a TypeError naming what it is."""
    if not isinstance(target, Llama):
        raise TypeError(f"{type(target).__name__} is not a language model")
    return target


@dataclass(frozen=True)
class ToyKind(TargetKind):
    """pd's toys: trained in-process, a known answer, batches drawn on device (S18)."""

    cfg: ToyConfig

    def build(self, C: int) -> Target:
        return self.cfg.build(C)

    def load_frozen(self, target: Target) -> TrainedTarget:
        return load_or_train(self.cfg, as_toy(target))

    def batches(self, draw: Draw, held_out: bool = False) -> HostBatches:
        """Drawn from `fold_in(fold_in(run_key, step), 0)` (S18); held out or not alike."""
        sample = make_sampler(as_toy(draw.target), draw.size)
        return lambda step: sample(draw.run_key, jnp.asarray(step, jnp.int32))

    def evaluate(
        self,
        recipe: Recipe,
        state: TrainState,
        frozen: hk.Params,
        batches: Batches,
        run_key: Key[Array, ""],
        cfg: EvalConfig,
    ) -> dict[str, float]:
        """On fresh samples drawn inside the evaluation's program (`batches` is not read)."""
        return evaluate_toy(recipe, as_toy(recipe.target), state, frozen, run_key, cfg)

    def known(self, target: Target) -> KnownAnswer:
        return toy_answer(as_toy(target))

    def figure_batch(self, eval_batches: Batches) -> None:
        return None

    def sampler(self, target: Target, batch: int) -> Sampler:
        return ToySampler(as_toy(target), batch)

    def frozen_shapes(self, target: Target) -> PyTree[jax.ShapeDtypeStruct]:
        return trained_shapes(as_toy(target))


@dataclass(frozen=True)
class LanguageModelKind(TargetKind):
    """A Llama-style language model: loaded from a checkpoint or trained on the config's tokens;
    batches are token windows drawn host-side by a Philox generator keyed `(seed, step)`."""

    cfg: LlamaConfig

    @property
    def seq_len(self) -> int:
        return self.cfg.seq_len

    @property
    def labels(self) -> Labels | None:
        cfg = self.cfg
        return (lambda ids: token_labels(cfg, ids)) if cfg.text else None

    @property
    def encoder(self) -> Encoder | None:
        cfg = self.cfg
        return (lambda text: token_ids(cfg, text)) if cfg.text else None

    def build(self, C: int) -> Target:
        return build_llama(self.cfg, C)

    def check_inputs(self) -> None:
        for held_out in (False, True):  # each part must hold a window
            token_source(self.cfg, held_out).batch(0, 0, 1, self.cfg.seq_len)

    def load_frozen(self, target: Target) -> TrainedTarget:
        return load_llama(self.cfg, as_llama(target))

    def batches(self, draw: Draw, held_out: bool = False) -> HostBatches:
        tokens = token_source(self.cfg, held_out and bool(self.cfg.text))
        seed, size, seq_len = draw.seed, draw.size, self.cfg.seq_len
        return lambda step: tokens.batch(seed, step, size, seq_len)

    def checkpoint_shapes(self, target: Target) -> PyTree[jax.ShapeDtypeStruct]:
        shapes = jax.eval_shape(as_llama(target).init, jax.random.key(0))
        in_bf16: PyTree[jax.ShapeDtypeStruct] = jax.tree.map(
            lambda a: shape_dtype(a.shape, FROZEN_DTYPE), shapes
        )
        return in_bf16

    def residual_width(self, target: Target) -> int:
        return as_llama(target).arch.d_model


@dataclass(frozen=True)
class OwnTarget:
    """A target of the caller's own, for `run`: any Target (`pd.targets.haiku_model.haiku_target`
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


@dataclass(frozen=True)
class OwnKind(TargetKind):
    """A caller's own target: nothing to build, load or train."""

    own: OwnTarget
    given_frozen = True

    @property
    def seq_len(self) -> int:
        return self.own.seq_len

    def build(self, C: int) -> Target:
        return self.own.target

    def check_inputs(self) -> None:
        _check_jittable(self.own)

    def load_frozen(self, target: Target) -> TrainedTarget:
        return TrainedTarget.of(self.own.frozen, "given in Python")

    def batches(self, draw: Draw, held_out: bool = False) -> HostBatches:
        own = self.own
        return (own.eval_batches or own.batches) if held_out else own.batches

    def known(self, target: Target) -> KnownAnswer | None:
        return self.own.known

    @cached_property
    def _step_batches(self) -> StepBatches:  # one object: the run's programs are made once
        return StepBatches(self.own.batches)

    def sampler(self, target: Target, batch: int) -> Sampler | None:
        return self._step_batches if self.own.jittable else None

    def frozen_shapes(self, target: Target) -> PyTree[jax.ShapeDtypeStruct] | None:
        frozen = self.own.frozen
        return jax.eval_shape(lambda: frozen) if self.own.jittable else None

    def recorded(self, config: RunConfig) -> RunConfig:
        """The config a caller's target ran with: the target as one given in Python (`pd.load`
        asks for it again) unless a factory names it, its sites' C where they share one (the
        config's is not read), and the size of its batches in place of `train.batch` (nor is
        that)."""
        own = self.own
        target = config.target if isinstance(config.target, FactoryConfig) else FactoryConfig()
        Cs = {site.C for site in own.target.table.sites}
        C = Cs.pop() if len(Cs) == 1 else config.C
        batch = int(np.shape(own.batches(0))[0])
        train = dataclasses.replace(config.train, batch=batch)
        return dataclasses.replace(config, target=target, C=C, train=train)


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
    """The kind of the configured target: a caller's own (`own`, or the one `cfg` names by its
    factory), a language model or one of pd's toys."""
    if own is not None:
        return OwnKind(own)
    if isinstance(cfg, FactoryConfig):
        return OwnKind(resolve_factory(cfg))
    if isinstance(cfg, LlamaConfig):
        return LanguageModelKind(cfg)
    return ToyKind(cfg)


def reseeded(cfg: TargetConfig, seed: int) -> TargetConfig | None:
    """The target of `cfg` made from `seed` (trained from it, or initialized for a loaded
    checkpoint's config), or None where pd does not make the target (a factory's)."""
    if isinstance(cfg, FactoryConfig):
        return None
    return dataclasses.replace(cfg, seed=seed)
