"""Configs validate themselves when constructed: Python code, TOML files and `--set` overrides
meet the same checks and the same one-sentence errors; `RunConfig()` is the TMS 5-2 recipe."""

import dataclasses
import math
from collections.abc import Callable

import pytest

from pd.targets.configs import KindC, LlamaConfig, TMSConfig
from pd.train.config import (
    ConfigError,
    EvalConfig,
    LossConfig,
    ReconTerm,
    RunConfig,
    TrainConfig,
    load_config,
)
from pd.train.schedule import Schedule
from pd.validate import FieldError


def _given(cls: Callable[..., object], **fields: object) -> Callable[[], object]:
    """Constructs `cls` with `fields`, whatever their static types (wrong ones on purpose)."""
    return lambda: cls(**fields)


# (override on the command line, the same value given in Python, the path of what it builds)
SAME_VALUE: list[tuple[str, Callable[[], object], str]] = [
    ("train.steps=0", lambda: TrainConfig(steps=0), "train"),
    ("C=0", lambda: RunConfig(C=0), ""),
    ("ci_hidden=[16, 0]", lambda: RunConfig(ci_hidden=(16, 0)), ""),
    ('name="a/b"', lambda: RunConfig(name="a/b"), ""),
    ('ci_fn="lstm"', _given(RunConfig, ci_fn="lstm"), ""),
    ("seed=-1", lambda: RunConfig(seed=-1), ""),
    ("target.feature_prob=1.5", lambda: TMSConfig(feature_prob=1.5), "target"),
    ("loss.importance=nan", lambda: LossConfig(importance=math.nan), "loss"),
    ("loss.p.start=0", lambda: LossConfig(p=Schedule(0.0)), "loss"),
    ("loss.p.warmup_pct=0.1", lambda: LossConfig(p=Schedule(1.0, warmup_pct=0.1)), "loss"),
    ("train.lr.start=0", lambda: TrainConfig(lr=Schedule(0.0)), "train"),
    ("train.ci_lr.final_frac=2", lambda: Schedule(1.0, final_frac=2.0), "train.ci_lr"),
    ("loss.recon=[{plan='all', coeff=-1}]", lambda: ReconTerm("all", coeff=-1.0), "loss.recon[0]"),
    ('train.steps="10"', _given(TrainConfig, steps="10"), "train"),
    ("eval.figures=1", _given(EvalConfig, figures=1), "eval"),
]


@pytest.mark.parametrize(("override", "construct", "path"), SAME_VALUE)
def test_python_and_the_command_line_refuse_a_value_with_the_same_sentence(
    override: str, construct: Callable[[], object], path: str
) -> None:
    with pytest.raises(ConfigError) as cli:
        load_config("tms_5-2", [override])
    with pytest.raises(FieldError) as direct:
        construct()
    # Python names the field within the config it built; the file path adds where that sits.
    assert str(cli.value) == str(direct.value.under(path))
    assert str(cli.value).count("\n") == 0 and str(cli.value).startswith("config key ")
    if not path:
        assert str(direct.value) == str(cli.value)


def test_the_sentence_names_the_full_path_the_value_and_what_was_expected() -> None:
    with pytest.raises(
        ConfigError, match=r"^config key 'train.steps' is 0, expected a positive integer$"
    ):
        load_config("tms_5-2", ["train.steps=0"])
    with pytest.raises(
        ConfigError, match=r"^config key 'steps' is 0, expected a positive integer$"
    ):
        RunConfig(train=TrainConfig(steps=0))


def test_wrong_types_are_refused_naming_the_field() -> None:
    cases: list[tuple[Callable[[], object], str]] = [
        (_given(TrainConfig, steps="10"), r"'steps' is '10' \(str\), expected an integer"),
        (lambda: TrainConfig(steps=True), r"'steps' is True \(bool\), expected an integer"),
        (_given(RunConfig, ci_hidden=[16]), r"'ci_hidden' is \[16\] \(list\), expected a tuple"),
        (
            _given(LossConfig, recon=("all",)),
            r"'recon\[0\]' is 'all' \(str\), expected a ReconTerm",
        ),
        (_given(LlamaConfig, kinds=("q", "x")), r"'kinds\[1\]' is 'x', expected one of 'q'"),
        (
            _given(RunConfig, target=TrainConfig()),
            r"'target' is TrainConfig\(.*, expected a TMSConfig",
        ),
    ]
    for construct, says in cases:
        with pytest.raises(ConfigError, match=says):
            construct()


def test_ints_given_for_float_fields_are_stored_as_floats() -> None:
    schedule = Schedule(1, final_frac=0)
    assert type(schedule.start) is float and type(schedule.final_frac) is float
    assert schedule == Schedule(1.0, final_frac=0.0)
    assert type(load_config("tms_5-2", ["loss.importance=1"]).loss.importance) is float


def test_zero_is_allowed_where_it_means_something() -> None:
    assert KindC(q=0).q == 0  # a kind's C of 0 takes the run's C
    config = load_config("tiny_llama", ["target.layers=[0]", "train.faith_warmup_steps=0"])
    assert isinstance(config.target, LlamaConfig) and config.target.layers == (0,)
    assert TMSConfig(n_identity=0, seed=0).n_identity == 0


def test_the_defaults_are_the_tms_5_2_preset() -> None:
    """`RunConfig()` decomposes TMS 5-2 as the preset does; the preset adds only its name and
    the CPU-only loop unroll."""
    preset = load_config("tms_5-2")
    assert RunConfig() == dataclasses.replace(
        preset, name="run", train=dataclasses.replace(preset.train, unroll=1)
    )


def test_a_typed_override_is_validated() -> None:
    config = RunConfig(name="short")
    shorter = dataclasses.replace(config, train=dataclasses.replace(config.train, steps=500))
    assert shorter.train.steps == 500 and shorter.train.lr == config.train.lr
    with pytest.raises(ConfigError, match=r"'steps' is 0, expected a positive integer"):
        dataclasses.replace(config.train, steps=0)


def test_a_partial_table_keeps_the_rest_of_the_default() -> None:
    """`--set train.lr.start=…` changes the start of the default cosine schedule, not the
    schedule's kind; a table that names its kind gets it."""
    lr = load_config("tms_5-2", ["train.lr.start=0.01"]).train.lr
    assert lr == Schedule(0.01, final_frac=0.0, kind="cosine")
    assert load_config("resid_mlp1").train.lr == Schedule(2e-3, final_frac=0.0, kind="constant")


def test_a_missing_value_and_an_unknown_key_are_one_sentence() -> None:
    with pytest.raises(ConfigError, match=r"'loss.recon\[0\].plan' is missing, expected a value"):
        load_config("tms_5-2", ["loss.recon=[{coeff=1}]"])
    with pytest.raises(ConfigError, match=r"'target.kind' is 'x', expected one of 'tms'"):
        load_config("tms_5-2", ['target.kind="x"'])


def test_a_run_name_may_hold_single_spaces_as_a_run_folder_may() -> None:
    """`--set name='my run'` is taken as `--out 'runs/my run'` is; spaces at either end or two in
    a row are refused, with what is expected."""
    assert load_config("tms_5-2", ["name='my run 2'"]).name == "my run 2"
    for bad in (" lead", "trail ", "two  spaces"):
        with pytest.raises(ConfigError, match="single spaces inside"):
            RunConfig(name=bad)
