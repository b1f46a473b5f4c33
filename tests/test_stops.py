"""Stopping a run: a stop request is honoured within the step in flight and its checkpoint
whatever the step's length; a second signal waits for that checkpoint's write, a third stops at
once; a signal during a restore lets it finish; a run that diverges sets its folder aside."""

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import haiku as hk
import jax
import pytest
from test_resume import TMS, Out, assert_same_run, sigterm_at

from pd.state import TrainState
from pd.train import RunResult, load_config, run
from pd.train.checkpoints import Checkpoints
from pd.train.folder import RunFolder
from pd.train.run import Diverged
from pd.train.rundir import checkpoint_steps, diverged_dir, partial_dir
from pd.train.signals import Terminated
from pd.train.step import StepsFn

SLOW = 0.3  # seconds a step takes in the slowed runs: more than a multi-step call's length


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    return run(load_config("tms_5-2", TMS), tmp_path_factory.mktemp("runs") / "whole")


@pytest.fixture
def slow_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Toy runs whose steps take `SLOW` seconds each (a sleep before each call of n steps)."""
    module = sys.modules["pd.train.run"]
    make = module.make_train_steps

    def slowed(*args: object, **kwargs: object) -> StepsFn:
        inner: StepsFn = make(*args, **kwargs)

        def steps(state: TrainState, frozen: hk.Params, run_key: jax.Array, n: jax.Array) -> Out:
            time.sleep(SLOW * int(n))
            return inner(state, frozen, run_key, n)

        return steps

    monkeypatch.setattr(module, "make_train_steps", slowed)


def test_a_slow_run_stops_after_the_step_in_flight(
    uninterrupted: RunResult, slow_steps: None, tmp_path: Path
) -> None:
    """Steps of 0.3 s: each call takes one step, so a stop saves the step after the signal's
    (not the next logged or checkpointed step, 10 and 25 steps apart here)."""
    out = tmp_path / "r"
    with sigterm_at(3) as ends:
        run(uninterrupted.config, out)
    assert ends == [4]
    assert checkpoint_steps(partial_dir(out)) == [4]
    resumed = run(uninterrupted.config, out, resume=True)  # at full speed, to the same end
    assert_same_run(uninterrupted, resumed)


@pytest.fixture
def signals_while_sealing(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[list[int], threading.Event]]:
    """While the first stop's checkpoint is sealed, signals are sent from the sealing thread (as
    a user pressing Ctrl-C again): yields the list of signals to send and an event that the
    sealing waits for (up to 20 s) once they are sent."""
    module = sys.modules["pd.train.checkpoints"]
    seal = module.seal
    send: list[int] = []
    release = threading.Event()

    def seal_with_signals(folder: Path) -> None:
        if int(folder.name) % 25 and send:  # the stop's checkpoint, not a periodic one
            for sig in send:
                os.kill(os.getpid(), sig)
                time.sleep(0.05)  # each handled before the next
            send.clear()  # once: a resumed run finishes
            release.wait(20)
        seal(folder)

    monkeypatch.setattr(module, "seal", seal_with_signals)
    yield send, release
    release.set()


def test_a_second_signal_waits_for_the_checkpoint_being_written(
    uninterrupted: RunResult,
    signals_while_sealing: tuple[list[int], threading.Event],
    tmp_path: Path,
) -> None:
    send, release = signals_while_sealing
    send.append(signal.SIGINT)  # TERM, then INT while the checkpoint is written
    release.set()
    out = tmp_path / "r"
    with sigterm_at(30) as ends:
        run(uninterrupted.config, out)
    steps = checkpoint_steps(partial_dir(out))
    assert steps == [25, ends[0]]  # the write finished and was sealed; two kept, as configured
    assert sorted(p.name for p in (RunFolder(partial_dir(out)).checkpoints).iterdir()) == sorted(
        map(str, steps)
    )
    assert_same_run(uninterrupted, run(uninterrupted.config, out, resume=True))


def test_a_third_signal_stops_at_once(
    uninterrupted: RunResult,
    signals_while_sealing: tuple[list[int], threading.Event],
    tmp_path: Path,
) -> None:
    send, release = signals_while_sealing
    send.extend([signal.SIGTERM, signal.SIGINT])
    out = tmp_path / "r"
    with pytest.raises(KeyboardInterrupt):  # the third signal's, raised where the run was
        with sigterm_at(30):
            run(uninterrupted.config, out)
    assert not release.is_set()  # it did not wait for the write
    assert checkpoint_steps(partial_dir(out)) == [25]  # the one in flight is not sealed


def test_a_signal_during_a_restore_lets_it_finish(
    uninterrupted: RunResult, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    out = tmp_path / "r"
    with sigterm_at(30) as ends:
        run(uninterrupted.config, out)
    restore = Checkpoints._restore
    restored: list[int] = []

    def signalled(self: Checkpoints, step: int, like: TrainState) -> TrainState:
        os.kill(os.getpid(), signal.SIGTERM)
        state = restore(self, step, like)
        restored.append(int(state.step))
        return state

    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(Checkpoints, "_restore", signalled)
            with pytest.raises(Terminated):
                run(uninterrupted.config, out, resume=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert restored == [ends[0]]  # the restore finished, then the run stopped
    assert checkpoint_steps(partial_dir(out))[-1] == ends[0]
    assert_same_run(uninterrupted, run(uninterrupted.config, out, resume=True))


def test_a_run_that_diverges_sets_its_checkpoints_aside_and_a_rerun_starts_over(
    tmp_path: Path,
) -> None:
    """Divergence found at a checkpoint (nothing is logged before step 399): the checkpoints
    kept are finite ones, in `.r.diverged`, and do not stop a rerun."""
    out = tmp_path / "r"
    wild = [
        *TMS,
        "train.steps=400",
        "train.log_every=1000",
        "train.checkpoint_every=50",
        "train.lr.start=100",
        "train.ci_lr.start=100",
    ]
    with pytest.raises(Diverged) as raised:
        run(load_config("tms_5-2", wild), out)
    message = str(raised.value)
    assert message.startswith("training diverged before step")
    aside = diverged_dir(out)
    assert f"is set aside in '{aside}'" in message and "\n" not in message
    assert not partial_dir(out).exists() and not out.exists()
    assert checkpoint_steps(aside)  # the last finite ones
    bad = int(message.split("before step ")[1].split(":")[0])
    assert all(step < bad for step in checkpoint_steps(aside))
    sane = [*wild[:-2], "train.steps=60"]
    result = run(load_config("tms_5-2", sane), out)
    assert (result.run_dir / "summary.json").is_file()
