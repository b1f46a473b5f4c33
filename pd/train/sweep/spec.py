"""The members of a sweep: seeds, grids over config keys, one config per member."""

import copy
import dataclasses
import itertools
import json
import re
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pd.train.config import ConfigError, RunConfig, apply_override, from_dict, load_raw
from pd.train.kinds import reseeded


@dataclass(frozen=True)
class Member:
    """One decomposition of a sweep: its folder inside the sweep folder and its own config."""

    name: str  # "seed-3", or "loss.importance=0.001/seed-3" in a grid
    config: RunConfig


@dataclass(frozen=True)
class SweepSpec:
    """The members of a sweep, and its name (the default folder is `runs/NAME-sweep`)."""

    name: str
    members: tuple[Member, ...]


def parse_seeds(spec: str) -> tuple[int, ...]:
    """`0-15`, `0,3,7` or `0-3,8`: the seeds in that order, each once."""
    want = "non-negative integers and ranges like 0-15 or 0,3,7, each seed once"
    seeds: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part, re.ASCII)
        if m is None or (m[2] is not None and int(m[2]) < int(m[1])):
            raise ConfigError(f"--seeds '{spec}' has '{part.strip()}', expected {want}")
        seeds.extend(range(int(m[1]), int(m[2] or m[1]) + 1))
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ConfigError(f"--seeds '{spec}' names seed {repeated[0]} twice, expected {want}")
    return tuple(seeds)


def parse_grid(assignment: str) -> tuple[str, list[object]]:
    """`KEY=[V1, V2, ...]` (a TOML array): the key and its values."""
    key, sep, raw = assignment.partition("=")
    try:
        values: object = tomllib.loads(f"v = {raw}")["v"] if sep else None
    except tomllib.TOMLDecodeError:
        values = None
    if not key.strip() or not isinstance(values, list) or not values:
        raise ConfigError(
            f"--grid '{assignment}' is malformed, expected KEY=[VALUE, ...] (a TOML array, "
            "e.g. loss.importance=[1e-3,3e-3])"
        )
    return key.strip(), values


def seed_sweep(
    config: RunConfig, seeds: Iterable[int], vary_target_seed: bool = False, label: str = ""
) -> SweepSpec:
    """`config` once per seed; with `vary_target_seed` each member's target has that seed too.
    Members are named `seed-S`, under `label/` when given (one point of a grid)."""
    target = config.target
    if vary_target_seed and reseeded(target, 0) is None:
        raise ConfigError(
            "--vary-target-seed needs a target pd trains or loads itself (tms, resid_mlp, "
            "llama), not one made by a factory"
        )
    members = []
    for seed in seeds:
        member_target = (reseeded(target, seed) if vary_target_seed else None) or target
        name = f"seed-{seed}" if not label else f"{label}/seed-{seed}"
        run_name = f"{config.name}-{name.replace('/', '-').replace('=', '-')}"
        run_name = re.sub(r"[^A-Za-z0-9._-]", "_", run_name)
        member_config = dataclasses.replace(config, name=run_name, seed=seed, target=member_target)
        members.append(Member(name, member_config))
    return SweepSpec(config.name, tuple(members))


def load_sweep(
    preset_or_file: str,
    seeds: Sequence[int],
    overrides: Sequence[str] = (),
    grid: Sequence[str] = (),
    vary_target_seed: bool = False,
) -> SweepSpec:
    """The members of `preset_or_file` with `overrides`, per seed and per point of the `grid`
    (`KEY=[V1, ...]` each; several make their product)."""
    data = load_raw(preset_or_file)
    data.setdefault("name", Path(preset_or_file).stem)
    for assignment in overrides:
        apply_override(data, assignment)
    axes = [parse_grid(g) for g in grid]
    name, members = "", list[Member]()
    for point in itertools.product(*(values for _, values in axes)):
        config_data = copy.deepcopy(data)
        labels = []
        for (key, _), value in zip(axes, point, strict=True):
            _set(config_data, key, value)
            text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
            labels.append(f"{key}={text}".replace("/", "_"))
        config = from_dict(config_data)
        spec = seed_sweep(config, seeds, vary_target_seed, "/".join(labels))
        name, members = spec.name, [*members, *spec.members]
    return SweepSpec(name, tuple(members))


def _set(data: dict[str, object], key: str, value: object) -> None:
    """`data[k1][k2]... = value` for the dotted `key`, as `--set` would set it."""
    *tables, last = key.split(".")
    node = data
    for i, part in enumerate(tables):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--grid '{key}': '{'.'.join(tables[: i + 1])}' is not a table")
        node = child
    node[last] = value
