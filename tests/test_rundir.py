"""Run folders appear whole or not at all; `--overwrite` replaces only a finished pd run."""

from pathlib import Path

import pytest

from pd.train.config import ConfigError
from pd.train.rundir import MARKER, staged


def _finished_run(run_dir: Path, text: str) -> None:
    with staged(run_dir, overwrite=False) as tmp:
        (tmp / "summary.json").write_text(text)


def test_a_finished_run_appears_with_its_marker_and_no_temporary_siblings(tmp_path: Path) -> None:
    _finished_run(tmp_path / "r", "old")
    assert (tmp_path / "r" / "summary.json").read_text() == "old"
    assert (tmp_path / "r" / MARKER).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_overwrite_replaces_the_old_run_only_once_the_new_one_is_complete(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    _finished_run(run_dir, "old")
    with staged(run_dir, overwrite=True) as tmp:
        (tmp / "summary.json").write_text("new")
        assert (run_dir / "summary.json").read_text() == "old"  # still there while running
    assert (run_dir / "summary.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


@pytest.mark.parametrize("fault", [RuntimeError("diverged"), KeyboardInterrupt()])
def test_a_failing_run_leaves_the_old_run_intact_and_no_partial_folder(
    fault: BaseException, tmp_path: Path
) -> None:
    run_dir = tmp_path / "r"
    _finished_run(run_dir, "old")
    with pytest.raises(type(fault)), staged(run_dir, overwrite=True) as tmp:
        (tmp / "summary.json").write_text("half")
        raise fault
    assert (run_dir / "summary.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]
    with pytest.raises(type(fault)), staged(tmp_path / "fresh", overwrite=False):
        raise fault
    assert not (tmp_path / "fresh").exists()


def test_only_a_folder_with_the_marker_is_ever_replaced(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "data.txt").write_text("user data")
    with pytest.raises(ConfigError, match="not a pd run folder"), staged(tmp_path / "mine", True):
        pass
    assert (tmp_path / "mine" / "data.txt").read_text() == "user data"
    # A folder that loses its marker while a run is going is not replaced either.
    _finished_run(tmp_path / "r", "old")
    with pytest.raises(ConfigError, match="not a pd run folder"), staged(tmp_path / "r", True):
        (tmp_path / "r" / MARKER).unlink()
    assert (tmp_path / "r" / "summary.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "r"]


def test_an_unwritable_destination_is_one_sentence(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="cannot be created"), staged(blocker / "r", False):
        pass
