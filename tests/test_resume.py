"""Checkpoints and exact resume: a run stopped by SIGTERM at any step and resumed ends where an
uninterrupted run ends (S18: batches and keys are functions of the seed and the step). A
language model's run resumed on another device count: tests/test_lm_recipe.py."""

import json
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import haiku as hk
import jax
import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from pd.state import TrainState
from pd.train import RunResult, load_config, run
from pd.train.config import ConfigError
from pd.train.rundir import checkpoint_steps, partial_dir
from pd.train.signals import Terminated
from pd.train.step import Metrics, StepFn, StepsFn

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
def sigterm_at(stop: int) -> Iterator[None]:
    """Runs started inside get a real SIGTERM when they start the call that takes step `stop`
    (a toy run takes the steps up to the next logged or checkpointed one in one call of
    `train_steps`, a language model one step a call of `train_step`), and must stop with
    Terminated."""
    module = sys.modules["pd.train.run"]
    make_train_steps, make_train_step = module.make_train_steps, module.make_train_step

    def signal_at(first: jax.Array, n: int | jax.Array) -> None:
        if int(first) <= stop < int(first) + int(n):
            os.kill(os.getpid(), signal.SIGTERM)

    def steps_with_signal(*args: object, **kwargs: object) -> StepsFn:
        inner: StepsFn = make_train_steps(*args, **kwargs)

        def steps(state: TrainState, frozen: hk.Params, run_key: jax.Array, n: jax.Array) -> Out:
            signal_at(state.step, n)
            return inner(state, frozen, run_key, n)

        return steps

    def step_with_signal(*args: object, **kwargs: object) -> StepFn:
        inner: StepFn = make_train_step(*args, **kwargs)

        def step(state: TrainState, frozen: hk.Params, x: jax.Array, run_key: jax.Array) -> Out:
            signal_at(state.step, 1)
            return inner(state, frozen, x, run_key)

        return step

    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        with pytest.MonkeyPatch.context() as monkeypatch:
            monkeypatch.setattr(module, "make_train_steps", steps_with_signal)
            monkeypatch.setattr(module, "make_train_step", step_with_signal)
            with pytest.raises(Terminated):
                yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def call_end(step: int) -> int:
    """The last step of the call that takes `step`: the next logged (every 10), checkpointed
    (every 25) or last step."""
    while not (step % 10 == 0 or (step + 1) % 25 == 0 or step == 59):
        step += 1
    return step


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    return run(load_config("tms_5-2", TMS), tmp_path_factory.mktemp("runs") / "whole")


def metric_rows(run: RunResult) -> list[dict[str, float]]:
    """The metrics rows without their wall-clock keys (time/…), which no two runs share."""
    lines = (run.run_dir / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


def _assert_same_run(a: RunResult, b: RunResult) -> None:
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
    with sigterm_at(stop):
        run(uninterrupted.config, out)
    # The steps in flight finished and were saved.
    assert checkpoint_steps(partial_dir(out))[-1] == call_end(stop) + 1
    assert not out.exists()
    resumed = run(uninterrupted.config, out, resume=True)
    _assert_same_run(uninterrupted, resumed)
    assert not partial_dir(out).exists() and checkpoint_steps(out)[-1] == 60


def test_resume_refuses_another_config_and_a_missing_checkpoint(
    uninterrupted: RunResult, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="found no interrupted run"):
        run(uninterrupted.config, tmp_path / "none", resume=True)
    with sigterm_at(30):
        run(uninterrupted.config, tmp_path / "r")
    other = load_config("tms_5-2", [*TMS, "loss.importance=0.01"])
    with pytest.raises(ConfigError, match=r"'loss\.importance' is 0\.01, but the interrupted run"):
        run(other, tmp_path / "r", resume=True)
    with pytest.raises(ConfigError, match=r"interrupted run .* expected --resume to continue it"):
        run(uninterrupted.config, tmp_path / "r")
    assert checkpoint_steps(partial_dir(tmp_path / "r")) == [25, 31]  # nothing was lost
