"""§11 D4 across processes: two processes with 2 CPU devices each give the same sharded
initializers and train step as one process with 4 devices (run on localhost), on a (data, model)
= (2, 2) mesh whose model axis spans the processes (each places the whole batch); issue 11: they
save one orbax checkpoint whose arrays span both processes and restore it (checked by the
workers), and it restores on one device here too; process 0 writes the decomposition file."""

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np

WORKER = str(Path(__file__).with_name("multiprocess_worker.py"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _overrides() -> list[str]:
    """The worker's config overrides (the worker is a script, not an importable module)."""
    spec = importlib.util.spec_from_file_location("multiprocess_worker", WORKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    overrides: list[str] = module.OVERRIDES
    return overrides


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

    # The checkpoint the two processes wrote, restored in this one process on one device.
    from pd.train import arrays
    from pd.train.checkpoints import Checkpoints
    from pd.train.config import load_config
    from pd.train.placement import ONE_DEVICE
    from pd.train.run import make_recipe

    recipe = make_recipe(load_config("resid_mlp1", _overrides()))
    like = ONE_DEVICE.abstract_state(recipe)
    checkpoints = Checkpoints(two.with_suffix(".ckpt"), keep=1)
    try:
        state = checkpoints.restore_latest(like)  # its seal checked first
    finally:
        checkpoints.close()
    assert state is not None and int(state.step) == 1
    with np.load(two) as b:  # the whole state the workers saved, gathered
        for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
            np.testing.assert_array_equal(leaf, b[f"state{jax.tree_util.keystr(path)}"])
    # The decomposition file process 0 wrote from the gathered arrays.
    decomposition = two.with_suffix(".decomposition.npz")
    trained = arrays.load(decomposition, (like.components, like.ci_params))
    jax.tree.map(np.testing.assert_array_equal, trained, (state.components, state.ci_params))
