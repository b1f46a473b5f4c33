"""Faults of the run folder itself (issue 46): a full disk, a finished run that cannot be renamed
into place, a name too long for the folders pd writes beside it, a second run of a folder that is
being written (or of one whose run was killed), and a partial folder removed under a live run.
Each stops with exit status 2 and one sentence, leaves nothing that blocks a rerun, and the rerun
(or `--resume`) then finishes.

The runs are in-process calls of the CLI's `main`: the faults are injected by wrapping pd's
functions (the disk filled at a chosen checkpoint, a rename refused), the step programs compile
once for the whole file, and `capfd` still takes everything written to file descriptor 2, from
Python's threads and from orbax's TensorStore alike (pytest takes a thread's uncaught exception
itself: `QUIET` makes that a failure). Files a failed run leaves open are looked for directly
(`/proc/self/fd`), which a subprocess's exit would hide.
"""

import errno
import functools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_cli_errors import _fails

import pd
from pd.state import TrainState
from pd.train.__main__ import main
from pd.train.checkpoints import Checkpoints
from pd.train.config import ConfigError
from pd.train.rundir import (
    MARKER,
    FolderError,
    check_destination,
    checkpoint_steps,
    holder,
    partial_dir,
    staged,
)

TMS = [
    "train.steps=300",
    "train.batch=256",
    "train.log_every=10",
    "train.faith_warmup_steps=5",
    "train.checkpoint_every=100",
    "eval.n_samples=2000",
    "eval.batch=1000",
    "eval.figures=false",
    "target.train_steps=1500",
    "target.train_batch=1024",
]
LOGGED = [*range(0, 300, 10), 299]  # the steps metrics.jsonl holds once the run has finished

# A traceback from a thread, or from an exception Python could raise nowhere, fails the test:
# pytest takes those off stderr and reports them as these warnings.
QUIET = pytest.mark.filterwarnings(
    "error::pytest.PytestUnhandledThreadExceptionWarning",
    "error::pytest.PytestUnraisableExceptionWarning",
)


def _train(out: Path, capfd: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str]:
    """Run the CLI on the small TMS run into `out`; its exit status and what it wrote to stderr."""
    capfd.readouterr()
    code = main(["tms_5-2", *(a for t in TMS for a in ("--set", t)), "--out", str(out), *flags])
    return code, capfd.readouterr().err


# pd's package folder: a checkout named `pd` also holds the virtual environment's site-packages.
_PD_FILES = re.compile(rf'\s*File "{re.escape(str(Path(pd.__file__).parent))}/')


def _pd_frames(err: str) -> list[str]:
    """The traceback lines of stderr that are in pd's own code."""
    return [line for line in err.splitlines() if _PD_FILES.match(line)]


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error: ")]


def _assert_finished(run_dir: Path) -> None:
    """`run_dir` holds a whole run and nothing of it is left beside it."""
    for name in ("summary.json", "decomposition.npz", "config.json", MARKER):
        assert (run_dir / name).is_file(), name
    assert not partial_dir(run_dir).exists()
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(row)["step"] for row in rows] == LOGGED


@dataclass
class SmallDisk:
    """A 4 MiB tmpfs mounted at `root`, which `fill` fills up with one file."""

    root: Path

    @property
    def filler(self) -> Path:
        return self.root / "filler"

    def fill(self, leave: int = 0) -> None:
        """Fill the filesystem, then free `leave` bytes (a multiple of the 4 KiB page)."""
        with self.filler.open("ab", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 16))
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
        os.truncate(self.filler, self.filler.stat().st_size - leave)
        assert shutil.disk_usage(self.root).free == leave

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)


def _mount(root: Path) -> str | None:
    """Mount a 4 MiB tmpfs at `root`; None when done, else why it could not be."""
    if shutil.which("mount") is None:
        return "no mount command"
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(root)],
        capture_output=True,
        text=True,
    )
    return None if done.returncode == 0 else done.stderr.strip() or f"status {done.returncode}"


def _unmount(root: Path) -> None:
    if subprocess.run(["umount", str(root)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "--lazy", str(root)], check=True)  # a file left open in it


@functools.cache
def _mount_refused() -> str | None:
    """Why a tmpfs cannot be mounted here (not root, a container without the capability)."""
    with tempfile.TemporaryDirectory() as folder:
        why = _mount(Path(folder))
        if why is None:
            _unmount(Path(folder))
        return why


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    root = tmp_path / "disk"
    root.mkdir()
    why = _mount(root)
    if why is not None:  # test_a_full_disk_without_a_small_filesystem runs in their place
        pytest.skip(f"a full disk needs a small filesystem, and mounting a tmpfs failed: {why}")
    small = SmallDisk(root)
    try:
        yield small
    finally:
        small.free()
        _unmount(root)


def _assert_refused_for_space(code: int, err: str, run_dir: Path) -> list[int]:
    """A run stopped by a full disk: status 2, one sentence saying so, and nothing that blocks
    a rerun (no partial folder, or one with a sealed checkpoint that the sentence says to
    resume); returns the kept checkpoints' steps."""
    assert code == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: the disk holding '{run_dir}' is full (No space left"), last
    assert _errors(err) == [last], err
    assert _pd_frames(err) == [], err
    assert not run_dir.exists()
    partial = partial_dir(run_dir)
    kept = checkpoint_steps(partial)
    if kept:
        assert f"(checkpoint at step {kept[-1]}; free space and pass --resume)" in last, last
        assert holder(partial) is None  # the lock went with the run
    else:
        assert not partial.exists(), sorted(p.name for p in partial.rglob("*"))
        assert last.endswith(f"no run folder was written ('{run_dir}' is as it was)"), last
    return kept


@pytest.mark.parametrize(
    ("leave", "says"),
    [
        pytest.param(0, "", marks=QUIET, id="no-space"),
        pytest.param(8 << 10, "", marks=QUIET, id="8KiB"),  # the lock and config.json fit
        pytest.param(200 << 10, "the checkpoint of step 100 needs about", marks=QUIET, id="200KiB"),
    ],
)
def test_a_disk_too_full_for_the_run_stops_it_leaving_nothing(
    leave: int, says: str, disk: SmallDisk, capfd: pytest.CaptureFixture[str]
) -> None:
    run_dir = disk.root / "run"
    disk.fill(leave)
    code, err = _train(run_dir, capfd)
    assert _assert_refused_for_space(code, err, run_dir) == []
    assert says in err
    assert "Traceback" not in err, err
    assert sorted(p.name for p in disk.root.iterdir()) == ["filler"]
    disk.free()
    code, err = _train(run_dir, capfd)
    assert code == 0, err
    _assert_finished(run_dir)


# orbax's failed writers call into asyncio loops that are closed by then: an unraisable error
# that shows up in some runs and not in others, from orbax's threads, not pd's.
ORBAX_LOOPS = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.mark.parametrize(
    "where",
    [pytest.param("pd-refuses", marks=QUIET), pytest.param("orbax-writes", marks=ORBAX_LOOPS)],
)
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_disk_that_fills_after_the_first_checkpoint_keeps_the_run_for_resume(
    where: str, disk: SmallDisk, capfd: pytest.CaptureFixture[str]
) -> None:
    """The disk fills up once the checkpoint of step 100 is sealed, before the one of step 200:
    pd refuses to start that one (it checks the free space first), or, with that check fooled
    (another writer filling the disk after it), orbax's own write fails. Either way the run is
    kept for `--resume`, which finishes it once there is room. When orbax's write fails, its
    threads log what failed (tracebacks included, none through pd's code), and asyncio's closed
    loops raise where no one catches them; no thread dies of an uncaught error (the TensorBoard
    file is written in the run's own thread)."""
    run_dir = disk.root / "run"
    save = Checkpoints.save
    saves: list[int] = []

    def filling(self: Checkpoints, step: int, state: TrainState) -> None:
        saves.append(step)
        if len(saves) == 2:
            self._wait_sealed()  # the first checkpoint is whole
            disk.fill()
        save(self, step, state)

    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(Checkpoints, "save", filling)
        if where == "orbax-writes":
            room = SimpleNamespace(disk_usage=lambda path: SimpleNamespace(free=1 << 40))
            monkeypatch.setattr(sys.modules["pd.train.checkpoints"], "shutil", room)
        code, err = _train(run_dir, capfd)
    assert saves == [100, 200]
    # orbax's writers of the failed checkpoint have all logged, before pd's sentence
    assert [t.name for t in threading.enumerate() if type(t).__module__.startswith("orbax.")] == []
    assert _assert_refused_for_space(code, err, run_dir) == [100]
    disk.free()
    code, err = _train(run_dir, capfd, "--resume")
    assert code == 0, err
    assert "resumed from the checkpoint of step 100" in err
    _assert_finished(run_dir)


@QUIET
def test_a_full_disk_without_a_small_filesystem(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no tmpfs can be mounted (not root), the full disk is a metrics row whose write
    fails with ENOSPC after the first checkpoint: the run is kept for --resume."""
    if _mount_refused() is None:
        pytest.skip("a tmpfs can be mounted here: the tests above fill a real filesystem")
    sinks = sys.modules["pd.train.sinks"].MetricSinks
    log = sinks.log

    def full(self: object, step: int, row: dict[str, float]) -> dict[str, float]:
        if step >= 150:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        result: dict[str, float] = log(self, step, row)
        return result

    run_dir = tmp_path / "run"
    with monkeypatch.context() as patched:
        patched.setattr(sinks, "log", full)
        code, err = _train(run_dir, capfd)
    assert _assert_refused_for_space(code, err, run_dir) == [100]
    assert "Traceback" not in err, err
    code, err = _train(run_dir, capfd, "--resume")
    assert code == 0, err
    _assert_finished(run_dir)


@QUIET
def test_a_finished_run_that_cannot_be_moved_into_place_is_kept_for_resume(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The last rename fails (as in a folder made immutable meanwhile): one sentence, the whole
    run kept with its final checkpoint, and `--resume` moves it into place."""
    run_dir = tmp_path / "run"
    partial = partial_dir(run_dir)
    replace = os.replace

    def refused(src: str | os.PathLike[str], dst: str | os.PathLike[str], **fds: int) -> None:
        if Path(src) == partial and Path(dst) == run_dir:
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), str(dst))
        replace(src, dst, **fds)

    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(sys.modules["pd.train.rundir"].os, "replace", refused)
        code, err = _train(run_dir, capfd)
    assert code == 2, err
    assert _errors(err) == [
        f"error: the finished run could not be moved to '{run_dir}' (Operation not permitted), "
        f"expected a writable folder; it is kept in '{partial}' (pass --resume once it is "
        "writable)"
    ], err
    assert "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [partial.name]
    assert checkpoint_steps(partial) == [200, 300]
    assert (partial / "summary.json").is_file() and (partial / "decomposition.npz").is_file()
    code, err = _train(run_dir, capfd, "--resume")
    assert code == 0, err
    assert "resumed from the checkpoint of step 300" in err
    _assert_finished(run_dir)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_run_folder_name_too_long_for_its_siblings_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The widest name pd writes beside a run folder is `.NAME.old-XXXXXXXX` (the run it
    replaces, while the new one moves in): a name leaves room for it, exactly."""
    limit = os.pathconf(tmp_path, "PC_NAME_MAX") - len("..old-00000000")
    _fails(["tms_5-2"], capsys, tmp_path / ("r" * 250), "is 250 bytes long", f"at most {limit}")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match=f"is {limit + 1} bytes long, expected at most {limit} "):
        check_destination(tmp_path / ("r" * (limit + 1)), False)
    widest = tmp_path / ("r" * limit)
    check_destination(widest, False)
    for overwrite in (False, True):  # the second replaces the first, through its old- sibling
        with staged(widest, overwrite) as partial:
            (partial / "summary.json").write_text(str(overwrite))
    assert (widest / "summary.json").read_text() == "True"
    assert sorted(tmp_path.iterdir()) == [widest]
    with pytest.raises(OSError) as wider:  # so the limit is not one byte too strict
        (tmp_path / f".{'r' * (limit + 1)}.old-00000000").mkdir()
    assert wider.value.errno == errno.ENAMETOOLONG


_HOLD = """
import sys, time
from pathlib import Path
from pd.train.rundir import SEAL, staged
with staged(Path(sys.argv[1]), False) as partial:
    (partial / "checkpoints" / "100").mkdir(parents=True)
    (partial / "checkpoints" / "100" / SEAL).write_text("{}")
    (partial / "stale.txt").write_text("from the killed run")
    print("writing", flush=True)
    time.sleep(300)
"""


@QUIET
def test_a_live_run_is_refused_and_a_killed_one_resumed_or_started_over(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """While a run holds its partial folder's lock, every run of the folder is refused naming
    it (--resume and --overwrite too: neither may take a folder being written). Once it is
    killed outright (its lock file left, not held), a run is told to resume or start over, and
    `--overwrite` starts over."""
    run_dir = tmp_path / "run"
    partial = partial_dir(run_dir)
    me = f"pid {os.getpid()} on {socket.gethostname()}"
    with pytest.raises(KeyboardInterrupt), staged(run_dir, False):
        for overwrite, resume in [(False, False), (False, True), (True, False)]:
            with pytest.raises(FolderError) as refused:
                check_destination(run_dir, overwrite, resume)
            assert str(refused.value) == (
                f"run '{run_dir}' is in progress ({me} is writing '{partial}'), expected one run "
                "per folder at a time (wait for it, or stop it and pass --resume)"
            )
        raise KeyboardInterrupt  # a run stopped before its first checkpoint
    assert list(tmp_path.iterdir()) == []

    argv = [sys.executable, "-c", _HOLD, str(run_dir)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as other:
        try:
            assert other.stdout is not None and other.stdout.readline() == "writing\n"
            assert holder(partial) == f"pid {other.pid} on {socket.gethostname()}"
            code, err = _train(run_dir, capfd, "--overwrite")
            assert code == 2 and _errors(err) == [err.strip()], err
            assert f"is in progress (pid {other.pid} on " in err, err
        finally:
            other.kill()
    assert other.returncode == -9
    assert holder(partial) is None
    for overwrite, resume in [(False, True), (True, False)]:
        check_destination(run_dir, overwrite, resume)
    with pytest.raises(ConfigError) as interrupted:
        check_destination(run_dir, False)
    assert not isinstance(interrupted.value, FolderError)
    assert str(interrupted.value) == (
        f"an interrupted run of '{run_dir}' is kept in '{partial}' (checkpoint at step 100), "
        "expected --resume to continue it or --overwrite to start over"
    )
    code, err = _train(run_dir, capfd, "--overwrite")
    assert code == 0, err
    _assert_finished(run_dir)
    assert not (run_dir / "stale.txt").exists()
    assert checkpoint_steps(run_dir) == [200, 300]
    assert sorted(tmp_path.iterdir()) == [run_dir]


@pytest.mark.parametrize(
    "when",
    [
        pytest.param("before-the-first-checkpoint", marks=QUIET),
        pytest.param("after-the-first-checkpoint", marks=QUIET),
        pytest.param(
            "while-a-checkpoint-is-sealed",
            marks=QUIET,
        ),
        pytest.param(
            "during-the-final-evaluation",
            marks=QUIET,
        ),
    ],
)
def test_a_partial_folder_removed_under_the_run_stops_it(
    when: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Someone deletes the partial folder of a live run (`rm -rf`): the run stops with one
    sentence saying so, writes nothing back (no partial folder made again, no run folder), and
    a rerun works."""
    run_dir = tmp_path / "run"
    partial = partial_dir(run_dir)
    run_module, resume_module = sys.modules["pd.train.run"], sys.modules["pd.train.checkpoints"]
    check, save, seal = run_module.check_intact, Checkpoints.save, resume_module.seal
    write_results = run_module.write_results
    made: list[Checkpoints] = []
    checks: list[Path] = []

    def saving(self: Checkpoints, step: int, state: TrainState) -> None:
        made.append(self)
        save(self, step, state)

    def checking(folder: Path) -> None:  # before each checkpoint's save, and its seal
        if threading.current_thread() is not threading.main_thread():
            check(folder)  # the seal's check
            return
        checks.append(folder)
        if len(checks) == (1 if when == "before-the-first-checkpoint" else 2):
            if made:
                made[-1]._wait_sealed()  # the first checkpoint is whole
            shutil.rmtree(folder)
        check(folder)

    def sealing(folder: Path) -> None:  # on the sealing thread, the write done
        shutil.rmtree(partial)
        seal(folder)

    def writing(folder: Path, *args: object) -> dict[str, float]:
        shutil.rmtree(folder)
        summary: dict[str, float] = write_results(folder, *args)
        return summary

    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(Checkpoints, "save", saving)
        if when == "while-a-checkpoint-is-sealed":
            monkeypatch.setattr(resume_module, "seal", sealing)
        elif when == "during-the-final-evaluation":
            monkeypatch.setattr(run_module, "write_results", writing)
        else:
            monkeypatch.setattr(run_module, "check_intact", checking)
        code, err = _train(run_dir, capfd)
    assert code == 2, err
    assert _errors(err) == [
        f"error: run folder '{partial}' was removed while this run was writing it, expected it "
        "kept until the run finishes (the run's work is lost; run it again)"
    ], err
    assert "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []
    code, err = _train(run_dir, capfd)
    assert code == 0, err
    _assert_finished(run_dir)
