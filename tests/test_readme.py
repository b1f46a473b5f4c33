"""The Python code blocks of README.md and docs/*.md run as written (in a fresh folder, one
namespace per block)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))


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
