"""Logging: configured once, idempotent, never disabling other loggers; jax's compile logs reach
pd's handler (run in a subprocess so the test session's own logging is left alone)."""

import subprocess
import sys

_SCRIPT = """
import logging
other = logging.getLogger("some.library")  # created before setup, as jax's loggers are
from pd.log import setup_logging
setup_logging()
setup_logging()
import jax
jax.jit(lambda x: x * 2)(1.0).block_until_ready()
print(sum(h.get_name() == "pd" for h in logging.getLogger().handlers), other.disabled)
"""


def test_jax_compile_logs_reach_the_configured_handler() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        check=True,
        env={"JAX_LOG_COMPILES": "1", "JAX_PLATFORMS": "cpu", "PATH": ""},
    )
    assert proc.stdout.split() == ["1", "False"]  # one handler after two setups; none disabled
    assert "Finished XLA compilation of jit(<lambda>)" in proc.stderr, proc.stderr
