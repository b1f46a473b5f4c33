"""`python -m pd.train show-config`: every key `--set` takes, with its value, default and the
meaning written beside its field in the source."""

import dataclasses
import subprocess
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from pd.train.__main__ import _parser as train_parser
from pd.train.__main__ import main
from pd.train.config import ConfigError, RunConfig, load_config, preset_names
from pd.train.show_config import (
    WIDTH,
    Leaf,
    defaults_for,
    entries,
    field_help,
    listing,
    summary,
)


def _config_classes(tp: object = RunConfig, seen: list[type] | None = None) -> list[type]:
    """Every config dataclass reachable from `tp` through its fields' types (the target kinds of
    a union, the items of a tuple)."""
    seen = [] if seen is None else seen
    if typing.get_origin(tp) in (types.UnionType, tuple):
        for arg in typing.get_args(tp):
            _config_classes(arg, seen)
    elif isinstance(tp, type) and dataclasses.is_dataclass(tp) and tp not in seen:
        seen.append(tp)
        for f in dataclasses.fields(tp):
            _config_classes(f.type, seen)
    return seen


def test_the_walk_reaches_every_config_class() -> None:
    names = {cls.__name__ for cls in _config_classes()}
    assert {"RunConfig", "Schedule", "ReconTerm", "KindC", "FactoryConfig"} <= names
    assert {"TMSConfig", "ResidMLPConfig", "LlamaConfig", "AdversaryConfig"} <= names


@pytest.mark.parametrize("cls", _config_classes(), ids=lambda cls: cls.__name__)
def test_every_field_has_a_short_meaning(cls: type) -> None:
    for f in dataclasses.fields(cls):
        text = summary(field_help(cls, f.name))
        assert text, f"{cls.__name__}.{f.name} has no comment"
        # At most four lines of the listing's meaning column.
        assert len(text) <= 160, f"{cls.__name__}.{f.name}: {text!r} is long for a summary"
        choices = typing.get_args(f.type) if typing.get_origin(f.type) is Literal else ()
        if len(choices) > 1:  # the choices are named where the listing shows the meaning
            missing = [c for c in choices if f'"{c}"' not in text]
            assert not missing, f"{cls.__name__}.{f.name}: {text!r} names none of {missing}"


@dataclass(frozen=True)
class _Commented:
    plain: int = 0
    # Above, on two lines, with a # inside
    # the comment itself.
    above: str = "# not a comment"
    trailing: str = "a # b"  # beside it; "# quoted" here.

    # A blank line parts this comment from `separated`.

    separated: int = 1
    # Before a field written on
    spanning: tuple[int, ...] = (  # and beside its first line
        1,
        2,
    )


def test_comments_are_read_from_the_source_whatever_strings_hold() -> None:
    assert field_help(_Commented, "plain") == ""
    assert (
        field_help(_Commented, "above")
        == "Above, on two lines, with a # inside the comment itself."
    )
    assert field_help(_Commented, "trailing") == 'beside it; "# quoted" here.'
    assert field_help(_Commented, "separated") == ""
    assert (
        field_help(_Commented, "spanning") == "Before a field written on and beside its first line"
    )


def test_the_summary_is_the_first_sentence() -> None:
    assert summary("steps between checkpoints; 0: never. The whole state.") == (
        "Steps between checkpoints; 0: never"
    )
    assert summary('"bf16": lower. Default "fp32".') == '"bf16": lower'
    assert summary("Loop bodies (see pd/loops.py). 2 is faster.") == "Loop bodies (see pd/loops.py)"


def _leaf_keys(table: dict[str, object], prefix: str = "") -> set[str]:
    """The dotted keys of the leaves of a nested dict (a list is a leaf)."""
    keys = set()
    for name, value in table.items():
        key = f"{prefix}{name}"
        keys |= _leaf_keys(value, f"{key}.") if isinstance(value, dict) else {key}
    return keys


@pytest.mark.parametrize("preset", preset_names())
def test_the_listed_keys_are_the_keys_set_takes_with_their_values(preset: str) -> None:
    config = load_config(preset)
    leaves = [e for e in entries(config, defaults_for(preset)) if isinstance(e, Leaf)]
    keys = [e.key for e in leaves]
    assert len(set(keys)) == len(keys) and set(keys) == _leaf_keys(dataclasses.asdict(config))
    for e in leaves:  # each value, as listed, sets the key to the value it has
        assert load_config(preset, [f"{e.key}={e.value}"]) == config, e.key
    text = listing(preset, entries(config, defaults_for(preset)))
    starts = [line[2:].split(" ")[0] for line in text.splitlines() if line[:1] in ("*", " ")]
    assert [k for k in starts if k in keys] == keys  # each listed once, at the start of a line
    assert max(map(len, text.splitlines())) <= WIDTH


def test_a_default_is_the_value_of_a_file_that_sets_nothing(tmp_path: Path) -> None:
    config = load_config("tiny_llama", ["target.n_layers=3"])
    leaves = [e for e in entries(config, defaults_for("tiny_llama")) if isinstance(e, Leaf)]
    # A file of the same name that sets only the target's kind (without it, the kind is "tms").
    bare = tmp_path / "tiny_llama.toml"
    bare.write_text('[target]\nkind = "llama"\n')
    bare_config = load_config(str(bare))
    values = {e.key: e.value for e in entries(bare_config, bare_config) if isinstance(e, Leaf)}
    values["target.kind"] = '"tms"'
    assert {e.key: e.default for e in leaves} == values
    marked = {e.key for e in leaves if e.changed}
    assert {"target.kind", "target.n_layers", "train.steps", "loss.recon"} <= marked
    assert not {"name", "loss.faithfulness", "target.seq_len"} & marked  # set to their defaults


def test_an_override_is_listed_as_the_value_and_marked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show-config", "tms_5-2", "--set", "train.steps=123", "--set", "C=7"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[1]: line.split() for line in out.splitlines() if line.startswith("* ")}
    assert rows["train.steps"][2:4] == ["123", "10_000"]
    assert rows["C"][2:4] == ["7", "20"]
    assert set(rows) == {"train.steps", "C", "train.unroll"}  # the preset's own change too
    assert "\n[train]  " in out and "\n  train.lr: Learning rate of the components" in out


@pytest.mark.parametrize(
    "argv",
    [["tms_5-3"], ["tms_5-2", "--set", "loss.importnce=1e-3"], ["tms_5-2", "--set", "C=0"]],
)
def test_a_bad_preset_or_override_is_the_train_commands_sentence(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError) as expected:
        load_config(argv[0], argv[2:])
    assert main(["show-config", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"error: {expected.value}\n"


def test_the_train_commands_arguments_are_parsed_as_before(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = train_parser().parse_args(["tms_5-2", "--set", "train.steps=5", "--overwrite"])
    assert (args.config, args.overrides, args.overwrite) == ("tms_5-2", ["train.steps=5"], True)
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    help_text = capsys.readouterr().out
    assert "show-config PRESET_OR_FILE" in help_text and "KEY is dotted" in help_text
    with pytest.raises(SystemExit) as done:
        main(["show-config", "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python -m pd.train show-config")


def test_the_command_lists_a_preset() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pd.train", "show-config", "tiny_llama", "--set", "C=8"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("tiny_llama --set C=8: ")
    assert any(line.startswith("* C ") and " 8 " in line for line in lines)
    assert max(map(len, lines)) <= WIDTH
