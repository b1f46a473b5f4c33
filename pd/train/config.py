"""Typed run configuration: the dataclasses, which validate themselves when constructed
(`pd.validate`), and the presets, TOML files and `--set` overrides built through them.

Every error is a `ConfigError` whose message is one sentence naming the field, the value and
what was expected; it is raised before anything is compiled or written.
"""

import dataclasses
import difflib
import re
import stat
import tomllib
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Literal

from pd.adversary import Scope
from pd.losses import PlanKind
from pd.precision import ComputeDtype
from pd.targets.configs import (
    FactoryConfig,
    LlamaConfig,
    ResidMLPConfig,
    TargetConfig,
    TMSConfig,
)
from pd.train.schedule import Schedule
from pd.train.sinks import WandbMode
from pd.validate import ConfigError as ConfigError
from pd.validate import FieldError, Validated

CIKind = Literal["mlp", "vector_mlp", "shared_mlp", "chunkwise_transformer"]


@dataclass(frozen=True)
class ReconTerm(Validated):
    """One stochastic-reconstruction term: a plan, its coefficient, and `k` for `chunks(k)`."""

    plan: PlanKind
    coeff: float = 1.0
    k: int = 1

    @property
    def name(self) -> str:
        return f"recon_chunks{self.k}" if self.plan == "chunks" else f"recon_{self.plan}"


@dataclass(frozen=True)
class AdversaryConfig(Validated):
    """The persistent adversarial reconstruction term (SPEC §6); coeff 0 turns it off."""

    NON_NEGATIVE = frozenset({"n_warmup"})

    coeff: float = 0.0
    scope: Scope = "c"
    lr: Schedule = Schedule(0.01, warmup_pct=0.025)
    beta1: float = 0.5
    beta2: float = 0.99
    eps: float = 1e-8
    n_warmup: int = 0


@dataclass(frozen=True)
class LossConfig(Validated):
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

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.p.warmup_pct > 0:
            raise FieldError("p.warmup_pct", self.p.warmup_pct, "0 (p has no warmup, SPEC §5)")
        if self.p.start <= 0:
            why = "p ≤ 0 removes the sparsity pressure"
            raise FieldError("p.start", self.p.start, f"a positive number ({why})")


@dataclass(frozen=True)
class TrainConfig(Validated):
    NON_NEGATIVE = frozenset({"faith_warmup_steps", "checkpoint_every", "eval_every"})

    steps: int = 10_000
    batch: int = 1024
    lr: Schedule = Schedule(1e-3, kind="cosine", final_frac=0.0)
    ci_lr: Schedule = Schedule(1e-3, kind="cosine", final_frac=0.0)
    grad_clip: float = 0.0  # 0 turns the components' global-norm clip off
    faith_warmup_steps: int = 200
    faith_warmup_lr: float = 0.01
    faith_warmup_wd: float = 0.1
    log_every: int = 100
    # The whole train state is saved (orbax) every this many steps, at the end, and when a run
    # is stopped by Ctrl-C or SIGTERM; 0 saves only then. `resume` continues the latest.
    checkpoint_every: int = 1000
    keep_checkpoints: int = 2
    # The evaluation (summary metrics, figures) also every this many steps, into metrics.jsonl
    # as `eval/...` keys; 0: only at the end.
    eval_every: int = 0
    tensorboard: bool = True  # event files in runs/NAME/tensorboard (cheap: ~30 µs a row)
    wandb: WandbMode = "off"  # Weights & Biases: "offline" needs no network or account
    # Loop bodies per iteration in the step (JAX's scan `unroll`, see pd/loops.py): the program
    # holds that many copies of each body, whatever the depth. 2 is faster for small models on a
    # CPU, where two bodies run side by side.
    unroll: int = 1
    # "bf16": the step's matmuls on bfloat16-rounded operands with float32 accumulation;
    # parameters, optimizer state and losses stay float32 (pd/precision.py). Default fp32 (N3).
    compute_dtype: ComputeDtype = "fp32"
    # "bf16": the first Adam moment of the components, the CI function and the sources is kept
    # in bfloat16 (a quarter less optimizer memory); the second moment stays float32, since a
    # bf16 value cannot take its per-step change of 1 − β2 = 0.001 (the moment would stall).
    moment_dtype: ComputeDtype = "fp32"

    def __post_init__(self) -> None:
        super().__post_init__()
        for key, schedule in (("lr", self.lr), ("ci_lr", self.ci_lr)):
            if schedule.start <= 0:
                want = "a positive number (a zero learning rate trains nothing)"
                raise FieldError(f"{key}.start", schedule.start, want)


@dataclass(frozen=True)
class EvalConfig(Validated):
    n_samples: int = 100_000
    batch: int = 10_000
    figures: bool = True


@dataclass(frozen=True)
class CompileConfig(Validated):
    """The persistent compilation cache: off while `cache_dir` is empty."""

    cache_dir: str = ""
    min_compile_secs: float = 1.0


@dataclass(frozen=True)
class ChunkwiseConfig(Validated):
    """The chunkwise-transformer CI function (SPEC §4.1): one chunk per `layers_per_chunk`
    layers, reading the residual stream entering each of its layers."""

    layers_per_chunk: int = 1
    d_model: int = 64
    n_blocks: int = 1
    n_heads: int = 4
    mlp_hidden: int = 128


@dataclass(frozen=True)
class MeshConfig(Validated):
    """The device mesh `(data, model)`; the default is one device."""

    data: int = 1
    model: int = 1


@dataclass(frozen=True)
class DistributedConfig(Validated):
    """Multi-process JAX, from explicit settings only; off while `coordinator` is empty."""

    NON_NEGATIVE = frozenset({"process_id"})

    coordinator: str = ""
    num_processes: int = 1
    process_id: int = 0


@dataclass(frozen=True)
class RunConfig(Validated):
    """A whole run. The defaults are the TMS 5-2 recipe: `RunConfig()` decomposes TMS 5-2 as
    the `tms_5-2` preset does (its file gives the reasons), which adds only its name and the
    CPU-only `train.unroll = 2`."""

    NON_NEGATIVE = frozenset({"seed"})

    name: str = "run"
    seed: int = 0
    target: TargetConfig = field(default_factory=TMSConfig)
    C: int = 20
    ci_fn: CIKind = "vector_mlp"
    ci_hidden: tuple[int, ...] = (16,)
    chunkwise: ChunkwiseConfig = ChunkwiseConfig()
    loss: LossConfig = LossConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    compile: CompileConfig = CompileConfig()
    mesh: MeshConfig = MeshConfig()
    distributed: DistributedConfig = DistributedConfig()

    def __post_init__(self) -> None:
        super().__post_init__()
        check_name(self.name)
        self._check_data_parallel()

    def _check_data_parallel(self) -> None:
        """The batches pd places on the mesh (the target config's `PLACED_BATCHES`) split evenly
        over its data axis."""
        sizes = {"train.batch": self.train.batch, "eval.batch": self.eval.batch}
        ways = self.mesh.data
        for key in self.target.PLACED_BATCHES:
            if (size := sizes[key]) % ways:
                why = "each data-parallel device takes an equal share"
                raise FieldError(key, size, f"a multiple of mesh.data = {ways} ({why})")


_RUN_NAME = re.compile(r"[A-Za-z0-9._-]+( [A-Za-z0-9._-]+)*")


def check_name(name: str) -> None:
    """A run name is one path component (it names a folder under runs/): letters, digits,
    `._-` and single spaces between them (as `--out` takes a folder with spaces), and not `.`
    or `..`."""
    if not _RUN_NAME.fullmatch(name) or name in (".", ".."):
        want = (
            "one folder name of letters, digits, '.', '_', '-' and single spaces inside "
            "(not '.' or '..')"
        )
        raise FieldError("name", name, want)


_TARGET_KINDS: dict[str, type[TargetConfig]] = {
    "tms": TMSConfig,
    "resid_mlp": ResidMLPConfig,
    "llama": LlamaConfig,
    "own": FactoryConfig,
}


def _build(tp: object, value: object, path: str, default: object = None) -> object:
    """A value of type `tp` from parsed TOML at `path`. A table overlays `default`, the value
    the key has without it (so `--set train.lr.start=0.01` keeps the default schedule's kind);
    the constructors check every value."""
    if typing.get_origin(tp) is types.UnionType:  # the target kinds, told apart by `kind`
        implied = "own" if isinstance(value, dict) and "factory" in value else "tms"
        kind = value.get("kind", implied) if isinstance(value, dict) else None
        if kind not in _TARGET_KINDS:
            want = "one of " + ", ".join(map(repr, _TARGET_KINDS))
            raise ConfigError(f"config key '{path}.kind' is {kind!r}, expected {want}")
        cls = _TARGET_KINDS[kind]
        same_kind = getattr(default, "kind", None) == kind  # a default of another kind is dropped
        return _build(cls, value, path, default if same_kind else None)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{path}' is {value!r}, expected a table")
        fields = {f.name: f for f in dataclasses.fields(tp) if f.init}
        kwargs = {k: getattr(default, k) for k in fields} if default is not None else {}
        for key, item in value.items():
            sub = f"{path}.{key}" if path else key
            if key not in fields:
                close = difflib.get_close_matches(key, fields, n=1)
                hint = f"did you mean '{close[0]}'" if close else f"known keys: {', '.join(fields)}"
                raise ConfigError(f"unknown config key '{sub}'; {hint}")
            kwargs[key] = _build(
                fields[key].type, item, sub, kwargs.get(key, _default_of(fields[key]))
            )
        missing = [k for k, f in fields.items() if k not in kwargs and _default_of(f) is None]
        if missing:
            prefix = f"{path}." if path else ""
            raise ConfigError(f"config key '{prefix}{missing[0]}' is missing, expected a value")
        try:
            return tp(**kwargs)
        except FieldError as err:
            raise err.under(path) from None
    if typing.get_origin(tp) is tuple:
        if not isinstance(value, list):
            raise ConfigError(f"config key '{path}' is {value!r}, expected a list")
        (item_tp, _) = typing.get_args(tp)
        return tuple(_build(item_tp, item, f"{path}[{i}]") for i, item in enumerate(value))
    return value


def _default_of(f: dataclasses.Field[object]) -> object:
    """The default of a field, or None when it has none."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def from_dict(data: dict[str, object]) -> RunConfig:
    """A validated RunConfig from a nested dict (as parsed from TOML)."""
    return typing.cast(RunConfig, _build(RunConfig, data, ""))  # a dataclass builds as itself


def preset_names() -> list[str]:
    files = resources.files("pd.presets").iterdir()
    return sorted(f.name.removesuffix(".toml") for f in files if f.name.endswith(".toml"))


def _read_toml(text: str, where: str) -> dict[str, object]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"config file '{where}' is not valid TOML ({err})") from None


MAX_CONFIG_BYTES = 1 << 20


def _config_text(path: Path) -> str:
    """The text of config file `path`: a regular file (told by `stat`, so that a FIFO is not
    opened and waited on, nor a device such as /dev/zero read without end) of UTF-8 text, of
    at most MAX_CONFIG_BYTES (read no further, whatever size the file reports)."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise ConfigError(f"config file '{path}' is not a regular file, expected a .toml file")
        with path.open("rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise ConfigError(f"config file '{path}' cannot be read ({err.strerror})") from None
    if len(data) > MAX_CONFIG_BYTES:
        mib = MAX_CONFIG_BYTES >> 20
        raise ConfigError(
            f"config file '{path}' is larger than {mib} MiB, expected a .toml file of at most "
            f"{mib} MiB"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"config file '{path}' is not UTF-8 text (byte {data[err.start]:#04x} at offset "
            f"{err.start}), expected a TOML file"
        ) from None


def load_raw(preset_or_file: str) -> dict[str, object]:
    """The parsed TOML of a built-in preset or a config file."""
    if preset_or_file in preset_names():
        text = resources.files("pd.presets").joinpath(f"{preset_or_file}.toml").read_text()
        return _read_toml(text, preset_or_file)
    path = Path(preset_or_file)
    if path.suffix == ".toml" or path.exists():
        return _read_toml(_config_text(path), str(path))
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
