"""Config files: the built-in presets and TOML files read as tables, `--set` overrides applied
to those tables, and the config dataclasses built from them (`build`). `pd.train.config` builds
a `RunConfig` with it (`from_dict`, `load_config`) and re-exports its public names.

Every error is a `ConfigError` whose message is one sentence naming the key or the file.
"""

import dataclasses
import difflib
import stat
import tomllib
import types
import typing
from importlib import resources
from pathlib import Path

from pd.targets.configs import FactoryConfig, LlamaConfig, ResidMLPConfig, TargetConfig, TMSConfig
from pd.validate import ConfigError, FieldError

_TARGET_KINDS: dict[str, type[TargetConfig]] = {
    "tms": TMSConfig,
    "resid_mlp": ResidMLPConfig,
    "llama": LlamaConfig,
    "own": FactoryConfig,
}


def build(tp: object, value: object, path: str, default: object = None) -> object:
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
        return build(cls, value, path, default if same_kind else None)
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
            kwargs[key] = build(
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
        return tuple(build(item_tp, item, f"{path}[{i}]") for i, item in enumerate(value))
    return value


def _default_of(f: dataclasses.Field[object]) -> object:
    """The default of a field, or None when it has none."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


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
