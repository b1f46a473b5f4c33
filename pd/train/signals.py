"""Ctrl-C and SIGTERM while a run holds state that a signal must not cut.

JAX donates the state's buffers to the next step, and orbax writes a checkpoint from background
threads, so a state is only whole between steps and a checkpoint only once its write has
finished: a signal that unwound from the middle of either could leave nothing valid to keep.
Inside `deferred()` the first two signals are therefore recorded (the loop asks after each call
and stops with a checkpoint; a second signal, usually sent while that checkpoint is written,
waits for it too), and the third stops at once.
"""

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

log = logging.getLogger(__name__)

AT_ONCE = 3  # the signal that stops without waiting


class Terminated(BaseException):
    """SIGTERM (a scheduler's stop), raised so that a run unwinds as it does on Ctrl-C."""


def raise_terminated(signum: int, frame: FrameType | None) -> None:
    """A SIGTERM handler for the CLI, outside the training loop."""
    raise Terminated


@contextmanager
def stops_raise() -> Iterator[None]:
    """The commands' handlers inside the block: SIGTERM (a scheduler's stop) unwinds as
    `Terminated`, like Ctrl-C, and SIGINT raises KeyboardInterrupt even where the shell started
    pd with it ignored (a background job of a script), so that `kill -INT` stops it too. Enter
    it once the JAX backend has started: starting it replaces an earlier handler."""
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


def stopped(err: KeyboardInterrupt | Terminated) -> tuple[str, int]:
    """How a command was stopped, for its error line, and its exit status (128 + the signal)."""
    return ("by SIGTERM", 143) if isinstance(err, Terminated) else ("by Ctrl-C", 130)


def _exception(signum: int) -> BaseException:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


Pending = Callable[[], BaseException | None]  # the stop requested so far, if any


@contextmanager
def deferred() -> Iterator[Pending]:
    """Yield `pending()`: the stop requested by a signal since entering, if any. The first two
    signals are recorded and logged; the third raises where the program is. Off the main thread
    (where Python delivers no signals) nothing is ever pending."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    requested: list[BaseException] = []

    def record(signum: int, frame: FrameType | None) -> None:
        requested.append(_exception(signum))
        if len(requested) >= AT_ONCE:
            raise requested[-1]
        more = "twice more" if len(requested) == 1 else "once more"
        log.warning(
            "stopping after the step in flight, with a checkpoint (signal %s to stop at once, "
            "losing the steps since the last checkpoint)",
            more,
        )

    previous = {s: signal.signal(s, record) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield lambda: requested[0] if requested else None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
