"""Live metrics: strict JSON rows with wall time and speed, TensorBoard events that TensorBoard's
own reader parses, W&B offline runs, one log line per row without a terminal, resumed runs that
append, and pd's log lines shown once from Python with logging unconfigured."""

import errno
import json
import logging
import os
import struct
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import wandb
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from wandb.proto import wandb_internal_pb2

from pd.train.folder import RunFolder
from pd.train.sinks import MetricSinks, WandbMode, in_notebook


def _row(step: int) -> dict[str, float]:
    return {"loss/total": 1.0 / (step + 1), "lr": 1e-3, "ci_l0/linear1": float(step % 3)}


def _train(sinks: MetricSinks, start: int, stop: int) -> list[int]:
    """The loop's side of the contract: advance every step, log on the logged ones."""
    logged = []
    for step in range(start, stop):
        if sinks.should_log(step):
            sinks.log(step, _row(step))
            logged.append(step)
        sinks.advance()
    return logged


def _strict(text: str) -> list[dict[str, float]]:
    def refuse(constant: str) -> float:
        raise ValueError(f"not strict JSON: {constant}")

    return [json.loads(line, parse_constant=refuse) for line in text.splitlines()]


def _sinks(
    run_dir: Path,
    start: int = 0,
    *,
    eval_every: int = 0,
    tensorboard: bool = False,
    wandb: WandbMode = "off",
    config: dict[str, object] | None = None,
    interactive: bool = False,
) -> MetricSinks:
    """20 steps logged every 5, no bar."""
    return MetricSinks(
        run_dir,
        20,
        log_every=5,
        eval_every=eval_every,
        start_step=start,
        tensorboard=tensorboard,
        wandb=wandb,
        config=config,
        interactive=interactive,
    )


def test_rows_are_strict_json_with_wall_time_and_speed(tmp_path: Path) -> None:
    with _sinks(tmp_path) as sinks:
        assert _train(sinks, 0, 20) == [0, 5, 10, 15, 19]
        with pytest.raises(ValueError, match="Out of range float"):
            sinks.log(20, {"loss/total": float("nan")})
    rows = _strict(RunFolder(tmp_path).metrics.read_text())
    assert [r["step"] for r in rows] == [0, 5, 10, 15, 19]
    assert all(r["loss/total"] == _row(int(r["step"]))["loss/total"] for r in rows)
    walls = [r["time/wall_s"] for r in rows]
    assert walls == sorted(walls) and walls[0] >= 0
    assert all(r["time/steps_per_s"] > 0 for r in rows)


def test_logged_steps_must_increase(tmp_path: Path) -> None:
    with _sinks(tmp_path) as sinks:
        sinks.log(5, _row(5))
        with pytest.raises(ValueError, match="step 5 was already logged"):
            sinks.log(5, _row(5))


def test_cadence_logs_and_evaluates_every_interval_and_the_last_step(tmp_path: Path) -> None:
    with _sinks(tmp_path, eval_every=8) as sinks:
        assert [s for s in range(20) if sinks.should_eval(s)] == [0, 8, 16, 19]
    with _sinks(tmp_path) as sinks:
        assert not any(sinks.should_eval(s) for s in range(20))


def _scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    events = EventAccumulator(str(RunFolder(run_dir).tensorboard))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_tensorboard_events_hold_every_key_as_a_scalar_curve(tmp_path: Path) -> None:
    with _sinks(tmp_path, tensorboard=True) as sinks:
        _train(sinks, 0, 20)
    events = EventAccumulator(str(RunFolder(tmp_path).tensorboard))
    events.Reload()
    rows = _strict(RunFolder(tmp_path).metrics.read_text())
    assert set(events.Tags()["scalars"]) == set(rows[0]) - {"step"}
    for key in ("loss/total", "ci_l0/linear1", "time/wall_s"):
        curve = [(e.step, e.value) for e in events.Scalars(key)]
        expected = [(int(r["step"]), r[key]) for r in rows]
        assert [s for s, _ in curve] == [s for s, _ in expected]
        assert [v for _, v in curve] == pytest.approx([v for _, v in expected], rel=1e-6)


def _open_event_files() -> list[str]:
    fds = Path("/proc/self/fd")
    targets = [os.readlink(fd) for fd in fds.iterdir() if fd.is_symlink()]
    return [t for t in targets if "tfevents" in t]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="lists open files from /proc")
def test_closing_tensorboard_fsyncs_and_closes_even_when_that_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsynced: list[int] = []
    monkeypatch.setattr(os, "fsync", fsynced.append)
    with _sinks(tmp_path, tensorboard=True) as sinks:
        _train(sinks, 0, 20)
    assert len(fsynced) == 1  # 20 steps take less than FLUSH_S: the one fsync is the close's

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    (tmp_path / "full").mkdir()
    sinks = _sinks(tmp_path / "full", tensorboard=True)
    _train(sinks, 0, 20)
    assert len(_open_event_files()) == 1
    with pytest.raises(OSError, match="No space left"):
        sinks.close()
    assert _open_event_files() == []


def test_a_resumed_run_keeps_earlier_rows_and_appends(tmp_path: Path) -> None:
    with _sinks(tmp_path, tensorboard=True) as sinks:
        _train(sinks, 0, 12)  # rows 0, 5, 10; then the run stops, mid-write
    with RunFolder(tmp_path).metrics.open("a") as out:
        out.write('{"step": 11, "loss/to')
    first = _strict(RunFolder(tmp_path).metrics.read_text().rsplit("\n", 1)[0])
    with _sinks(tmp_path, start=8, tensorboard=True) as sinks:  # the checkpoint of step 7
        assert _train(sinks, 8, 20) == [10, 15, 19]
    rows = _strict(RunFolder(tmp_path).metrics.read_text())
    assert [r["step"] for r in rows] == [0, 5, 10, 15, 19]
    assert rows[:2] == first[:2]
    assert rows[2]["time/wall_s"] >= first[1]["time/wall_s"]  # the clock goes on
    # TensorBoard drops the first run's events from the resumed step on: one point per step.
    assert [s for s, _ in _scalars(tmp_path, "loss/total")] == [0, 5, 10, 15, 19]


def test_one_log_line_per_row_without_a_terminal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pd")
    with _sinks(tmp_path) as sinks:
        _train(sinks, 0, 20)
    lines = [r.getMessage() for r in caplog.records if r.name == "pd.train.sinks"]
    assert len(lines) == 5 and lines[1].startswith("step 5/20: loss=0.1667, "), lines
    assert "steps/s, 00:00 elapsed, " in lines[1] and lines[1].endswith(" left")
    assert not lines[0].endswith(" left") and not lines[-1].endswith(" left")  # compiles; done
    caplog.clear()
    with _sinks(tmp_path, interactive=True) as sinks:  # the bar shows the same numbers
        _train(sinks, 0, 20)
    assert not [r for r in caplog.records if r.name == "pd.train.sinks"]


def test_the_bar_shows_on_a_terminal_or_in_a_notebook_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not in_notebook()
    with MetricSinks(tmp_path, 20, log_every=5, tensorboard=False) as sinks:
        assert not sinks.interactive  # pytest captures stderr: no terminal
    kernel = types.ModuleType("IPython")
    shell = types.SimpleNamespace(config={"IPKernelApp": {}})
    kernel.get_ipython = lambda: shell  # type: ignore[attr-defined]  # a module's new attribute
    monkeypatch.setitem(sys.modules, "IPython", kernel)
    assert in_notebook()
    with MetricSinks(tmp_path, 20, log_every=5, tensorboard=False) as sinks:
        assert sinks.interactive


_UNCONFIGURED = """
import logging
from pd.log import show_pd_logs
lib = logging.getLogger("pd.train.run")
show_pd_logs(); show_pd_logs()
lib.info("shown once")
logging.basicConfig(level=logging.WARNING, format="app: %(message)s")  # the app's choice
show_pd_logs()
lib.info("not shown")
lib.warning("warned once")
"""


def test_pd_lines_show_once_from_python_when_logging_is_unconfigured() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _UNCONFIGURED], capture_output=True, text=True, check=True
    )
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[0].endswith("INFO pd.train.run: shown once") and lines[1] == "app: warned once"


def _wandb_records(path: Path) -> Iterator[wandb_internal_pb2.Record]:
    """The records of a `.wandb` file: a 7-byte header, then LevelDB-log chunks (crc32,
    length, type) in 32 KiB blocks, a record split across blocks as first/middle/last."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # full or last
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_wandb_offline_writes_the_rows_into_its_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))  # dir= wins: the run folder
    monkeypatch.setenv("WANDB_API_KEY", "")
    with _sinks(tmp_path, wandb="offline", config={"name": "t", "seed": 3}) as sinks:
        _train(sinks, 0, 20)
    # `finish` returns before W&B's helper process has written everything; it does so at exit.
    wandb.teardown()
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    history: dict[int, dict[str, float]] = {}
    config: dict[str, object] = {}
    for record in _wandb_records(run_file):
        if record.HasField("history"):
            items = {"/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            history[items["_step"]] = items
        if record.HasField("run"):
            config |= {i.key: json.loads(i.value_json) for i in record.run.config.update}
    assert sorted(history) == [0, 5, 10, 15, 19]
    assert history[5]["loss/total"] == pytest.approx(1 / 6) and "time/wall_s" in history[5]
    assert config["seed"] == 3
    assert (tmp_path / "wandb" / "run-id").read_text().strip() in run_file.name
