"""Test setup: pd's pytest plugin, the one downstream projects use (`pd/testing/plugin.py`):
CPU only with 4 simulated devices, jaxtyping + beartype checks of pd at trace time, the `ci`
and `dev` hypothesis profiles and a private target cache.

pd is imported lazily by the tests themselves: the plugin's jaxtyping import hook instruments
only the pd modules imported after it.

Beside the plugin, the session's processes share one persistent compilation cache, a fresh
folder removed at the end (unless `JAX_COMPILATION_CACHE_DIR` is set): the two xdist workers
and the `python -m pd.train` processes tests start compile many of the same programs (a toy
preset's step, evaluation and initializer), and a program is counted in a run's
`compile.json` whether it was compiled or read from the cache. The longest test files are
collected first (`_LONGEST_FIRST`), for the Makefile's two workers.
"""

import os
import shutil
import tempfile

import pytest

pytest_plugins = ["pd.testing.plugin"]

# The files that take a minute or more with `CI=true` (`--durations=0`), longest first. The
# Makefile's workers take whole files in collection order (`--no-loadscope-reorder`), so these
# start first and the run ends on short files: xdist's own order (most tests first) can leave a
# minute-long file to the end of one worker while the other has finished.
_LONGEST_FIRST = (
    "test_sweep.py",
    "test_whole_model.py",
    "test_lm_recipe.py",
    "test_step.py",
    "test_cli_errors.py",
    "test_own_target.py",
    "test_chunkwise.py",
    "test_haiku_target.py",
    "test_run.py",
    "test_resume.py",
    "test_stops.py",
    "test_scan_step.py",
    "test_smollm2.py",
    "test_llama.py",
    "test_convergence.py",
)

_compile_cache = ""
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    # Set before the plugin imports jax (which reads it then); workers and subprocesses inherit it.
    _compile_cache = tempfile.mkdtemp(prefix="pd-test-compile-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _compile_cache
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")


def pytest_unconfigure() -> None:
    if _compile_cache:  # only in the process that made it: the controller, or a lone process
        shutil.rmtree(_compile_cache, ignore_errors=True)


# The files whose tests run pd end to end: a whole decomposition (`run`, a sweep, the CLI in a
# process of its own, the README's blocks) or the real model. Their tests are marked `e2e`;
# `make test-fast` leaves them out.
_END_TO_END = frozenset(
    {
        "test_bad_inputs.py",
        "test_cli_errors.py",
        "test_compile_times.py",
        "test_convergence.py",
        "test_harvest.py",
        "test_library_errors.py",
        "test_lm_recipe.py",
        "test_log.py",
        "test_multiprocess.py",
        "test_own_target.py",
        "test_plugin.py",
        "test_readme.py",
        "test_resume.py",
        "test_run.py",
        "test_run_folder_faults.py",
        "test_rundir.py",
        "test_sinks.py",
        "test_smollm2.py",
        "test_stops.py",
        "test_sweep.py",
        "test_whole_model.py",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files stay whole
    for item in items:
        if item.path.name in _END_TO_END:
            item.add_marker(pytest.mark.e2e)
