"""Where a run's metrics go while it trains: metrics.jsonl, TensorBoard, Weights & Biases, a
progress bar, and one log line per logged step when no bar is shown."""

import json
import logging
import os
import socket
import sys
import time
from collections.abc import Mapping
from contextlib import ExitStack, suppress
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal, Protocol, TextIO

from tqdm.auto import tqdm

from pd.train.folder import RunFolder
from pd.validate import ConfigError

if TYPE_CHECKING:
    from tensorboardX.proto.event_pb2 import Event
    from wandb import Run as WandbRun

log = logging.getLogger(__name__)

WandbMode = Literal["off", "offline", "online"]
WANDB_ID_FILE = "wandb/run-id"  # beside wandb's own files; a resumed run continues that W&B run


def check_wandb_login(mode: WandbMode) -> None:
    """A ConfigError unless this machine can start W&B in `mode` (`train.wandb`): any mode but
    "off" needs wandb installed, and "online" a login, found where `wandb.init` looks for one
    (this session's, WANDB_API_KEY or WANDB_IDENTITY_TOKEN_FILE, a .netrc entry for the W&B
    host, wandb's settings files) without a prompt or the network."""
    if mode == "off":
        return
    try:
        from wandb.errors import AuthenticationError
        from wandb.sdk import wandb_setup
        from wandb.sdk.lib import wbauth
    except ImportError:
        raise ConfigError(
            f"config key 'train.wandb' is {mode!r} but wandb is not installed, expected "
            "`pip install pd[wandb]` first, or 'off'"
        ) from None
    if mode == "offline":
        return
    settings = wandb_setup.singleton().settings
    host = wbauth.HostUrl(settings.base_url, app_url=settings.app_url)
    try:
        login = wbauth.authenticate_session(host=host, source="pd", prompt=False)
    except AuthenticationError as err:  # a key of the wrong form, found before any request
        raise ConfigError(
            "config key 'train.wandb' is 'online' but the W&B login found is not valid "
            f"({str(err).rstrip('.')}), expected `wandb login` (or WANDB_API_KEY) with a valid "
            "key first, or 'offline'"
        ) from None
    if login is None:
        raise ConfigError(
            "config key 'train.wandb' is 'online' but no W&B login was found, expected "
            "`wandb login` (or WANDB_API_KEY) first, or 'offline'"
        )


class _Bar(Protocol):
    """The part of a tqdm bar used here (tqdm ships no types)."""

    def update(self, n: int) -> object: ...

    def set_postfix_str(self, s: str, refresh: bool) -> None: ...

    def close(self) -> None: ...


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (where tqdm.auto draws a widget)."""
    ipython = sys.modules.get("IPython")
    shell = None if ipython is None else ipython.get_ipython()
    return shell is not None and bool("IPKernelApp" in shell.config)


class _TensorBoard:
    """An event file in `logdir` that TensorBoard reads, one event per row, written in the
    caller's thread.

    tensorboardX's `FileWriter` writes from a thread of its own, where a failed write (a full
    disk) is a traceback printed by a thread that then dies; here it is raised to the run,
    which says what happened in one sentence. One `Summary` holds a row's scalars, one value
    per key. The file is flushed to disk (an fsync) at most every `FLUSH_S` seconds, and when
    closed.
    """

    FLUSH_S = 10.0

    def __init__(self, logdir: Path, start_step: int) -> None:
        from tensorboardX.proto.event_pb2 import Event, SessionLog  # ~0.2 s, only when asked for
        from tensorboardX.proto.summary_pb2 import Summary
        from tensorboardX.record_writer import RecordWriter

        self._event, self._summary, self._value = Event, Summary, Summary.Value
        logdir.mkdir(parents=True, exist_ok=True)
        # tensorboardX's name; the suffix keeps two writers started within one second (a quick
        # resume) apart.
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
        self._records = RecordWriter(str(logdir / f"{name}.from-{start_step:010d}"))
        self._flushed = time.monotonic()
        # TensorBoard hides earlier files' events from this step on: a resumed run's repeats.
        self._put(Event(step=start_step, file_version="brain.Event:2"))
        self._put(Event(step=start_step, session_log=SessionLog(status=SessionLog.START)))

    def _put(self, event: "Event") -> None:
        event.wall_time = time.time()
        self._records.write(event.SerializeToString())
        if time.monotonic() - self._flushed >= self.FLUSH_S:
            self._records.flush()
            self._flushed = time.monotonic()

    def write(self, step: int, row: Mapping[str, float]) -> None:
        """Write one event holding every key of `row` as a scalar at `step`."""
        values = [self._value(tag=key, simple_value=value) for key, value in row.items()]
        self._put(self._event(step=step, summary=self._summary(value=values)))

    def close(self) -> None:
        """Write what is buffered to disk (an fsync) and close the file, closed even when that
        write fails."""
        try:
            self._records.flush()
        finally:
            self._records.close()


def _open_metrics(path: Path, start_step: int) -> tuple[TextIO, float]:
    """metrics.jsonl open for appending, holding the earlier rows before `start_step` (none for
    a new run), and the wall time those rows reach.

    A line that does not parse (the half-written last row of an interrupted run) is dropped.
    The kept rows replace the file in one rename: a crash here loses nothing.
    """
    kept, wall, unreadable = [], 0.0, 0
    lines = path.read_text().splitlines() if start_step > 0 and path.is_file() else []
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            unreadable += 1
            continue
        if row["step"] < start_step:
            kept.append(line)
            wall = float(row.get("time/wall_s", wall))
    if unreadable:
        log.warning("%s: dropped %d unreadable line(s) on resuming", path, unreadable)
    staging = path.with_name(path.name + ".tmp")
    staging.write_text("".join(line + "\n" for line in kept))
    os.replace(staging, path)
    return path.open("a"), wall


class MetricSinks:
    """Sends each logged row to every sink: a context manager, one instance per run.

    Rows are strict JSON lines in `run_dir/metrics.jsonl`, with `time/wall_s` (since the run
    started, across resumes) and `time/steps_per_s` (over the interval since the previous row)
    added; TensorBoard scalars (one tag per key) in `run_dir/tensorboard`; optionally a W&B run
    in `run_dir/wandb`. A run resumed at `start_step` keeps the earlier rows before that step and
    appends; TensorBoard is told to discard its events from that step on.

    The bar (`tqdm.auto`) shows on a terminal or in a notebook; elsewhere (a script piped to a
    file, a batch job) each row is one INFO line on this module's logger instead.
    """

    def __init__(
        self,
        run_dir: Path,
        total_steps: int,
        *,
        log_every: int,
        eval_every: int = 0,
        start_step: int = 0,
        tensorboard: bool = True,
        wandb: WandbMode = "off",
        wandb_project: str = "pd",
        run_name: str | None = None,
        config: Mapping[str, object] | None = None,
        interactive: bool | None = None,
    ) -> None:
        if log_every < 1 or eval_every < 0 or not 0 <= start_step <= total_steps:
            raise ValueError(
                f"MetricSinks got log_every={log_every}, eval_every={eval_every}, "
                f"start_step={start_step}, total_steps={total_steps}; expected log_every >= 1, "
                "eval_every >= 0 (0: never) and 0 <= start_step <= total_steps"
            )
        self.total_steps, self.log_every, self.eval_every = total_steps, log_every, eval_every
        self._wandb: WandbRun | None = None
        if wandb != "off":  # first: the one most likely to fail (a missing W&B login)
            self._start_wandb(run_dir, wandb, wandb_project, run_name, config, start_step)
        self._out, wall_before = _open_metrics(RunFolder(run_dir).metrics, start_step)
        self._t0 = time.perf_counter() - wall_before
        self._start_step = start_step
        self._last = (start_step, time.perf_counter())  # (steps done, when)
        self._tensorboard = (
            _TensorBoard(RunFolder(run_dir).tensorboard, start_step) if tensorboard else None
        )
        self.interactive = (
            (sys.stderr.isatty() or in_notebook()) if interactive is None else interactive
        )
        self._bar: _Bar = tqdm(
            total=total_steps,
            initial=start_step,
            disable=not self.interactive,
            desc="train",
            unit="step",
            dynamic_ncols=True,
        )

    def _start_wandb(
        self,
        run_dir: Path,
        mode: Literal["offline", "online"],
        project: str,
        name: str | None,
        config: Mapping[str, object] | None,
        start_step: int,
    ) -> None:
        """Start a W&B run writing under `run_dir/wandb`; a resumed run continues its own."""
        import wandb  # ~1.4 s import and a helper process: only when asked for

        id_file = run_dir / WANDB_ID_FILE
        run_id = id_file.read_text().strip() if start_step > 0 and id_file.is_file() else None
        id_file.parent.mkdir(parents=True, exist_ok=True)
        self._wandb = wandb.init(
            project=project,
            name=name,
            dir=run_dir,
            id=run_id,
            resume="allow",
            mode=mode,
            config=dict(config) if config is not None else None,
            settings=wandb.Settings(console="off"),  # the bar and the log stay pd's own
        )
        id_file.write_text(self._wandb.id + "\n")

    def should_log(self, step: int) -> bool:
        """Whether `step` (0-based, just taken) is logged: every `log_every`, and the last."""
        return step % self.log_every == 0 or step == self.total_steps - 1

    def should_eval(self, step: int) -> bool:
        """Whether `step` is evaluated: every `eval_every` (0: never), and the last."""
        return self.eval_every > 0 and (step % self.eval_every == 0 or step == self.total_steps - 1)

    def next_logged(self, step: int) -> int:
        """The first step from `step` on that is logged or evaluated."""
        every = [self.log_every] + ([self.eval_every] if self.eval_every > 0 else [])
        return min(self.total_steps - 1, *(-(-step // e) * e for e in every))

    def log(self, step: int, row: Mapping[str, float]) -> dict[str, float]:
        """Write one row for `step` (just taken) to every sink; returns it with its time keys.

        One call per logged step, steps increasing: merge an evaluation's metrics into that
        step's row. Values must be finite (the row is strict JSON).
        """
        done, before = self._last
        if step < done:
            raise ValueError(f"step {step} was already logged (steps must increase)")
        now = time.perf_counter()
        elapsed = now - before
        timed = {
            **row,
            "time/wall_s": now - self._t0,
            "time/steps_per_s": (step + 1 - done) / elapsed if elapsed > 0 else 0.0,
        }
        self._last = (step + 1, now)
        self._out.write(json.dumps({"step": step, **timed}, allow_nan=False) + "\n")
        self._out.flush()  # readable while the run goes on
        if self._tensorboard is not None:
            self._tensorboard.write(step, timed)
        if self._wandb is not None:
            self._wandb.log(timed, step=step)
        # The first interval holds the compiles: its speed says nothing about the time left.
        summary = _summary(step, self.total_steps, timed, eta=done > self._start_step)
        if self.interactive:
            self._bar.set_postfix_str(summary, refresh=False)
        else:
            log.info("step %d/%d: %s", step, self.total_steps, summary)
        return timed

    def advance(self, n: int = 1) -> None:
        """Move the progress bar by `n` steps."""
        self._bar.update(n)

    def close(self, failed: bool = False) -> None:
        """Flush and close every sink (again: no-op), each even when another's close raised.
        Closing after a failure (`failed`), a sink that cannot write (a full disk) is closed
        as far as it can be, and the failure stays the one raised."""
        with ExitStack() as closing:
            if failed:
                closing.enter_context(suppress(OSError))
            closing.callback(self._bar.close)
            if not self._out.closed:
                closing.callback(self._out.close)
            if self._tensorboard is not None:
                closing.callback(self._tensorboard.close)
                self._tensorboard = None
            if self._wandb is not None:
                closing.callback(self._wandb.finish, exit_code=1 if failed else 0)
                self._wandb = None

    def __enter__(self) -> "MetricSinks":
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(failed=exc_type is not None)


def _summary(step: int, total: int, row: Mapping[str, float], eta: bool) -> str:
    """The few numbers a person watches: the total loss, the speed, the time spent and left."""
    speed = row["time/steps_per_s"]
    parts = [f"loss={row['loss/total']:.4g}"] if "loss/total" in row else []
    parts.append(f"{speed:.3g} steps/s" if speed < 1000 else f"{speed:.0f} steps/s")
    parts.append(f"{_clock(row['time/wall_s'])} elapsed")
    if eta and speed > 0 and step + 1 < total:
        parts.append(f"{_clock((total - step - 1) / speed)} left")
    return ", ".join(parts)


def _clock(seconds: float) -> str:
    """`seconds` as [h:]mm:ss."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


__all__ = [
    "MetricSinks",
    "WandbMode",
    "check_wandb_login",
    "in_notebook",
]
