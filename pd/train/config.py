"""Typed run configuration: presets, TOML files, `--set` overrides, and validation.

Every error is a `ConfigError` whose message is one sentence naming the field, the value and
what was expected; it is raised before anything is compiled or written.
"""

import dataclasses
import difflib
import math
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Literal

from pd.adversary import Scope
from pd.losses import PlanKind
from pd.targets.configs import (
    FactoryConfig,
    LlamaConfig,
    ResidMLPConfig,
    TargetConfig,
    TMSConfig,
)
from pd.train.schedule import Schedule


class ConfigError(ValueError):
    """A bad configuration, described in one sentence."""


CIKind = Literal["mlp", "vector_mlp", "shared_mlp", "chunkwise_transformer"]


@dataclass(frozen=True)
class ReconTerm:
    """One stochastic-reconstruction term: a plan, its coefficient, and `k` for `chunks(k)`."""

    plan: PlanKind
    coeff: float = 1.0
    k: int = 1

    @property
    def name(self) -> str:
        return f"recon_chunks{self.k}" if self.plan == "chunks" else f"recon_{self.plan}"


@dataclass(frozen=True)
class AdversaryConfig:
    """The persistent adversarial reconstruction term (SPEC §6); coeff 0 turns it off."""

    coeff: float = 0.0
    scope: Scope = "c"
    lr: Schedule = Schedule(0.01, warmup_pct=0.025)
    beta1: float = 0.5
    beta2: float = 0.99
    eps: float = 1e-8
    n_warmup: int = 0


@dataclass(frozen=True)
class LossConfig:
    faithfulness: float = 1.0
    importance: float = 3e-3
    p: Schedule = Schedule(1.0)
    eps: float = 1e-12
    frequency: float = 0.0  # 0 omits the frequency term
    reference_token_count: float = 1.0
    recon: tuple[ReconTerm, ...] = (ReconTerm("all"), ReconTerm("per_site"))
    n_mask_samples: int = 1
    adversary: AdversaryConfig = AdversaryConfig()
    ci_masked: float = 0.0  # trains the CI-masked monitor (SPEC §5) with this coefficient


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 10_000
    batch: int = 4096
    lr: Schedule = Schedule(1e-3, kind="cosine", final_frac=0.0)
    ci_lr: Schedule = Schedule(1e-3, kind="cosine", final_frac=0.0)
    grad_clip: float = 0.0  # 0 turns the components' global-norm clip off
    faith_warmup_steps: int = 200
    faith_warmup_lr: float = 0.01
    faith_warmup_wd: float = 0.1
    log_every: int = 100
    # Loop bodies per iteration in the step (JAX's scan `unroll`, see pd/loops.py): the program
    # holds that many copies of each body, whatever the depth. 2 is faster for small models on a
    # CPU, where two bodies run side by side.
    unroll: int = 1


@dataclass(frozen=True)
class EvalConfig:
    n_samples: int = 100_000
    batch: int = 10_000
    figures: bool = True


@dataclass(frozen=True)
class CompileConfig:
    """The persistent compilation cache: off while `cache_dir` is empty."""

    cache_dir: str = ""
    min_compile_secs: float = 1.0


@dataclass(frozen=True)
class ChunkwiseConfig:
    """The chunkwise-transformer CI function (SPEC §4.1): one chunk per `layers_per_chunk`
    layers, reading the residual stream entering each of its layers."""

    layers_per_chunk: int = 1
    d_model: int = 64
    n_blocks: int = 1
    n_heads: int = 4
    mlp_hidden: int = 128


@dataclass(frozen=True)
class MeshConfig:
    """The device mesh `(data, model)`; the default is one device."""

    data: int = 1
    model: int = 1


@dataclass(frozen=True)
class DistributedConfig:
    """Multi-process JAX, from explicit settings only; off while `coordinator` is empty."""

    coordinator: str = ""
    num_processes: int = 1
    process_id: int = 0


@dataclass(frozen=True)
class RunConfig:
    name: str
    seed: int = 0
    target: TargetConfig = field(default_factory=TMSConfig)
    C: int = 20
    ci_fn: CIKind = "mlp"
    ci_hidden: tuple[int, ...] = (16,)
    chunkwise: ChunkwiseConfig = ChunkwiseConfig()
    loss: LossConfig = LossConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    compile: CompileConfig = CompileConfig()
    mesh: MeshConfig = MeshConfig()
    distributed: DistributedConfig = DistributedConfig()


# Integers that may be zero; every other integer must be positive.
_NON_NEGATIVE_INTS = {"seed", "n_identity", "faith_warmup_steps", "n_warmup", "process_id"}
# Floats that must lie in [0, 1].
_FRACTIONS = {"feature_prob", "warmup_pct", "final_frac", "held_out"}

_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _describe(tp: object) -> str:
    if tp in _TYPE_WORDS:
        return _TYPE_WORDS[tp]
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is tuple:
        return "a list"
    return "a table"


def _check_scalar(path: str, value: object, tp: object) -> object:
    name = path.rsplit(".", 1)[-1]
    if typing.get_origin(tp) is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"config key '{path}' is {value!r}, expected {_describe(tp)}")
        return value
    ok = (
        (tp is bool and isinstance(value, bool))
        or (tp is int and isinstance(value, int) and not isinstance(value, bool))
        or (tp is float and isinstance(value, int | float) and not isinstance(value, bool))
        or (tp is str and isinstance(value, str))
    )
    if not ok:
        raise ConfigError(
            f"config key '{path}' is {value!r} ({type(value).__name__}), expected {_describe(tp)}"
        )
    # A kind's C of 0 takes the run's C.
    may_be_zero = name in _NON_NEGATIVE_INTS or path.startswith("target.kind_C.")
    if tp is int and not (value >= 0 if may_be_zero else value > 0):  # type: ignore[operator]  # value is an int here
        word = "a non-negative" if may_be_zero else "a positive"
        raise ConfigError(f"config key '{path}' is {value!r}, expected {word} integer")
    if tp is float:
        value = float(value)  # type: ignore[arg-type]  # checked to be int | float above
        hi = 1.0 if name in _FRACTIONS else float("inf")
        if not (math.isfinite(value) and 0.0 <= value <= hi):
            want = "a number in [0, 1]" if name in _FRACTIONS else "a finite non-negative number"
            raise ConfigError(f"config key '{path}' is {value!r}, expected {want}")
    return value


def _build(tp: object, value: object, path: str) -> object:
    """Build a value of type `tp` from parsed TOML, or raise a one-sentence ConfigError."""
    if tp is TargetConfig or (typing.get_origin(tp) in (types.UnionType, typing.Union)):
        kinds: dict[str, type] = {
            "tms": TMSConfig,
            "resid_mlp": ResidMLPConfig,
            "llama": LlamaConfig,
            "own": FactoryConfig,
        }
        default = "own" if isinstance(value, dict) and "factory" in value else "tms"
        kind = value.get("kind", default) if isinstance(value, dict) else None
        if kind not in kinds:
            raise ConfigError(
                f"config key '{path}.kind' is {kind!r}, "
                f"expected one of {', '.join(map(repr, kinds))}"
            )
        return _build(kinds[kind], value, path)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{path}' is {value!r}, expected a table")
        hints = typing.get_type_hints(tp)
        names = [f.name for f in dataclasses.fields(tp) if f.init]
        kwargs = {}
        for key, item in value.items():
            sub = f"{path}.{key}" if path else key
            if key not in names:
                close = difflib.get_close_matches(key, names, n=1)
                hint = (
                    f"; did you mean '{close[0]}'" if close else f"; known keys: {', '.join(names)}"
                )
                raise ConfigError(f"unknown config key '{sub}'{hint}")
            kwargs[key] = _build(hints[key], item, sub)
        missing = [
            f.name
            for f in dataclasses.fields(tp)
            if f.init
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
            and f.name not in kwargs
        ]
        if missing:
            prefix = f"{path}." if path else ""
            raise ConfigError(f"config key '{prefix}{missing[0]}' is missing, expected a value")
        return tp(**kwargs)
    if typing.get_origin(tp) is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"config key '{path}' is {value!r}, expected a list")
        (item_tp, _) = typing.get_args(tp)
        return tuple(_build(item_tp, v, f"{path}[{i}]") for i, v in enumerate(value))
    return _check_scalar(path, value, tp)


_RUN_NAME = re.compile(r"[A-Za-z0-9._-]+")


def check_name(name: str) -> None:
    """A run name is one path component (it names a folder under runs/): letters, digits and
    `._-`, and not `.` or `..`."""
    if not _RUN_NAME.fullmatch(name) or name in (".", ".."):
        raise ConfigError(
            f"config key 'name' is {name!r}, expected one folder name of letters, digits, "
            "'.', '_' and '-' (not '.' or '..')"
        )


def from_dict(data: dict[str, object]) -> RunConfig:
    """A validated RunConfig from a nested dict (as parsed from TOML)."""
    config = _build(RunConfig, data, "")
    assert isinstance(config, RunConfig)
    check_name(config.name)
    if config.loss.p.warmup_pct > 0:
        raise ConfigError(
            f"config key 'loss.p.warmup_pct' is {config.loss.p.warmup_pct!r}, expected 0 "
            "(p has no warmup, SPEC §5)"
        )
    # Values the checks above allow but that make the method meaningless.
    for key, value, why in (
        ("loss.p.start", config.loss.p.start, "p ≤ 0 removes the sparsity pressure"),
        ("train.lr.start", config.train.lr.start, "a zero learning rate trains nothing"),
        ("train.ci_lr.start", config.train.ci_lr.start, "a zero learning rate trains nothing"),
    ):
        if value <= 0:
            raise ConfigError(
                f"config key '{key}' is {value!r}, expected a positive number ({why})"
            )
    return config


def preset_names() -> list[str]:
    files = resources.files("pd.presets").iterdir()
    return sorted(f.name.removesuffix(".toml") for f in files if f.name.endswith(".toml"))


def _read_toml(text: str, where: str) -> dict[str, object]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"config file '{where}' is not valid TOML ({err})") from None


def load_raw(preset_or_file: str) -> dict[str, object]:
    """The parsed TOML of a built-in preset or a config file."""
    if preset_or_file in preset_names():
        text = resources.files("pd.presets").joinpath(f"{preset_or_file}.toml").read_text()
        return _read_toml(text, preset_or_file)
    path = Path(preset_or_file)
    if path.suffix == ".toml" or path.exists():
        try:
            return _read_toml(path.read_text(), str(path))
        except OSError as err:
            raise ConfigError(f"config file '{path}' cannot be read ({err.strerror})") from None
    raise ConfigError(
        f"'{preset_or_file}' is neither a preset nor a config file, expected one of "
        f"{', '.join(preset_names())} or a path to a .toml file"
    )


def apply_override(data: dict[str, object], assignment: str) -> None:
    """Apply one `key.sub=value` override in place (the value is parsed as TOML, else a string)."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override '{assignment}' is malformed, expected key=value")
    try:
        value: object = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    parts = key.strip().split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(
                f"override '{assignment}': '{'.'.join(parts[: i + 1])}' is not a table"
            )
        node = child
    node[parts[-1]] = value


def load_config(preset_or_file: str, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """The validated config of a preset or file with `key=value` overrides applied."""
    data = load_raw(preset_or_file)
    data.setdefault("name", Path(preset_or_file).stem)
    for assignment in overrides:
        apply_override(data, assignment)
    return from_dict(data)
