"""Compile-time attribution (`pd.compile_times`): a program counts once whether it was compiled or
read from JAX's persistent compilation cache (run in subprocesses with a cache of their own, as
the test session's processes share one)."""

import json
import os
import subprocess
import sys
from pathlib import Path

_SCRIPT = """
import json
import jax
import jax.numpy as jnp
import numpy as np
from pd.compile_times import recording

hits = []
jax.monitoring.register_event_listener(
    lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None
)

def scaled(x):
    return jnp.sin(x) * 3.0 + 1.0

with recording() as times:
    f = jax.jit(scaled)
    # numpy inputs, so that the only programs are these two
    f(np.ones(3, np.float32)).block_until_ready()
    f(np.ones(3, np.float32)).block_until_ready()  # the same program: not counted again
    f(np.ones(4, np.float32)).block_until_ready()  # another shape: a second program
print(json.dumps({**times.by_name["scaled"], "cache_hits": len(hits)}))
"""


def _scaled_row(cache_dir: Path) -> dict[str, float]:
    env = os.environ | {
        "JAX_COMPILATION_CACHE_DIR": str(cache_dir),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, check=True, env=env
    )
    row: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return row


def test_a_program_read_from_the_persistent_cache_still_counts(tmp_path: Path) -> None:
    compiled = _scaled_row(tmp_path)
    read = _scaled_row(tmp_path)  # a second process: both programs come from the cache
    assert compiled["cache_hits"] == 0 and read["cache_hits"] == 2
    for row in (compiled, read):
        assert row["compiles"] == 2 and row["trace_s"] > 0 and row["lower_s"] > 0
        assert row["compile_s"] > 0  # the backend compile, or the read from the cache
