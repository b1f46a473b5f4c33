"""Test setup: pd's pytest plugin, the one downstream projects use (`pd/testing/plugin.py`):
CPU only with 4 simulated devices, jaxtyping + beartype checks of pd at trace time, the `ci`
and `dev` hypothesis profiles and a private target cache.

pd is imported lazily by the tests themselves: the plugin's jaxtyping import hook instruments
only the pd modules imported after it.

Beside the plugin, the session's processes share one persistent compilation cache, a fresh
folder removed at the end (unless `JAX_COMPILATION_CACHE_DIR` is set): the two xdist workers
and the `python -m pd.train` processes tests start compile many of the same programs (a toy
preset's step, evaluation and initializer), and a program is counted in a run's
`compile.json` whether it was compiled or read from the cache.
"""

import os
import shutil
import tempfile

pytest_plugins = ["pd.testing.plugin"]

_compile_cache = ""
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    # Set before the plugin imports jax (which reads it then); workers and subprocesses inherit it.
    _compile_cache = tempfile.mkdtemp(prefix="pd-test-compile-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _compile_cache
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")


def pytest_unconfigure() -> None:
    if _compile_cache:  # only in the process that made it: the controller, or a lone process
        shutil.rmtree(_compile_cache, ignore_errors=True)
