"""Logging setup for entry points: once, idempotent, never silencing other libraries' loggers;
and, for pd used from Python with logging left unconfigured, a fallback that shows pd's lines."""

import logging
import sys
from typing import TextIO

_HANDLER_NAME = "pd"
_FALLBACK_NAME = "pd-fallback"
_FALLBACK_SET_LEVEL = "pd-fallback-set-level"  # the fallback that also set the `pd` level


class StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to whatever `sys.stderr` is when a record arrives: test runners and notebooks swap
    the stream, and a handler holding a closed one would fail at exit."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)

    def flush(self) -> None:
        self.stream = sys.stderr
        super().flush()


def setup_logging(level: int = logging.INFO) -> None:
    """Attach one stderr handler to the root logger (again: no-op); jax's loggers keep working.

    The handler is added, not configured through `logging.config.dictConfig`: that call closes
    every existing handler (a test runner's or a notebook's) and, by default, disables every
    logger created so far, jax's included.
    """
    _drop_fallback()
    root = logging.getLogger()
    if any(h.get_name() == _HANDLER_NAME for h in root.handlers):
        return
    root.addHandler(_handler(_HANDLER_NAME, level))
    root.setLevel(level)
    logging.getLogger("jax").setLevel(logging.WARNING)
    logging.getLogger("absl").setLevel(logging.WARNING)  # orbax's per-save INFO records


def show_pd_logs(level: int = logging.INFO) -> None:
    """Make pd's records at `level` and above reach stderr when no handler would show them.

    For library entry points (`pd.train.run`): a script or notebook that configured no logging
    gets pd's progress lines once, from a handler on the `pd` logger alone. Where a handler
    exists on `pd` or above it (the application's own, a test runner's), pd's records just
    propagate to it at the level the application chose; a fallback added by an earlier call
    is removed again, so no line is shown twice.
    """
    _drop_fallback()
    pd_logger = logging.getLogger("pd")
    if pd_logger.hasHandlers():
        return
    fallback = _handler(_FALLBACK_NAME, level)
    if pd_logger.level == logging.NOTSET:  # a level the application set stays
        pd_logger.setLevel(level)
        fallback.set_name(_FALLBACK_SET_LEVEL)
    pd_logger.addHandler(fallback)


def _handler(name: str, level: int) -> StderrHandler:
    handler = StderrHandler()
    handler.set_name(name)
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    return handler


def _drop_fallback() -> None:
    """Remove `show_pd_logs`' handler, and the level it set, from the `pd` logger."""
    pd_logger = logging.getLogger("pd")
    for handler in list(pd_logger.handlers):
        if handler.get_name() in (_FALLBACK_NAME, _FALLBACK_SET_LEVEL):
            pd_logger.removeHandler(handler)
        if handler.get_name() == _FALLBACK_SET_LEVEL:
            pd_logger.setLevel(logging.NOTSET)
