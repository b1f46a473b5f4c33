"""pd's pytest plugin (`pd.testing.plugin`) in a session of its own: the private target cache it
makes is gone when the session ends, and a `PD_CACHE_DIR` the caller set is used and kept."""

import os
import subprocess
import sys
from pathlib import Path

# A downstream test that records the cache folder and writes into it, as a trained target would.
TEST = """
import os
from pathlib import Path


def test_writes_into_the_cache() -> None:
    folder = Path(os.environ["PD_CACHE_DIR"])
    (folder / "target.npz").write_bytes(b"weights")
    Path(os.environ["SEEN"]).write_text(str(folder))
"""


def _session(tmp_path: Path, cache: Path | None) -> Path:
    """Run the test above under the plugin; the cache folder it saw."""
    (tmp_path / "test_downstream_cache.py").write_text(TEST)
    seen = tmp_path / "seen.txt"
    env = {k: v for k, v in os.environ.items() if k != "PD_CACHE_DIR"}
    env |= {"SEEN": str(seen)} | ({} if cache is None else {"PD_CACHE_DIR": str(cache)})
    plugins = ["-p", "pd.testing.plugin", "-p", "no:cacheprovider", "-p", "no:xdist"]
    argv = [sys.executable, "-m", "pytest", "-q", *plugins, str(tmp_path)]
    done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    return Path(seen.read_text())


def test_the_private_target_cache_is_removed_when_the_session_ends(tmp_path: Path) -> None:
    folder = _session(tmp_path, None)
    assert folder.name.startswith("pd-test-cache-")
    assert not folder.exists()


def test_a_target_cache_the_caller_set_is_kept(tmp_path: Path) -> None:
    cache = tmp_path / "my-cache"
    cache.mkdir()
    assert _session(tmp_path, cache) == cache
    assert (cache / "target.npz").read_bytes() == b"weights"
