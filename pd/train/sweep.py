"""Sweeps: N decompositions of one recipe, trained together as one vmapped, jitted program,
with one run folder per member and a summary table (`sweep.json`).

    python -m pd.train sweep PRESET_OR_FILE --seeds 0-15 [--grid KEY=[V1,V2,...]]
        [--vary-target-seed] [--members-per-program K] [--set key=value ...] [--out DIR]

A member differs from the others of its group only in what is traced: the key tree of its
`seed` (init, sources, batches, S18) and, with `vary_target_seed`, its target (`target.seed` =
the member's seed; the frozen parameters are a traced argument, S18, stacked along the member
axis). By default every member decomposes the same target. Everything static — the target's
shape, the CI function, the loss terms and coefficients, the schedules, batch and steps — is
the group's recipe. A `--grid` over config keys (loss coefficients, C, ...) makes one group per
value, and each group is its own compiled program; the groups run one after another.

Member i follows the run of its own config alone (`pd.train.run`): the same keys, batches and
step function, vmapped; the batched program may reassociate float sums, so the two agree to
about 1e-5 after a few steps rather than bit for bit (tests/test_sweep.py).

A group's members are vmapped `members_per_program` at a time, each such program sharded over
the devices along the member axis (`shard_map`: no member talks to another). On accelerators
the default is the whole group at once. On CPU devices it is one member per device: the step
of a toy is compute- and memory-bound there, so a wider vmap does not make a member's step
cheaper (tms_5-2 on 2 cores, ms per member-step, medians of 3: alone 3.97; 2 vmapped on one
device 3.85; one on each of 2 devices 3.48; 2 on each 3.86; 4 on one device 7.9, its arrays
outgrow the caches). What a CPU sweep saves is one compile, one target and one process for all
members, plus the core a single small run leaves idle (the CLI starts one CPU device per core).

Sweeps write no checkpoints and cannot be resumed; a member whose numbers turn non-finite is
reported in the table and gets no run folder, as a single run would; the others go on.
"""

import argparse
import copy
import dataclasses
import itertools
import json
import logging
import math
import os
import re
import shutil
import signal
import statistics
import sys
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar, cast

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Key

from pd.compile_times import CompileTimes, recording
from pd.data import DataError
from pd.init import key_tree
from pd.log import setup_logging, show_pd_logs
from pd.state import TrainState
from pd.targets.base import Batch, as_toy
from pd.targets.configs import FactoryConfig, TargetConfig
from pd.targets.hf import CheckpointError
from pd.targets.train import TrainedTarget
from pd.train.config import ConfigError, RunConfig, apply_override, from_dict, load_raw
from pd.train.evaluate import EVAL_FOLD
from pd.train.init_state import initial_state
from pd.train.kinds import TargetKind, kind_of
from pd.train.recipe import make_batches, make_recipe
from pd.train.run import write_results
from pd.train.rundir import check_destination, mark_finished, staged
from pd.train.signals import Terminated, raise_terminated
from pd.train.sinks import MetricSinks
from pd.train.step import (
    Metrics,
    Recipe,
    batch_key,
    evaluate_batch,
    faith_warmup,
    flat_metrics,
    make_sampler,
    step_fn,
    steps_fn,
)
from pd.xla import compiler_options

log = logging.getLogger(__name__)

_spec: Callable[..., P] = P  # its constructor is unannotated upstream
MEMBERS = _spec("members")  # the leading axis of every per-member array
SHARED = _spec()
# The TMS verdict of tests/test_convergence.py, generalised: every site's CI error is 0.
VERDICT_KEYS = ("identity_ci_error_0.1/", "dense_ci_error_0.1/")


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
    if vary_target_seed and isinstance(target, FactoryConfig):
        raise ConfigError(
            "--vary-target-seed needs a target pd trains or loads itself (tms, resid_mlp, "
            "llama), not one made by a factory"
        )
    members = []
    for seed in seeds:
        member_target = target
        if vary_target_seed and not isinstance(target, FactoryConfig):
            member_target = dataclasses.replace(target, seed=seed)
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


@dataclass(frozen=True)
class MemberResult:
    """What one member leaves behind: its folder (None when it diverged), summary and state."""

    member: Member
    run_dir: Path | None
    summary: dict[str, float]
    state: TrainState
    frozen: hk.Params
    diverged: str = ""  # the sentence a single run would have stopped with

    @property
    def recovered(self) -> bool | None:
        """Every site's identity (or dense) CI error at tol 0.1 is 0; None without a known
        answer."""
        errors = [v for k, v in self.summary.items() if k.startswith(VERDICT_KEYS)]
        if self.diverged:
            return False
        return all(e == 0.0 for e in errors) if errors else None


@dataclass(frozen=True)
class SweepResult:
    """A finished sweep: its folder, every member's result, the compile times and wall time."""

    sweep_dir: Path
    members: tuple[MemberResult, ...]
    compile_times: CompileTimes
    wall_s: float

    @property
    def n_recovered(self) -> int:
        return sum(m.recovered is True for m in self.members)

    def table(self) -> str:
        """One row per member: recovered, CI errors, MMCS, CI-L0; then the count recovered."""
        families = ("identity_ci_error_0.1/", "dense_ci_error_0.1/", "mmcs/", "ci_l0/")
        keys = sorted(
            {k for m in self.members for k in m.summary if k.startswith(families)},
            key=lambda k: (next(i for i, f in enumerate(families) if k.startswith(f)), k),
        )
        short = [
            k.replace("identity_ci_error_0.1", "id_err").replace("dense_ci_error_0.1", "dense_err")
            for k in keys
        ]
        width = max(len(m.member.name) for m in self.members)
        head = f"{'member':<{width}}  {'recovered':<9}  " + "  ".join(
            f"{s:>{max(len(s), 7)}}" for s in short
        )
        lines = [head]
        verdicts = {True: "yes", False: "no", None: "-"}
        for m in self.members:
            cells = [
                f"{m.summary[k]:>{max(len(s), 7)}.4g}"
                if k in m.summary
                else f"{'-':>{max(len(s), 7)}}"
                for k, s in zip(keys, short, strict=True)
            ]
            text = "  ".join(cells) if not m.diverged else m.diverged
            lines.append(f"{m.member.name:<{width}}  {verdicts[m.recovered]:<9}  {text}")
        judged = [m for m in self.members if m.recovered is not None]
        if judged:
            lines.append(
                f"recovered: {self.n_recovered} of {len(self.members)} members (CI error 0 on "
                "every site at tol 0.1)"
            )
        lines.append(f"wall time {self.wall_s:.1f} s for {len(self.members)} members")
        return "\n".join(lines)


@dataclass(frozen=True)
class _Group:
    """Members that share one recipe, so one compiled program; their target kinds."""

    recipe: Recipe
    members: tuple[Member, ...]
    kinds: tuple[TargetKind, ...]

    @property
    def toy(self) -> bool:
        """Toy batches are drawn on device, inside the program (S18); others come from the host."""
        return self.kinds[0].sampled


def _static(config: RunConfig) -> RunConfig:
    """What the members of one group share: the config without its name and seeds."""
    target = config.target
    if not isinstance(target, FactoryConfig):
        target = dataclasses.replace(target, seed=0)
    return dataclasses.replace(config, name="run", seed=0, target=target)


def _groups(spec: SweepSpec) -> list[_Group]:
    """The members grouped by their static config, each group checked before anything runs."""
    names = [m.name for m in spec.members]
    if not names:
        raise ConfigError("a sweep needs at least one member, expected one seed or more")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"sweep member '{repeated[0]}' is named twice, expected unique names")
    by_static: dict[RunConfig, list[Member]] = {}
    for member in spec.members:
        by_static.setdefault(_static(member.config), []).append(member)
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
        groups.append(
            _Group(recipe, tuple(members), tuple(kinds[m.config.target] for m in members))
        )
    return groups


F = TypeVar("F", bound=Callable[..., object])


def _per_member(
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
class _Programs:
    """A group's jitted functions over stacked members, named as a single run's are (the
    monitors of logged steps: `monitor_step`, where a run calls its `eval_step`)."""

    init: Callable[[Key[Array, " n"], Key[Array, " n"]], TrainState]
    warmup: Callable[[TrainState, hk.Params], TrainState]
    step: StackedStep
    steps: StackedSteps | None  # toys
    monitors: Callable[[TrainState, hk.Params, Batch, Key[Array, " n"], jax.Array], Metrics]
    sample: Callable[[Key[Array, " n"], jax.Array], Batch] | None  # toys


def _programs(group: _Group, mesh: Mesh, stacked_frozen: bool) -> _Programs:
    recipe = group.recipe
    frozen = MEMBERS if stacked_frozen else SHARED
    options = compiler_options(recipe.ci_fn)

    def init_train_state(init_key: Key[Array, ""], src_key: Key[Array, ""]) -> TrainState:
        return initial_state(recipe, init_key, src_key)

    def faithfulness_warmup(state: TrainState, frozen: hk.Params) -> TrainState:
        return state._replace(components=faith_warmup(recipe, state.components, frozen))

    def monitor_step(
        state: TrainState, frozen: hk.Params, x: Batch, run_key: Key[Array, ""], step: jax.Array
    ) -> Metrics:
        # The monitors of a logged step, on its batch, as `pd.train.run` computes them.
        metrics, _ = evaluate_batch(recipe, state, frozen, x, batch_key(run_key, step))
        return {k: v for k, v in metrics.items() if k.startswith("monitor/")}

    sample = steps = None
    if group.toy:
        toy_sample = make_sampler(as_toy(recipe.target), recipe.train.batch)
        sample = _per_member(toy_sample, mesh, options, (MEMBERS, SHARED))
        steps_of_one = steps_fn(recipe, recipe.train.batch)
        steps = _per_member(steps_of_one, mesh, options, (MEMBERS, frozen, MEMBERS, SHARED), True)
    return _Programs(
        init=_per_member(init_train_state, mesh, options, (MEMBERS, MEMBERS)),
        warmup=_per_member(faithfulness_warmup, mesh, options, (MEMBERS, frozen), donate=True),
        step=_per_member(step_fn(recipe), mesh, options, (MEMBERS, frozen, MEMBERS, MEMBERS), True),
        steps=steps,
        monitors=_per_member(
            monitor_step, mesh, options, (MEMBERS, frozen, MEMBERS, MEMBERS, SHARED)
        ),
        sample=sample,
    )


@contextmanager
def _rows_unlogged() -> Iterator[None]:
    """Without a bar, every member's sinks would log one line per row: the sweep logs one line
    per logged step for all of them instead."""

    class Unlogged(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return record.levelno > logging.INFO

    sinks_log, quiet = logging.getLogger("pd.train.sinks"), Unlogged()
    sinks_log.addFilter(quiet)
    try:
        yield
    finally:
        sinks_log.removeFilter(quiet)


def _member_state(host: TrainState, i: int) -> TrainState:
    """Member `i` of host-side stacked states, as device arrays of its own."""
    state: TrainState = jax.tree.map(lambda a: jnp.asarray(a[i]), host)
    return state


class _Chunk:
    """Members trained by one call of a group's programs: `size` real ones, then copies of the
    last (padding to a multiple of the devices), whose results are dropped."""

    def __init__(
        self,
        group: _Group,
        programs: _Programs,
        mesh: Mesh,
        members: list[int],
        size: int,
        trained: dict[TargetConfig, TrainedTarget],
        stacked_frozen: bool,
    ) -> None:
        self.group, self.programs, self.size = group, programs, size
        self.members = [group.members[i] for i in members]
        self.kinds = [group.kinds[i] for i in members]
        self.trained = [trained[m.config.target] for m in self.members]
        on_members, shared = NamedSharding(mesh, MEMBERS), NamedSharding(mesh, SHARED)
        keys = [key_tree(m.config.seed) for m in self.members]
        init, src, run = (jnp.stack([k[j] for k in keys]) for j in range(3))
        self.init_keys, self.src_keys, self.run_keys = jax.device_put((init, src, run), on_members)
        self.host_run_keys = run
        if stacked_frozen:
            stacked = jax.tree.map(lambda *a: jnp.stack(a), *(t.params for t in self.trained))
            self.frozen: hk.Params = jax.device_put(stacked, on_members)
        else:
            self.frozen = jax.device_put(self.trained[0].params, shared)
        self.on_members = on_members

    def batches(self) -> Callable[[int], Batch]:
        """The members' batches of a step, stacked (S18: each a pure function of its seed)."""
        sample = self.programs.sample
        if sample is not None:
            return lambda step: sample(self.run_keys, jnp.asarray(step, jnp.int32))
        recipe = self.group.recipe
        per_member = [
            make_batches(m.config, recipe, k, None, kind=kind)
            for m, k, kind in zip(self.members, self.host_run_keys, self.kinds, strict=True)
        ]
        return lambda step: jax.device_put(
            jnp.stack([b(step) for b in per_member]), self.on_members
        )

    def evaluation(self, i: int, state: TrainState, folder: Path) -> dict[str, float]:
        """Member `i`'s summary (and figures), exactly as `pd.train.run` evaluates a run."""
        config, kind, recipe = self.members[i].config, self.kinds[i], self.group.recipe
        frozen, run_key = self.trained[i].params, self.host_run_keys[i]
        eval_batches = make_batches(config, recipe, run_key, None, True, kind)
        summary = kind.evaluate(recipe, state, frozen, eval_batches, run_key, config.eval)
        if config.eval.figures:
            from pd.train.figures import write_figures  # matplotlib when drawing

            x, known = eval_batches(EVAL_FOLD), kind.known(recipe.target)
            write_figures(recipe, state, frozen, x, folder, kind.labels, known)
        return summary

    def train(self, folders: list[Path]) -> tuple[TrainState, list[str]]:
        """Every member's final state (host-side, stacked) and why each diverged ("" if not);
        rows into each member's sinks."""
        programs, recipe, cfg = self.programs, self.group.recipe, self.group.recipe.train
        states = programs.init(self.init_keys, self.src_keys)
        if cfg.faith_warmup_steps > 0:
            states = programs.warmup(states, self.frozen)
        batches, diverged = self.batches(), [""] * self.size
        last = (0, time.perf_counter())
        with ExitStack() as stack, _rows_unlogged():
            sinks = []
            for member, folder in zip(self.members[: self.size], folders, strict=True):
                c = member.config
                (folder / "config.json").write_text(
                    json.dumps(dataclasses.asdict(c), indent=2, allow_nan=False)
                )
                sinks.append(
                    stack.enter_context(
                        MetricSinks(
                            folder,
                            cfg.steps,
                            log_every=cfg.log_every,
                            eval_every=cfg.eval_every,
                            tensorboard=cfg.tensorboard,
                            wandb=cfg.wandb,
                            run_name=c.name,
                            config=dataclasses.asdict(c),
                            interactive=False,
                        )
                    )
                )
            first = 0
            while first < cfg.steps:
                step = first  # the last step of this call
                if programs.steps is None:
                    x = batches(step)
                    states, metrics = programs.step(states, self.frozen, x, self.run_keys)
                else:  # toys: up to the next logged step in one call, as a run takes them
                    step = sinks[0].next_logged(first)
                    n = jnp.asarray(step - first + 1, jnp.int32)
                    states, metrics = programs.steps(states, self.frozen, self.run_keys, n)
                first = step + 1
                evaluate = sinks[0].should_eval(step) and step < cfg.steps - 1
                if not (sinks[0].should_log(step) or evaluate):
                    continue
                x = batches(step)
                step_arr = jnp.asarray(step, jnp.int32)
                monitors = programs.monitors(states, self.frozen, x, self.run_keys, step_arr)
                host = jax.device_get({**metrics, **monitors})
                host_states = jax.device_get(states) if evaluate else None
                totals = []
                for i, sink in enumerate(sinks):
                    if diverged[i]:
                        continue
                    row = flat_metrics(recipe.table, {k: v[i] for k, v in host.items()})
                    bad = [k for k, v in row.items() if not math.isfinite(v)]
                    if bad:
                        others = f" (and {len(bad) - 1} more terms)" if len(bad) > 1 else ""
                        diverged[i] = (
                            f"training diverged at step {step}: {bad[0]} is {row[bad[0]]}{others}"
                        )
                        continue
                    if host_states is not None:
                        state = _member_state(host_states, i)
                        evaluated = self.evaluation(i, state, folders[i])
                        row |= {f"eval/{k}": v for k, v in evaluated.items()}
                    sink.log(step, row)
                    totals.append(row["loss/total"])
                done, before = last
                last = (step + 1, time.perf_counter())
                speed = (step + 1 - done) / max(last[1] - before, 1e-9)
                loss = (
                    f"loss/total median {statistics.median(totals):.4g} "
                    f"(min {min(totals):.4g}, max {max(totals):.4g})"
                    if totals
                    else "every member diverged"
                )
                log.info(
                    "step %d/%d of %d members: %s, %.3g steps/s",
                    step,
                    cfg.steps,
                    self.size,
                    loss,
                    speed,
                )
        host_final: TrainState = jax.device_get(states)
        return host_final, diverged


def default_members_per_program(devices: Sequence[jax.Device]) -> int | None:
    """All of a group's members at once (None) on accelerators; on CPU devices, one per device
    (see the module's docstring for the measurement)."""
    return len(devices) if devices[0].platform == "cpu" else None


def _run_group(
    group: _Group,
    tmp_dir: Path,
    sweep_dir: Path,
    per_program: int | None,
    devices: Sequence[jax.Device],
    t0: float,
) -> list[MemberResult]:
    """Train a group's members, `per_program` at a time over `devices`, and write their run
    folders."""
    recipe, trained = group.recipe, dict[TargetConfig, TrainedTarget]()
    for member, kind in zip(group.members, group.kinds, strict=True):
        target = member.config.target
        if target not in trained:
            try:
                trained[target] = kind.load_frozen(recipe.target)
            except CheckpointError as err:
                raise ConfigError(str(err)) from None
            log.info("target ready (%s)", trained[target].describe())
    stacked_frozen = len(trained) > 1
    n = len(group.members)
    count = -(-n // min(per_program or n, n))
    sizes = [n // count + (1 if i < n % count else 0) for i in range(count)]
    n_devices = min(len(devices), max(sizes))
    mesh = Mesh(np.array(devices[:n_devices]), ("members",), axis_types=(AxisType.Auto,))
    programs = _programs(group, mesh, stacked_frozen)
    results, start = [], 0
    for size in sizes:
        indices = list(range(start, start + size))
        start += size
        indices += [indices[-1]] * (-size % n_devices)
        chunk = _Chunk(group, programs, mesh, indices, size, trained, stacked_frozen)
        names = ", ".join(m.name for m in chunk.members[:size])
        log.info(
            "training %s (%d per device, %d devices)", names, len(indices) // n_devices, n_devices
        )
        results += _train_chunk(chunk, tmp_dir, sweep_dir, t0)
    return results


def _train_chunk(chunk: _Chunk, tmp_dir: Path, sweep_dir: Path, t0: float) -> list[MemberResult]:
    """Train a chunk, then write each member's run folder as `pd.train.run` does."""
    members = chunk.members[: chunk.size]
    folders = [tmp_dir / m.name for m in members]
    for folder in folders:
        folder.mkdir(parents=True)
    host, diverged = chunk.train(folders)
    results = []
    for i, (member, folder) in enumerate(zip(members, folders, strict=True)):
        state, trained = _member_state(host, i), chunk.trained[i]
        if diverged[i]:  # no folder: nothing that looks like a result
            shutil.rmtree(folder)
            results.append(MemberResult(member, None, {}, state, trained.params, diverged[i]))
            log.warning("member %s: %s", member.name, diverged[i])
            continue
        evaluation = partial(chunk.evaluation, i)
        summary = write_results(folder, state, trained, evaluation, t0)  # t0: the sweep's start
        mark_finished(folder)
        results.append(
            MemberResult(member, sweep_dir / member.name, summary, state, trained.params)
        )
    return results


def sweep(
    spec: SweepSpec,
    out: Path | None = None,
    overwrite: bool = False,
    members_per_program: int | None = None,
    devices: Sequence[jax.Device] | None = None,
) -> SweepResult:
    """Train every member of `spec` and write `out` (default `runs/NAME-sweep`): one run
    folder per member, as `pd.train.run` writes it (without checkpoints), `sweep.json`,
    `sweep.txt` (the table) and `compile.json`.

    Each group's members are vmapped `members_per_program` at a time (default
    `default_members_per_program`) and spread over `devices` (default all; on a CPU, start jax
    with `jax_num_cpu_devices` set to the number of cores to use them all, as the CLI does).
    The folder appears only when the whole sweep has finished (`pd.train.rundir.staged`).
    """
    show_pd_logs()
    sweep_dir = Path(out) if out is not None else Path("runs") / f"{spec.name}-sweep"
    if members_per_program is not None and members_per_program < 1:
        raise ConfigError(
            f"--members-per-program is {members_per_program}, expected a positive integer"
        )
    try:
        groups = _groups(spec)
    except DataError as err:
        raise ConfigError(str(err)) from None
    check_destination(sweep_dir, overwrite)
    devices = list(devices or jax.devices())
    per_program = members_per_program or default_members_per_program(devices)
    t0 = time.perf_counter()
    with recording() as compile_times, staged(sweep_dir, overwrite) as tmp_dir:
        results: list[MemberResult] = []
        for g, group in enumerate(groups):
            log.info(
                "group %d of %d: %d members, %d steps",
                g + 1,
                len(groups),
                len(group.members),
                group.recipe.train.steps,
            )
            results += _run_group(group, tmp_dir, sweep_dir, per_program, devices, t0)
        order = {m.name: i for i, m in enumerate(spec.members)}
        results.sort(key=lambda r: order[r.member.name])
        result = SweepResult(sweep_dir, tuple(results), compile_times, time.perf_counter() - t0)
        _write_summary(result, tmp_dir)
    return result


def _write_summary(result: SweepResult, tmp_dir: Path) -> None:
    """`sweep.json` (per member: seeds, verdict, summary) and every `compile.json`."""
    members = []
    for m in result.members:
        c = m.member.config
        target_seed = getattr(c.target, "seed", None)
        members.append(
            {
                "name": m.member.name,
                "seed": c.seed,
                "target_seed": target_seed,
                "recovered": m.recovered,
                "diverged": m.diverged,
                "summary": m.summary,
            }
        )
    judged = [m for m in result.members if m.recovered is not None]
    record = {
        "members": members,
        "n_members": len(members),
        "n_recovered": result.n_recovered if judged else None,
        "wall_s": result.wall_s,
    }
    (tmp_dir / "sweep.json").write_text(json.dumps(record, indent=2, allow_nan=False))
    (tmp_dir / "sweep.txt").write_text(result.table() + "\n")
    result.compile_times.write(tmp_dir / "compile.json")
    for m in result.members:
        if m.run_dir is not None:  # the program the member was compiled into, shared
            result.compile_times.write(tmp_dir / m.member.name / "compile.json")


def _one_cpu_device_per_core() -> None:
    """On a CPU, one jax device per core for the members to spread over, unless the device
    count is set already (environment, config) or the backend has started."""
    if "JAX_NUM_CPU_DEVICES" in os.environ or "device_count" in os.environ.get("XLA_FLAGS", ""):
        return
    if jax.config.values.get("jax_num_cpu_devices", -1) != -1:
        return
    set_option: Callable[[str, object], None] = jax.config.update  # unannotated upstream
    try:
        set_option("jax_num_cpu_devices", os.cpu_count() or 1)
    except RuntimeError:  # the backend runs already: its devices stay as they are
        pass


def main(argv: Sequence[str]) -> int:
    """`python -m pd.train sweep ...`; the exit statuses of `python -m pd.train`."""
    parser = argparse.ArgumentParser(
        prog="python -m pd.train sweep",
        description="Train N decompositions of one recipe as one vmapped program.",
    )
    parser.add_argument("config", help="a preset or a .toml file")
    parser.add_argument("--seeds", required=True, help="the members' seeds: 0-15, 0,3,7 or 0-3,8")
    parser.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=[V1,V2,...]",
        help="one group (one program) per value of KEY; several --grid make their product",
    )
    parser.add_argument(
        "--vary-target-seed",
        action="store_true",
        help="each member's target is trained with the member's seed (default: one target)",
    )
    parser.add_argument(
        "--members-per-program",
        type=int,
        default=None,
        metavar="K",
        help="train K members at a time (default: all the members of a group at once)",
    )
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--out", type=Path, default=None, help="sweep folder (default runs/NAME-sweep)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing sweep folder")
    args = parser.parse_args(list(argv))
    try:
        seeds = parse_seeds(args.seeds)
        spec = load_sweep(args.config, seeds, args.overrides, args.grid, args.vary_target_seed)
        out = args.out if args.out is not None else Path("runs") / f"{spec.name}-sweep"
        check_destination(out, args.overwrite)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    _one_cpu_device_per_core()
    setup_logging()
    jax.devices()  # starting the backend replaces an earlier SIGTERM handler
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        result = sweep(spec, out, args.overwrite, args.members_per_program)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Terminated) as err:
        how = "by SIGTERM" if isinstance(err, Terminated) else "by Ctrl-C"
        print(
            f"error: stopped {how}; no sweep folder was written ({out} is as it was)",
            file=sys.stderr,
        )
        return 143 if isinstance(err, Terminated) else 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(result.table())
    print(result.compile_times.table())
    print(f"sweep folder: {result.sweep_dir}")
    return 0


__all__ = [
    "Member",
    "MemberResult",
    "SweepResult",
    "SweepSpec",
    "load_sweep",
    "main",
    "parse_seeds",
    "seed_sweep",
    "sweep",
]
