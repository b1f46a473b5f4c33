"""Logging setup for entry points: once, idempotent, never silencing other libraries' loggers."""

import logging
import logging.config

_HANDLER_NAME = "pd"


def setup_logging(level: int = logging.INFO) -> None:
    """Attach one stderr handler to the root logger (again: no-op); jax's loggers keep working."""
    root = logging.getLogger()
    if any(h.get_name() == _HANDLER_NAME for h in root.handlers):
        return
    logging.config.dictConfig(
        {
            "version": 1,
            # dictConfig's default True disables every logger created so far, jax's included.
            "disable_existing_loggers": False,
            "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
            "handlers": {
                _HANDLER_NAME: {
                    "class": "logging.StreamHandler",
                    "formatter": "plain",
                    "level": level,
                }
            },
            "root": {"handlers": [_HANDLER_NAME], "level": level},
        }
    )
    logging.getLogger("jax").setLevel(logging.WARNING)
