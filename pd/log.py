"""Logging setup for entry points: once, idempotent, never silencing other libraries' loggers."""

import logging
import sys
from typing import TextIO

_HANDLER_NAME = "pd"


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
    root = logging.getLogger()
    if any(h.get_name() == _HANDLER_NAME for h in root.handlers):
        return
    handler = StderrHandler()
    handler.set_name(_HANDLER_NAME)
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("jax").setLevel(logging.WARNING)
