"""Ctrl-C and SIGTERM during training: the step in flight finishes, then the loop stops.

JAX donates the state's buffers to the next step, so a state is only whole between steps: a
signal that unwound from the middle of one could leave nothing valid to save. While training,
SIGINT and SIGTERM are therefore recorded, and the loop asks after each step; a second signal
stops at once.
"""

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType


class Terminated(BaseException):
    """SIGTERM (a scheduler's stop), raised so that a run unwinds as it does on Ctrl-C."""


def raise_terminated(signum: int, frame: FrameType | None) -> None:
    """A SIGTERM handler for the CLI, outside the training loop."""
    raise Terminated


def _exception(signum: int) -> BaseException:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextmanager
def deferred() -> Iterator[Callable[[], BaseException | None]]:
    """Yield `pending()`: the stop requested by a signal since entering, if any. Off the main
    thread (where Python delivers no signals) nothing is ever pending."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    requested: list[BaseException] = []

    def record(signum: int, frame: FrameType | None) -> None:
        if requested:  # asked twice: stop now
            raise _exception(signum)
        requested.append(_exception(signum))

    previous = {s: signal.signal(s, record) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield lambda: requested[0] if requested else None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
