"""Logging: configured once, idempotent, never disabling other loggers; jax's compile logs reach
pd's handler (run in a subprocess so the test session's own logging is left alone)."""

import subprocess
import sys

_SCRIPT = """
import logging
import io
other = logging.getLogger("some.library")  # created before setup, as jax's loggers are
theirs = logging.StreamHandler(io.StringIO())  # a handler someone else installed first
logging.getLogger().addHandler(theirs)
from pd.log import setup_logging
setup_logging()
setup_logging()
import jax
jax.jit(lambda x: x * 2)(1.0).block_until_ready()
other.warning("still heard")
handlers = logging.getLogger().handlers
print(sum(h.get_name() == "pd" for h in handlers), other.disabled, theirs in handlers)
print(theirs.stream.getvalue().strip())
"""


def test_jax_compile_logs_reach_the_configured_handler() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        check=True,
        env={"JAX_LOG_COMPILES": "1", "JAX_PLATFORMS": "cpu", "PATH": ""},
    )
    # One handler after two setups; no logger disabled; the earlier handler kept and working.
    lines = proc.stdout.splitlines()
    assert lines[0] == "1 False True" and "still heard" in lines[1:], proc.stdout
    assert "Finished XLA compilation of jit(<lambda>)" in proc.stderr, proc.stderr
