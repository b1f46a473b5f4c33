"""`sweep`: every group's members trained chunk by chunk, each member's run folder written."""

import contextlib
import logging
import shutil
import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from pd.compile_times import recording
from pd.data import DataError
from pd.log import show_pd_logs
from pd.state import TrainState
from pd.targets.configs import TargetConfig
from pd.targets.hf import CheckpointError
from pd.targets.train import TrainedTarget
from pd.train.ahead import wait_compiles
from pd.train.config import ConfigError
from pd.train.results import write_results
from pd.train.rundir import check_destination, mark_finished, staged
from pd.train.sweep.chunk import Chunk, member_state
from pd.train.sweep.programs import Group, compile_ahead, group_members, make_programs
from pd.train.sweep.result import MemberResult, SweepResult, with_consistency, write_summary
from pd.train.sweep.spec import SweepSpec

log = logging.getLogger(__name__)


def default_members_per_program(devices: Sequence[jax.Device]) -> int | None:
    """All of a group's members at once (None) on accelerators; on CPU devices one per call, in
    as many lanes side by side as devices (`_layout`; the measurements are in
    `pd.train.sweep`'s docstring)."""
    return 1 if devices[0].platform == "cpu" else None


@dataclass(frozen=True)
class _Layout:
    """How a group's members train: each chunk is one call of the programs on `mesh`, and each
    lane (a thread) trains its chunks one after another. A chunk is its member indices, the
    last repeated to fill every device, and how many of them are its own."""

    mesh: Mesh
    lanes: list[list[tuple[list[int], int]]]


def _layout(n: int, per_program: int | None, devices: Sequence[jax.Device]) -> _Layout:
    """`n` members on `devices`, `per_program` at a time (None: all).

    On accelerators, one lane whose programs are sharded over the devices. On CPU devices, one
    lane per device, all on the first device: the lanes take every D-th member (so their shares
    differ by one at most) and call one compiled program from threads of their own. XLA's CPU
    devices share one pool of threads, one per core, so a program sharded over two of them does
    not run its halves on a core each; two calls side by side took 0.82× its time (2.51 against
    3.07 ms a step of two members; `pd.train.sweep`), and a lane slowed by other work (a
    chunk's run folders being written) does not hold the other back."""
    if devices[0].platform == "cpu":
        mesh = Mesh(np.array(devices[:1]), ("members",), axis_types=(AxisType.Auto,))
        n_lanes = min(len(devices), n)
        lanes = []
        for share in (list(range(lane, n, n_lanes)) for lane in range(n_lanes)):
            size = min(per_program or len(share), len(share))
            pieces = [share[i : i + size] for i in range(0, len(share), size)]
            lanes.append([(piece, len(piece)) for piece in pieces])
        return _Layout(mesh, lanes)
    count = -(-n // min(per_program or n, n))
    sizes = [n // count + (1 if i < n % count else 0) for i in range(count)]
    n_devices = min(len(devices), max(sizes))
    chunks, start = [], 0
    for size in sizes:
        indices = list(range(start, start + size))
        chunks.append((indices + [indices[-1]] * (-size % n_devices), size))
        start += size
    mesh = Mesh(np.array(devices[:n_devices]), ("members",), axis_types=(AxisType.Auto,))
    return _Layout(mesh, [chunks])


def _run_group(
    group: Group,
    tmp_dir: Path,
    sweep_dir: Path,
    per_program: int | None,
    devices: Sequence[jax.Device],
    t0: float,
) -> list[MemberResult]:
    """Train a group's members, `per_program` at a time over `devices`, and write their run
    folders."""
    recipe, trained = group.recipe, dict[TargetConfig, TrainedTarget]()
    stacked_frozen = len({m.config.target for m in group.members}) > 1
    layout = _layout(len(group.members), per_program, devices)
    mesh = layout.mesh
    programs = make_programs(group, mesh, stacked_frozen)
    seeds = [group.members[i].config.seed for i in layout.lanes[0][0][0]]
    with ThreadPoolExecutor(3, thread_name_prefix="pd-compile") as pool:
        ahead = compile_ahead(pool, programs, group, mesh, seeds, stacked_frozen)
        for member, kind in zip(group.members, group.kinds, strict=True):
            target = member.config.target
            if target not in trained:
                try:
                    trained[target] = kind.load_frozen(recipe.target)
                except CheckpointError as err:
                    raise ConfigError(str(err)) from None
                log.info("target ready (%s)", trained[target].describe())
    wait_compiles(ahead)
    stop = threading.Event()  # set when the sweep stops early: the other lanes stop too

    def train_lane(chunks: list[tuple[list[int], int]]) -> list[Future[list[MemberResult]]]:
        written: list[Future[list[MemberResult]]] = []
        for indices, size in chunks:
            for done in (w for w in written if w.done()):
                done.result()  # a write that failed stops the sweep here, not after all chunks
            chunk = Chunk(group, programs, mesh, indices, size, trained, stacked_frozen)
            log.info("training %s", chunk.label)
            folders = [tmp_dir / m.name for m in chunk.members[:size]]
            for folder in folders:
                folder.mkdir(parents=True)
            host, diverged = chunk.train(folders, stop)
            written.append(
                writer.submit(_write_chunk, chunk, host, diverged, tmp_dir, sweep_dir, t0)
            )
        return written

    # Each chunk's run folders (evaluation and figures: mostly one Python thread) are written
    # beside the next chunks' training (XLA on every core).
    with (
        ThreadPoolExecutor(1, thread_name_prefix="pd-sweep-results") as writer,
        ThreadPoolExecutor(len(layout.lanes), thread_name_prefix="pd-sweep-lane") as lanes,
    ):
        trainings = [lanes.submit(train_lane, chunks) for chunks in layout.lanes]
        try:
            wait(trainings, return_when=FIRST_EXCEPTION)
            written = [w for training in trainings for w in training.result()]
        except BaseException:  # a lane failed, or Ctrl-C: the others stop after their call
            stop.set()
            raise
    return [result for chunk_results in written for result in chunk_results.result()]


def _write_chunk(
    chunk: Chunk,
    host: TrainState,
    diverged: list[str],
    tmp_dir: Path,
    sweep_dir: Path,
    t0: float,
) -> list[MemberResult]:
    """Each member's run folder from its trained state, as `pd.train.run` writes it; a member
    that diverged gets none."""
    results = []
    for i, member in enumerate(chunk.members[: chunk.size]):
        folder = tmp_dir / member.name
        state, trained = member_state(host, i), chunk.trained[i]
        if diverged[i]:  # no folder, nor an empty grid point's: nothing that looks like a result
            shutil.rmtree(folder)
            for parent in folder.relative_to(tmp_dir).parents[:-1]:
                with contextlib.suppress(OSError):  # not empty: another member's folder is there
                    (tmp_dir / parent).rmdir()
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
        groups = group_members(spec)
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
        result = with_consistency(result, tmp_dir)
        write_summary(result, tmp_dir)
    return result
