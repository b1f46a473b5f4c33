"""The Python code blocks of README.md and docs/*.md run as written (in a fresh folder, one
namespace per block), and the `--set` overrides their commands give a preset are ones it takes."""

import re
import shlex
from itertools import pairwise
from pathlib import Path

import pytest

from pd.train.config_files import preset_names

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PRESETS = set(preset_names())


def python_blocks(path: Path) -> list[str]:
    """The ```python fenced blocks of a Markdown file, in order."""
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.M | re.S)


BLOCKS = [
    (path.relative_to(ROOT).as_posix(), index, code)
    for path in (README, *DOCS)
    for index, code in enumerate(python_blocks(path))
]


def test_the_readme_has_python_blocks() -> None:
    assert python_blocks(README)


@pytest.mark.parametrize(
    ("name", "index", "code"), BLOCKS, ids=[f"{name}-{index}" for name, index, _ in BLOCKS]
)
def test_python_block_runs(
    name: str, index: int, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # runs/ and any other output land here
    compiled = compile(code, f"{name} python block {index}", "exec")
    exec(compiled, {"__name__": f"block_{Path(name).stem}_{index}"})


def documented_commands(path: Path) -> list[tuple[str, list[str]]]:
    """`(preset, overrides)` of each command in a Markdown file that runs a preset with `--set`
    (`python -m pd.train`, `python bench/...`), continuation lines joined; overrides with a
    placeholder (`KEY=VALUE`, `seed=S`, `…`) are left out."""
    found = []
    for line in path.read_text().replace("\\\n", " ").splitlines():
        start = line.find("python ")
        if start < 0 or "--set" not in line:
            continue
        command = re.split(r"`|\s#", line[start:])[0]
        words = shlex.split(command)
        preset = next((w for w in words if w in PRESETS), None)
        sets = [v for w, v in pairwise(words) if w == "--set"]
        sets = [s for s in sets if not re.search(r"[A-Z]{2,}|=[A-Z]$|…|\.\.\.", s)]
        if preset is not None and sets:
            found.append((preset, sets))
    return found


COMMANDS = [
    (path.relative_to(ROOT).as_posix(), preset, sets)
    for path in (README, *DOCS)
    for preset, sets in documented_commands(path)
]


def test_the_docs_have_commands_with_overrides() -> None:
    assert any(name == "README.md" for name, _, _ in COMMANDS)


@pytest.mark.parametrize(
    ("name", "preset", "sets"), COMMANDS, ids=[f"{n}-{p}-{len(s)}" for n, p, s in COMMANDS]
)
def test_documented_commands_name_keys_and_values_the_preset_takes(
    name: str, preset: str, sets: list[str]
) -> None:
    from pd.train.config import load_config

    load_config(preset, sets)  # a renamed key or a value out of range raises ConfigError
