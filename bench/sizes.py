"""The longest functions and modules of pd (issue 43's limits: 60 lines a function, 400 a module).

    python bench/sizes.py [--top N]

Prints the N longest functions (lines from `def` to the end of the body, decorators excluded)
and modules (lines of the file), longest first, then both maxima.
"""

import argparse
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "pd"


def function_lengths(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno:
            out.append(
                (
                    node.end_lineno - node.lineno + 1,
                    f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.name}",
                )
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=10)
    top = parser.parse_args().top
    files = sorted(ROOT.rglob("*.py"))
    functions = sorted((f for p in files for f in function_lengths(p)), reverse=True)
    modules = sorted(
        ((len(p.read_text().splitlines()), str(p.relative_to(ROOT.parent))) for p in files),
        reverse=True,
    )
    print("longest functions:")
    for n, name in functions[:top]:
        print(f"  {n:5d}  {name}")
    print("longest modules:")
    for n, name in modules[:top]:
        print(f"  {n:5d}  {name}")
    print(f"max function {functions[0][0]} lines, max module {modules[0][0]} lines")


if __name__ == "__main__":
    main()
