"""Checkpoints and exact resume: a run stopped by SIGTERM at any step and resumed ends where an
uninterrupted run ends (S18: batches and keys are functions of the seed and the step). A
language model's run resumed on another device count: tests/test_lm_recipe.py."""

import json
import logging
import os
import re
import shutil
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import haiku as hk
import jax
import numpy as np
import pytest
from hypothesis import Phase, assume, given, settings
from hypothesis import strategies as st

from pd.state import TrainState
from pd.train import RunResult, load_config, run
from pd.train.checkpoints import CheckpointDamaged, CheckpointMismatch, Checkpoints, damage
from pd.train.config import ConfigError
from pd.train.folder import RunFolder
from pd.train.objective import Metrics
from pd.train.rundir import SEAL, checkpoint_steps, partial_dir
from pd.train.signals import Terminated
from pd.train.step import StepFn, StepsFn

Out = tuple[TrainState, Metrics]

TMS = [
    "train.steps=60",
    "train.batch=256",
    "train.log_every=10",
    "train.faith_warmup_steps=5",
    "train.checkpoint_every=25",
    "eval.n_samples=2000",
    "eval.batch=1000",
    "eval.figures=false",
    "target.train_steps=1500",
    "target.train_batch=1024",
]


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated  # the CLI's SIGTERM handler


@contextmanager
def sigterm_at(stop: int) -> Iterator[list[int]]:
    """Runs started inside get a real SIGTERM when they start the call that takes step `stop`
    (a toy run takes several steps a call of `train_steps`, a language model one step a call of
    `train_step`), and must stop with Terminated; yields a list that then holds the step the
    signalled call ended at, where the run's checkpoint must be."""
    module = sys.modules["pd.train.run"]
    make_train_steps, make_train_step = module.make_train_steps, module.make_train_step
    ends: list[int] = []
    last: list[Out] = []

    def signal_at(first: jax.Array, n: int | jax.Array) -> None:
        # One call in flight: the loop waits for a call's results before the next call.
        assert all(leaf.is_ready() for leaf in jax.tree.leaves(last[0][1] if last else {}))
        if int(first) <= stop < int(first) + int(n):
            ends.append(int(first) + int(n))
            os.kill(os.getpid(), signal.SIGTERM)

    def steps_with_signal(*args: object, **kwargs: object) -> StepsFn:
        inner: StepsFn = make_train_steps(*args, **kwargs)

        def steps(state: TrainState, frozen: hk.Params, run_key: jax.Array, n: jax.Array) -> Out:
            signal_at(state.step, n)
            last[:] = [inner(state, frozen, run_key, n)]
            return last[0]

        return steps

    def step_with_signal(*args: object, **kwargs: object) -> StepFn:
        inner: StepFn = make_train_step(*args, **kwargs)

        def step(state: TrainState, frozen: hk.Params, x: jax.Array, run_key: jax.Array) -> Out:
            signal_at(state.step, 1)
            last[:] = [inner(state, frozen, x, run_key)]
            return last[0]

        return step

    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        with pytest.MonkeyPatch.context() as monkeypatch:
            monkeypatch.setattr(module, "make_train_steps", steps_with_signal)
            monkeypatch.setattr(module, "make_train_step", step_with_signal)
            with pytest.raises(Terminated):
                yield ends
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    return run(load_config("tms_5-2", TMS), tmp_path_factory.mktemp("runs") / "whole")


def metric_rows(run: RunResult) -> list[dict[str, float]]:
    """The metrics rows without their wall-clock keys (time/…), which no two runs share."""
    lines = (run.run_dir / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


def assert_same_run(a: RunResult, b: RunResult) -> None:
    for x, y in zip(jax.tree.leaves(a.state), jax.tree.leaves(b.state), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert metric_rows(a) == metric_rows(b)
    name = "decomposition.npz"
    assert (a.run_dir / name).read_bytes() == (b.run_dir / name).read_bytes()


@settings(max_examples=2, phases=[Phase.generate])  # each example is two runs: no shrinking
@given(stop=st.integers(1, 58))
def test_a_run_stopped_by_sigterm_and_resumed_is_bit_identical(
    uninterrupted: RunResult, tmp_path_factory: pytest.TempPathFactory, stop: int
) -> None:
    out = tmp_path_factory.mktemp("runs") / "stopped"
    with sigterm_at(stop) as ends:
        run(uninterrupted.config, out)
    # The steps in flight finished and were saved.
    assert checkpoint_steps(partial_dir(out))[-1] == ends[0]
    assert not out.exists()
    resumed = run(uninterrupted.config, out, resume=True)
    assert_same_run(uninterrupted, resumed)
    assert not partial_dir(out).exists() and checkpoint_steps(out)[-1] == 60


def test_resume_refuses_another_config_and_a_missing_checkpoint(
    uninterrupted: RunResult, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="found no interrupted run"):
        run(uninterrupted.config, tmp_path / "none", resume=True)
    with sigterm_at(30) as ends:
        run(uninterrupted.config, tmp_path / "r")
    other = load_config("tms_5-2", [*TMS, "loss.importance=0.01"])
    with pytest.raises(ConfigError, match=r"'loss\.importance' is 0\.01, but the interrupted run"):
        run(other, tmp_path / "r", resume=True)
    with pytest.raises(ConfigError, match=r"interrupted run .* expected --resume to continue it"):
        run(uninterrupted.config, tmp_path / "r")
    assert checkpoint_steps(partial_dir(tmp_path / "r")) == [25, ends[0]]  # nothing was lost


@pytest.fixture(scope="module")
def stopped(uninterrupted: RunResult, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The partial folder of a run stopped at step 30: sealed checkpoints at 25 and the end of
    the call that took step 30. Tests copy it before they damage it."""
    out = tmp_path_factory.mktemp("runs") / "stopped"
    with sigterm_at(30):
        run(uninterrupted.config, out)
    return partial_dir(out)


def _copy(stopped: Path, into: Path) -> Path:
    """A copy of the stopped run's partial folder as the partial of `into/r`; returns `into/r`."""
    shutil.copytree(stopped, partial_dir(into / "r"))
    return into / "r"


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != SEAL)


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_a_bit_flip_in_any_checkpoint_file_is_detected(stopped: Path, data: st.DataObject) -> None:
    """Every file of a checkpoint (data, orbax's metadata, manifests) is under its seal."""
    folder = RunFolder(stopped).checkpoints / str(checkpoint_steps(stopped)[-1])
    assert damage(folder) is None
    path = data.draw(st.sampled_from(_files(folder)), label="file")
    content = bytearray(path.read_bytes())
    assume(content)
    bit = data.draw(st.integers(0, 8 * len(content) - 1), label="bit")
    content[bit // 8] ^= 1 << (bit % 8)
    original = path.read_bytes()
    try:
        path.write_bytes(bytes(content))
        what = damage(folder)
    finally:
        path.write_bytes(original)
    assert what == f"its file {path.relative_to(folder).as_posix()} does not match its sha256"


def _truncate(folder: Path) -> None:
    largest = max(_files(folder / "default"), key=lambda p: p.stat().st_size)
    largest.write_bytes(largest.read_bytes()[: largest.stat().st_size // 2])


def _garble_metadata(folder: Path) -> None:
    (folder / "default" / "_METADATA").write_text("{not json")


def _empty(folder: Path) -> None:
    for path in _files(folder):
        path.unlink()


def _drop_manifest(folder: Path) -> None:
    (folder / "default" / "manifest.ocdbt").unlink()


def _add_file(folder: Path) -> None:
    (folder / "default" / "stray").write_text("x")


@pytest.mark.parametrize("harm", [_truncate, _garble_metadata, _empty, _drop_manifest, _add_file])
def test_a_damaged_checkpoint_is_named_by_what_is_wrong(
    stopped: Path, tmp_path: Path, harm: Callable[[Path], None]
) -> None:
    folder = _copy(stopped, tmp_path)
    newest = RunFolder(partial_dir(folder)).checkpoints / str(
        checkpoint_steps(partial_dir(folder))[-1]
    )
    harm(newest)
    what = damage(newest)
    assert what is not None and what.startswith("it")
    assert re.fullmatch(r"its file \S+ (is missing|does not match its sha256)|it holds .*", what)


def test_resume_skips_a_damaged_checkpoint_and_ends_bit_identical(
    uninterrupted: RunResult, stopped: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = _copy(stopped, tmp_path)
    steps = checkpoint_steps(partial_dir(out))
    newest = RunFolder(partial_dir(out)).checkpoints / str(steps[-1])
    data = max(_files(newest / "default"), key=lambda p: p.stat().st_size)
    content = bytearray(data.read_bytes())
    content[len(content) // 2] ^= 0x01  # one bit in the middle of the largest data file
    data.write_bytes(bytes(content))
    with caplog.at_level(logging.INFO, logger="pd.train.checkpoints"):
        resumed = run(uninterrupted.config, out, resume=True)
    assert f"the checkpoint of step {steps[-1]} is damaged" in caplog.text
    assert "resumed from the checkpoint of step 25" in caplog.text
    assert_same_run(uninterrupted, resumed)


def test_a_run_whose_checkpoints_are_all_damaged_is_one_sentence(
    uninterrupted: RunResult, stopped: Path, tmp_path: Path
) -> None:
    out = _copy(stopped, tmp_path)
    for step in checkpoint_steps(partial_dir(out)):
        _garble_metadata(RunFolder(partial_dir(out)).checkpoints / str(step))
    with pytest.raises(CheckpointDamaged) as raised:
        run(uninterrupted.config, out, resume=True)
    message = str(raised.value)
    assert "\n" not in message and message.startswith("no checkpoint in")
    assert "step 25: its file default/_METADATA does not match its sha256" in message
    assert "start over with --overwrite" in message
    # Starting over is allowed, and nothing of the damaged run is left.
    again = run(uninterrupted.config, out, overwrite=True)
    assert_same_run(uninterrupted, again)


def test_an_intact_checkpoint_of_another_state_layout_stops_the_resume_and_is_kept(
    tmp_path: Path,
) -> None:
    """A sealed checkpoint that orbax cannot read into this version's train state (here: the
    state of another model) is not damage: one sentence, and every file stays."""
    from pd.init import key_tree
    from pd.train.init_state import init_train_state
    from pd.train.run import make_recipe

    init_key, src_key, _ = key_tree(0)
    saved, other = (
        init_train_state(make_recipe(load_config(p, [])), init_key, src_key)
        for p in ("tms_5-2", "resid_mlp1")
    )
    with Checkpoints(tmp_path / "ckpt", keep=2) as checkpoints:
        checkpoints.save(3, saved)
    before = sorted(p for p in (tmp_path / "ckpt").rglob("*"))
    with pytest.raises(CheckpointMismatch) as raised:
        Checkpoints(tmp_path / "ckpt", keep=2).restore_latest(other)
    message = str(raised.value)
    assert "\n" not in message and message.startswith("the checkpoint of step 3 in")
    assert "is intact but does not fit this version of pd's train state" in message
    assert sorted(p for p in (tmp_path / "ckpt").rglob("*")) == before


def test_an_interrupted_run_without_its_config_is_one_sentence(
    uninterrupted: RunResult, stopped: Path, tmp_path: Path
) -> None:
    out = _copy(stopped, tmp_path)
    (partial_dir(out) / "config.json").unlink()
    with pytest.raises(ConfigError, match=r"config '.*config\.json' is missing, expected the"):
        run(uninterrupted.config, out, resume=True)
    (partial_dir(out) / "config.json").write_text("[1, 2")
    with pytest.raises(ConfigError, match=r"config\.json' is unreadable \("):
        run(uninterrupted.config, out, resume=True)
