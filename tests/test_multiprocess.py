"""§11 D4 across processes: two processes with 2 CPU devices each give the same sharded
initializers and train step as one process with 4 devices (run on localhost)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

WORKER = str(Path(__file__).with_name("multiprocess_worker.py"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _env() -> dict[str, str]:
    keep = ("PATH", "HOME", "PD_CACHE_DIR", "PYTHONPATH")
    return {k: os.environ[k] for k in keep if k in os.environ} | {"JAX_PLATFORMS": "cpu"}


def test_two_processes_match_one(tmp_path: Path) -> None:
    one = tmp_path / "one.npz"
    subprocess.run(
        [sys.executable, WORKER, str(one), "0", "1", "0", "4"], check=True, env=_env(), timeout=300
    )
    two = tmp_path / "two.npz"
    port = str(_free_port())
    procs = [
        subprocess.Popen([sys.executable, WORKER, str(two), str(pid), "2", port, "2"], env=_env())
        for pid in (0, 1)
    ]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    with np.load(one) as a, np.load(two) as b:
        np.testing.assert_array_equal(a["init_V0"], b["init_V0"])  # I1 across processes
        for key in ("V0", "U1", "loss"):
            np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-7)
