"""Bad input found by constructing the config (or reading its file, or before a run starts its
sinks) rather than after compiling: integers beyond what jax and XLA take, a batch that does not
split over the mesh's data axis, W&B online without a login, and a config path that is not a
regular file. Each is one sentence, from the command line and from Python alike."""

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
import pytest
from test_cli_errors import _fails

from pd.targets.configs import LlamaConfig, TMSConfig
from pd.train.config import (
    MAX_CONFIG_BYTES,
    ConfigError,
    EvalConfig,
    MeshConfig,
    RunConfig,
    TrainConfig,
    load_config,
)
from pd.train.sinks import check_wandb_login


def test_integers_beyond_int32_and_seeds_beyond_32_bits_are_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Sizes are int32 in XLA; a seed keeps 32 bits in `jax.random.key` with x64 off."""
    big = "100000000000000000000"
    says = f"config key 'C' is {big}, expected an integer in [1, 2**31 - 1]"
    _fails(["tms_5-2", "--set", f"C={big}"], capsys, tmp_path / "run", says)
    seed = "99999999999999999999"
    says = f"config key 'seed' is {seed}, expected an integer in [0, 2**32 - 1]"
    _fails(["tms_5-2", "--set", f"seed={seed}"], capsys, tmp_path / "run", says)
    assert not (tmp_path / "run").exists()
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: RunConfig(C=2**31), r"^config key 'C' is 2147483648, expected an integer in \[1,"),
        (lambda: RunConfig(ci_hidden=(16, 2**31)), r"^config key 'ci_hidden\[1\]' is 2147483648"),
        (lambda: TrainConfig(steps=2**31), r"'steps' is 2147483648, .* \[1, 2\*\*31 - 1\]$"),
        (lambda: RunConfig(seed=2**32), r"'seed' is 4294967296, .* \[0, 2\*\*32 - 1\]$"),
        (lambda: TMSConfig(seed=2**32), r"'seed' is 4294967296, .* \[0, 2\*\*32 - 1\]$"),
    ]
    for construct, pattern in cases:
        with pytest.raises(ConfigError, match=pattern):
            construct()
    assert RunConfig(C=2**31 - 1, seed=2**32 - 1).seed == 2**32 - 1
    # Why seeds stop there: with x64 off, seed 2**32 would silently be seed 0.
    key_data = jax.random.key_data
    assert (key_data(jax.random.key(2**32)) == key_data(jax.random.key(0))).all()


def test_a_batch_must_split_evenly_over_the_data_axis(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    says = (
        "config key 'train.batch' is 1023, expected a multiple of mesh.data = 2 (each "
        "data-parallel device takes an equal share)"
    )
    argv = ["tms_5-2", "--set", "mesh.data=2", "--set", "train.batch=1023"]
    _fails(argv, capsys, tmp_path / "run", says)
    with pytest.raises(
        ConfigError, match=r"^config key 'train.batch' is 1023, expected a multiple"
    ):
        RunConfig(mesh=MeshConfig(data=2), train=TrainConfig(batch=1023))
    # A language model's evaluation batches are placed on the mesh too; a toy's are drawn
    # inside its evaluation program, whatever the mesh.
    mesh, train, evaluation = MeshConfig(data=3), TrainConfig(batch=33), EvalConfig(batch=10000)
    with pytest.raises(ConfigError, match=r"^config key 'eval.batch' is 10000, .* mesh.data = 3"):
        RunConfig(target=LlamaConfig(), train=train, eval=evaluation, mesh=mesh)
    toy = RunConfig(target=TMSConfig(), train=train, eval=evaluation, mesh=mesh)
    assert toy.mesh.data == 3


@pytest.fixture
def no_wandb_login(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No W&B login anywhere wandb looks: no key in the environment, an empty home (no .netrc,
    no settings), a fresh wandb session before and after."""
    import wandb

    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_CONFIG_DIR", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)  # no workspace settings (./wandb/settings)
    wandb.teardown()
    yield
    wandb.teardown()


@pytest.mark.usefixtures("no_wandb_login")
def test_wandb_online_needs_a_login_found_without_the_network(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigError) as err:
        check_wandb_login("online")
    assert str(err.value) == (
        "config key 'train.wandb' is 'online' but no W&B login was found, expected `wandb "
        "login` (or WANDB_API_KEY) first, or 'offline'"
    )
    check_wandb_login("offline")  # needs no login
    check_wandb_login("off")
    monkeypatch.setenv("WANDB_API_KEY", "short")
    with pytest.raises(ConfigError, match=r"^config key 'train.wandb' is 'online' but the W&B "):
        check_wandb_login("online")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)  # the form of a key; nothing asks the server
    check_wandb_login("online")


@pytest.mark.usefixtures("no_wandb_login")
def test_a_netrc_entry_is_a_wandb_login() -> None:
    netrc = Path(os.environ["HOME"]) / ".netrc"
    netrc.write_text(f"machine api.wandb.ai\n  login user\n  password {'k' * 40}\n")
    netrc.chmod(0o600)
    check_wandb_login("online")


def test_wandb_not_installed_is_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "wandb" or m.startswith("wandb.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "wandb", None)
    for mode in ("offline", "online"):
        with pytest.raises(ConfigError) as err:
            check_wandb_login(mode)
        assert str(err.value) == (
            f"config key 'train.wandb' is '{mode}' but wandb is not installed, expected "
            "`pip install pd[wandb]` first, or 'off'"
        )
    check_wandb_login("off")


def test_a_config_path_that_is_not_a_regular_file_is_refused_unread(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A device is not read (it may never end), nor a FIFO opened (it would wait for a
    writer), nor a file larger than 1 MiB read past that."""
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(tmp_path)):
        says = f"config file '{path}' is not a regular file, expected a .toml file"
        _fails([path], capsys, tmp_path / "run", says)
    # In a process of its own: were the FIFO opened, that process would wait for a writer.
    command = [sys.executable, "-m", "pd.train", str(fifo), "--out", str(tmp_path / "run")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    says = f"error: config file '{fifo}' is not a regular file, expected a .toml file"
    assert done.stderr.strip() == says
    big = tmp_path / "big.toml"
    big.write_text("#" * (MAX_CONFIG_BYTES + 1))
    says = f"config file '{big}' is larger than 1 MiB, expected a .toml file of at most 1 MiB"
    _fails([str(big)], capsys, tmp_path / "run", says)
    big.write_text("#" * MAX_CONFIG_BYTES)
    assert load_config(str(big)) == RunConfig(name="big")
    assert not (tmp_path / "run").exists()
