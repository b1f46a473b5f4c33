"""`python -m pd.train show-config PRESET_OR_FILE [--set KEY=VALUE ...]`: every config key as
`--set` takes it, with its value (after the overrides), its default and its meaning.

A key's meaning is the `#` comment of its field in the config dataclasses (`pd.train.config`,
`pd.train.schedule`, `pd.targets.configs`): the comment lines directly above the field and the
comment on the field's own lines, read from the source with `tokenize`. The listing shows its
first sentence.
"""

import argparse
import ast
import dataclasses
import functools
import inspect
import io
import json
import math
import os
import re
import sys
import textwrap
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pd.train.config import ConfigError, RunConfig, load_config, preset_names

WIDTH = 100  # columns of the listing
_CELL = 14  # widest value or default kept in its column; a longer one gets lines of its own
# The help of `--set`, here and in `python -m pd.train`.
SET_HELP = (
    "override a config key: KEY is dotted (train.lr.start) and VALUE is TOML (0.01, "
    '"cosine", [16, 16]); repeatable; `python -m pd.train show-config PRESET` lists every key'
)


@dataclass(frozen=True)
class Leaf:
    """A key as `--set` takes it, its comment, and its value and default as TOML."""

    key: str
    help: str
    value: str
    default: str

    @property
    def changed(self) -> bool:
        return self.value != self.default

    @property
    def shown_default(self) -> str:
        """The default where it differs from the value; "" where the value is the default."""
        return self.default if self.changed else ""


@dataclass(frozen=True)
class Table:
    """A table of keys (a section, `train`, or a table in one, `train.lr`) and its comment."""

    key: str
    help: str


Entry = Leaf | Table


@functools.cache
def _comments(cls: type) -> dict[str, str]:
    """The comments of the fields annotated in the body of `cls` itself, by name: the comment
    lines directly above each field, then those on the field's own lines."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source file (a frozen application)
        return {}
    comments: dict[int, tuple[str, bool]] = {}  # line → (text, whether alone on its line)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            text = token.string.removeprefix("#").strip()
            comments[row] = (text, not token.line[:col].strip())
    (node,) = ast.parse(source).body
    assert isinstance(node, ast.ClassDef)
    out = {}
    for statement in node.body:
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        first, last = statement.lineno, statement.end_lineno or statement.lineno
        above = first - 1
        while above in comments and comments[above][1]:
            above -= 1
        lines = [comments[row][0] for row in range(above + 1, last + 1) if row in comments]
        out[statement.target.id] = " ".join(lines)
    return out


def field_help(cls: type, name: str) -> str:
    """The comment of field `name` of the dataclass `cls`, from the first class of its MRO that
    declares the field with one (a base may declare it for several configs); "" if none."""
    for klass in cls.__mro__:
        if name in vars(klass).get("__annotations__", {}) and (text := _comments(klass).get(name)):
            return text
    return ""


_SENTENCE_END = re.compile(r"(?<=\.)\s+(?=[A-Z0-9\"`(])")


def summary(text: str) -> str:
    """The first sentence of a field's comment, capitalized, without its full stop."""
    first = _SENTENCE_END.split(text, maxsplit=1)[0].removesuffix(".")
    return first[:1].upper() + first[1:]


def toml_value(value: object) -> str:
    """`value` as TOML, as `--set KEY=VALUE` takes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return _number(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(value, tuple):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        items = ", ".join(f"{f.name} = {toml_value(getattr(value, f.name))}" for f in fields)
        return f"{{ {items} }}"
    raise TypeError(f"no TOML form for {value!r}")


def _number(value: int | float) -> str:
    """A number as TOML: whole numbers from 10_000 on with `_` between thousands, exponents
    without leading zeros (1e-8)."""
    if math.isfinite(value) and 10_000 <= abs(value) < 2**53 and value == int(value):
        return f"{value:_}" if isinstance(value, int) else f"{value:_.1f}"
    return re.sub(r"e([+-]?)0+(?=\d)", r"e\1", repr(value))


def entries(config: RunConfig, defaults: RunConfig) -> list[Entry]:
    """The keys of `config`: the top-level leaves, then each table (`[train]`, …) and its keys,
    in the order of the dataclasses' fields; each default is `defaults`' value of the key."""
    tables: list[Entry] = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            tables.append(Table(f.name, field_help(RunConfig, f.name)))
            tables += _entries(value, getattr(defaults, f.name), f.name)
    return _entries(config, defaults, "") + tables


def _entries(node: object, default: object, prefix: str) -> list[Entry]:
    """The leaves of the config `node` under `prefix`, and its nested tables, each followed by
    its own; its top-level tables are left to `entries`. A target of another kind than the
    default's has the defaults of its kind (as a file that sets its kind gets), `kind` aside."""
    assert dataclasses.is_dataclass(node) and not isinstance(node, type)
    base = default if type(default) is type(node) else type(node)()
    out: list[Entry] = []
    for f in dataclasses.fields(node):
        key = f"{prefix}.{f.name}" if prefix else f.name
        value, was = getattr(node, f.name), getattr(default if f.name == "kind" else base, f.name)
        meaning = field_help(type(node), f.name)
        if not dataclasses.is_dataclass(value):
            out.append(Leaf(key, meaning, toml_value(value), toml_value(was)))
        elif prefix:
            out.append(Table(key, meaning))
            out += _entries(value, was, key)
    return out


def defaults_for(preset_or_file: str) -> RunConfig:
    """What each key is when a config file does not set it: `RunConfig()`'s defaults, with the
    run named after the file as `load_config` names it."""
    try:
        return RunConfig(name=Path(preset_or_file).stem)
    except ConfigError:  # a file name that is no run name: the file names the run itself
        return RunConfig()


def listing(title: str, items: list[Entry], width: int = WIDTH) -> str:
    """The entries as text of at most `width` columns where values allow: per section, a table
    of key, value, default (where it differs from the value) and meaning; a value or default too
    wide for its column goes on a line of its own, and so does the meaning of a table."""
    leaves = [e for e in items if isinstance(e, Leaf)]
    key_w = max(len(e.key) for e in items)
    values = [len(e.value) for e in leaves if len(e.value) <= _CELL]
    defaults = [len(e.shown_default) for e in leaves if len(e.shown_default) <= _CELL]
    widths = (max(len("value"), *values), max(len("default"), *defaults))
    changed = sum(e.changed for e in leaves)
    lines = textwrap.wrap(
        f"{title}: {len(leaves)} keys, each as `--set KEY=VALUE` takes it; * marks the {changed} "
        "whose value differs from the default (shown only for those)",
        width,
    )
    lines.append(_row("", "key", "value", "default", key_w, widths) + "meaning")
    for e in items:
        lines += _leaf(e, key_w, widths, width) if isinstance(e, Leaf) else _heading(e, width)
    return "\n".join(lines)


def _row(mark: str, key: str, value: str, default: str, key_w: int, widths: tuple[int, int]) -> str:
    return f"{mark:1} {key:{key_w}}  {value:{widths[0]}}  {default:{widths[1]}}  "


def _heading(table: Table, width: int) -> list[str]:
    """A section (`[train]` and its meaning) or a table inside one (its key and meaning)."""
    if "." not in table.key:
        return ["", *textwrap.wrap(f"[{table.key}]  {summary(table.help)}", width)]
    return textwrap.wrap(f"{table.key}: {summary(table.help)}", width, initial_indent="  ")


def _leaf(leaf: Leaf, key_w: int, widths: tuple[int, int], width: int) -> list[str]:
    """A key's row, its meaning wrapped in the last column; a value or default wider than its
    column is written in full on a line of its own, with the meaning below it."""
    mark, default, meaning = "*" if leaf.changed else "", leaf.shown_default, summary(leaf.help)
    if len(leaf.value) <= _CELL and len(default) <= _CELL:
        row = _row(mark, leaf.key, leaf.value, default, key_w, widths)
        wrapped = textwrap.wrap(meaning, max(width - len(row), 30)) or [""]
        return [(row + wrapped[0]).rstrip(), *(" " * len(row) + line for line in wrapped[1:])]
    indent = " " * 6
    return [
        f"{mark:1} {leaf.key} = {leaf.value}",
        *([f"{indent}default: {default}"] if default else []),
        *textwrap.wrap(meaning, width, initial_indent=indent, subsequent_indent=indent),
    ]


def main(argv: Sequence[str]) -> int:
    """`python -m pd.train show-config ...`; exit status 2 for a bad preset, file or override,
    as `python -m pd.train` gives."""
    args = _parser().parse_args(list(argv))
    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    title = args.config + "".join(f" --set {o}" for o in args.overrides)
    try:
        print(listing(title, entries(config, defaults_for(args.config))), flush=True)
    except BrokenPipeError:  # the reader stopped early (`| head`), having read what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor fail at exit's flush
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pd.train show-config",
        description="List every config key of a preset or config file as --set takes it, with "
        "its value (after the --set overrides), its default and its meaning; * marks the keys "
        "whose value differs from the default.",
    )
    parser.add_argument("config", help=f"a preset ({', '.join(preset_names())}) or a .toml file")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=SET_HELP
    )
    return parser
