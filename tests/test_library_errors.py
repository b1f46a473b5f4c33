"""A trained decomposition given a bad argument, or `pd.load` given a damaged or unfinished run
folder: one sentence naming the argument, its shape or value and what was expected, before
anything is compiled; numpy inputs work as jax ones do."""

import hashlib
import json
import re
import shlex
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import pd
from pd.train import load_config, run
from pd.train.rundir import partial_dir

TINY = [
    "train.steps=10",
    "train.batch=64",
    "train.log_every=5",
    "train.faith_warmup_steps=2",
    "train.checkpoint_every=5",
    "eval.n_samples=256",
    "eval.batch=128",
    "eval.figures=false",
    "target.train_steps=200",
    "target.train_batch=256",
]
SITES = "linear1, linear2"  # tms_5-2's, C = 20 each

PYTHON = re.escape(shlex.quote(sys.executable))  # the resume commands' interpreter


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "tms"
    run(load_config("tms_5-2", TINY), out)
    return out


@pytest.fixture(scope="module")
def d(run_dir: Path) -> pd.Decomposition:
    return pd.load(run_dir)


@contextmanager
def one_sentence(error: type[Exception], match: str) -> Iterator[None]:
    """Expect `error` with a message matching `match`, on one line."""
    with pytest.raises(error, match=match) as info:
        yield
    assert "\n" not in str(info.value), str(info.value)


def test_an_empty_batch(d: pd.Decomposition) -> None:
    with one_sentence(
        ValueError, r"input x has shape \[0, 5\] of float32, expected \[B, 5\] floats \(B ≥ 1\)"
    ):
        d.ci(jnp.ones((0, 5)))


def test_no_masks(d: pd.Decomposition) -> None:
    with one_sentence(
        ValueError, rf"masks is empty, expected at least one site's mask \(sites: {SITES}\)"
    ):
        d.masked_forward(jnp.ones((4, 5)), {})


def test_a_mask_of_an_unknown_site(d: pd.Decomposition) -> None:
    with one_sentence(KeyError, rf"masks has unknown sites \['nope'\], expected .*\({SITES}\)"):
        d.masked_forward(jnp.ones((4, 5)), {"nope": jnp.ones((4, 20))})


@pytest.mark.parametrize("shape", [(4, 3), (3, 20), (4, 1, 20), (20,)], ids=str)
def test_a_mask_of_the_wrong_shape(d: pd.Decomposition, shape: tuple[int, ...]) -> None:
    given = ", ".join(map(str, shape))
    with one_sentence(
        ValueError,
        rf"mask of site 'linear2' has shape \[{given}\], expected \[4, 20\] like "
        r"ci\(x\)\['linear2'\] \(x's batch axes, then C = 20 for that site\)",
    ):
        d.masked_forward(
            jnp.ones((4, 5)), {"linear1": jnp.ones((4, 20)), "linear2": jnp.ones(shape)}
        )


def test_numpy_inputs_give_what_jax_inputs_give(d: pd.Decomposition) -> None:
    x = d.batch(3)[:8]
    x_np = np.asarray(x)
    masks = {"linear1": jnp.full((8, 20), 0.5)}
    masks_np = {"linear1": np.full((8, 20), 0.5)}  # float64, as numpy makes it
    for site in d.sites:
        np.testing.assert_array_equal(np.asarray(d.ci(x_np)[site]), np.asarray(d.ci(x)[site]))
    np.testing.assert_array_equal(np.asarray(d.clean(x_np)), np.asarray(d.clean(x)))
    np.testing.assert_array_equal(
        np.asarray(d.masked_forward(x_np, masks_np, delta=1.0)),
        np.asarray(d.masked_forward(x, masks, delta=1.0)),
    )
    np.testing.assert_array_equal(
        np.asarray(d.ablate(x_np, "linear1", [2])), np.asarray(d.ablate(x, "linear1", [2]))
    )
    with one_sentence(ValueError, r"input x has shape \[8, 4\] of float32, expected \[B, 5\]"):
        d.ci(x_np[:, :4])


@pytest.mark.parametrize(
    ("step", "evaluation"), [(-1, False), (2**31 - 1, True), (2**31, False)], ids=str
)
def test_a_step_out_of_range(d: pd.Decomposition, step: int, evaluation: bool) -> None:
    with one_sentence(ValueError, rf"step is {step}, expected an int in \[0, 2147483647\)"):
        d.batch(step, evaluation=evaluation)


def test_a_step_that_is_not_an_int(d: pd.Decomposition) -> None:
    # A bool passes the signature (it is an int to Python); a float is refused the same way
    # where no runtime type checker is installed (the test plugin's refuses it first).
    with one_sentence(TypeError, r"step True is a bool, expected an int in \[0, 2147483647\)"):
        d.batch(True)


def test_ablate_an_unknown_site_or_subcomponent(d: pd.Decomposition) -> None:
    x = jnp.ones((4, 5))
    with one_sentence(
        KeyError, rf"site 'nope' is not in the decomposition, expected one of its sites \({SITES}\)"
    ):
        d.ablate(x, "nope", [0])
    with one_sentence(
        KeyError,
        r"subcomponent 20 is not in the decomposition, expected indices in \[0, 20\) for site "
        "'linear1'",
    ):
        d.ablate(x, "linear1", [3, 20])


def _damaged_copy(run_dir: Path, to: Path, name: str, payload: bytes) -> Path:
    """A copy of the run folder with `name` replaced by `payload`, its recorded sha256 updated
    (so only the file's contents are wrong)."""
    shutil.copytree(run_dir, to)
    (to / name).write_bytes(payload)
    meta_path = (to / name).with_suffix(".json")
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps(meta | {"sha256": hashlib.sha256(payload).hexdigest()}))
    return to


@pytest.mark.parametrize(
    ("name", "what"), [("frozen.npz", "frozen-target file"), ("decomposition.npz", "checkpoint")]
)
@pytest.mark.parametrize("damage", ["truncated", "not_a_zip"])
def test_load_a_damaged_file_with_a_matching_sha256(
    run_dir: Path, tmp_path: Path, name: str, what: str, damage: str
) -> None:
    whole = (run_dir / name).read_bytes()
    payload = whole[: len(whole) // 2] if damage == "truncated" else b"not an npz archive"
    broken = _damaged_copy(run_dir, tmp_path / "broken", name, payload)
    with one_sentence(
        ValueError,
        rf"{what} '{re.escape(str(broken / name))}' is damaged or not a pd file \(.+\), "
        r"expected the \.npz archive pd wrote",
    ):
        pd.load(broken)


def _interrupted(run_dir: Path, partial: Path) -> None:
    """What an interrupted run leaves: its config and checkpoints, no decomposition."""
    partial.mkdir()
    shutil.copy(run_dir / "config.json", partial)
    shutil.copytree(run_dir / "checkpoints", partial / "checkpoints")


@pytest.mark.parametrize("name", [".tms.partial", "renamed"])
def test_load_a_partial_folder(run_dir: Path, tmp_path: Path, name: str) -> None:
    partial = tmp_path / name
    _interrupted(run_dir, partial)
    finished = tmp_path / "tms" if name == ".tms.partial" else partial
    with one_sentence(
        FileNotFoundError,
        rf"run folder '{re.escape(str(partial))}' has not finished \(checkpoint at step 10, no "
        r"decomposition\.npz\), expected a finished run folder: continue it with "
        rf"`{PYTHON} -m pd\.train CONFIG --out {re.escape(str(finished))} --resume`",
    ):
        pd.load(partial)


def test_load_a_run_folder_whose_run_has_not_finished(run_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "tms"
    _interrupted(run_dir, partial_dir(folder))
    with one_sentence(
        FileNotFoundError,
        rf"run folder '{re.escape(str(folder))}' has not finished \(its run is in "
        rf"'{re.escape(str(partial_dir(folder)))}', "
        r"checkpoint at step 10, no decomposition\.npz\), expected a finished run folder: "
        rf"continue it with `{PYTHON} -m pd\.train CONFIG --out {re.escape(str(folder))} --resume`",
    ):
        pd.load(folder)
    shutil.rmtree(partial_dir(folder) / "checkpoints")
    with one_sentence(FileNotFoundError, r"no checkpoint yet, .* run it again, or wait for it"):
        pd.load(folder)
