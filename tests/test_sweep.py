"""Sweeps (`pd.train.sweep`): each member follows the run of its seed alone, one run folder per
member plus the summary table, and bad `--seeds` or `--grid` specs are one sentence."""

import dataclasses
import json
import math
import threading
from pathlib import Path

import jax
import numpy as np
import pytest
from test_lm_recipe import TINY_LM, token_file

import pd
from pd.testing import tiny_target
from pd.train import OwnTarget, load_config, run
from pd.train.__main__ import main
from pd.train.config import ConfigError
from pd.train.results import WIDEST
from pd.train.rundir import MARKER
from pd.train.sweep import MemberResult, SweepResult, load_sweep, parse_seeds, seed_sweep, sweep
from pd.train.sweep.chunk import Chunk
from pd.train.sweep.run import _layout

TINY = [
    "train.steps=6",
    "train.batch=256",
    "train.log_every=2",
    "train.faith_warmup_steps=5",
    "train.tensorboard=false",
    "eval.n_samples=2000",
    "eval.batch=1000",
    "eval.figures=false",
    "target.train_steps=1500",
    "target.train_batch=1024",
]
RUN_FILES = ("config.json", "metrics.jsonl", "summary.json", "decomposition.npz", "frozen.npz")


def _rows(folder: Path) -> list[dict[str, float]]:
    """metrics.jsonl without its time keys (wall clock)."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def _assert_close(a: object, b: object) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5)


def _compiled_once(result: SweepResult) -> None:
    """The programs that were compiled ahead, while the target trained, are the ones the
    first chunk called: none compiled again."""
    programs = result.compile_times.by_name
    for name in ("init_train_state", "faithfulness_warmup", "train_steps"):
        assert programs[name]["compiles"] == 1, name


def _follows_its_run_alone(member: MemberResult, other: MemberResult, tmp_path: Path) -> None:
    """`member` equals `run` of its config to 1e-5, and `other` (another seed) does not."""
    alone = run(member.member.config, tmp_path / "alone")
    _assert_close(member.state, alone.state)
    assert not np.allclose(np.asarray(other.state.components.V[0]), alone.state.components.V[0])


@pytest.fixture(scope="module")
def one_device_sweep(tmp_path_factory: pytest.TempPathFactory) -> SweepResult:
    """Three seeds vmapped in one program on one device (a real batch of members)."""
    config = load_config("tms_5-2", TINY)
    spec = seed_sweep(config, [0, 1, 2])
    out = tmp_path_factory.mktemp("sweeps") / "one-device"
    return sweep(spec, out, members_per_program=3, devices=jax.devices()[:1])


def test_members_follow_the_runs_of_their_seeds_alone(
    one_device_sweep: SweepResult, tmp_path: Path
) -> None:
    """Member i equals `run` of its config to 1e-5: state, logged rows and summary."""
    for member in (one_device_sweep.members[0], one_device_sweep.members[2]):
        alone = run(member.member.config, tmp_path / member.member.name)
        assert int(member.state.step) == int(alone.state.step) == 6
        _assert_close(member.state, alone.state)
        assert member.run_dir is not None
        swept_rows, alone_rows = _rows(member.run_dir), _rows(alone.run_dir)
        assert [r["step"] for r in swept_rows] == [r["step"] for r in alone_rows] == [0, 2, 4, 5]
        for r, s in zip(swept_rows, alone_rows, strict=True):
            assert r.keys() == s.keys()
            _assert_close([r[k] for k in sorted(r)], [s[k] for k in sorted(s)])
        assert member.summary.keys() - {"time/total_s"} == alone.summary.keys() - {"time/total_s"}
        for key in ("identity_ci_error_0.1/linear1", "identity_ci_error_0.1/linear2"):
            assert member.summary[key] == alone.summary[key], key
        assert member.recovered is (
            alone.summary["identity_ci_error_0.1/linear1"] == 0
            and alone.summary["identity_ci_error_0.1/linear2"] == 0
        )


def test_the_sweep_folder_holds_a_run_folder_per_member_and_the_table(
    one_device_sweep: SweepResult,
) -> None:
    folder = one_device_sweep.sweep_dir
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == ["seed-0", "seed-1", "seed-2"]
    record = json.loads((folder / "sweep.json").read_text())
    assert [m["name"] for m in record["members"]] == ["seed-0", "seed-1", "seed-2"]
    assert [m["seed"] for m in record["members"]] == [0, 1, 2]
    assert record["n_recovered"] == one_device_sweep.n_recovered
    for m, result in zip(record["members"], one_device_sweep.members, strict=True):
        member_dir = folder / m["name"]
        assert result.run_dir == member_dir
        for name in (*RUN_FILES, "compile.json", MARKER):
            assert (member_dir / name).is_file(), (m["name"], name)
        assert json.loads((member_dir / "summary.json").read_text()) == m["summary"]
        config = json.loads((member_dir / "config.json").read_text())
        assert config["seed"] == m["seed"] and config["target"]["seed"] == 0
    _compiled_once(one_device_sweep)
    table = (folder / "sweep.txt").read_text()
    assert "recovered" in table and "id_err/linear1" in table and "mmcs/linear1" in table
    d = pd.load(folder / "seed-1")
    np.testing.assert_array_equal(
        np.asarray(d.V["linear1"]),
        np.asarray(d.recipe.table.view(one_device_sweep.members[1].state.components.V, "linear1")),
    )


def test_the_table_of_a_whole_model_gives_each_wide_family_its_range(
    one_device_sweep: SweepResult,
) -> None:
    """A family of more than `WIDEST` sites or layers (a whole model's 210 CI-L0s, its 30
    layers) is two columns, its minimum and maximum per member; a narrower one a column each."""
    sites = [f"layers.{i}.mlp.{k}" for i in range(30) for k in ("gate", "up", "down")]
    members = []
    for j, m in enumerate(one_device_sweep.members):
        summary = {"kl/ci_masked": 0.5 + j, "ce/ci_masked": 5.0 + j}
        summary |= {f"ci_l0/{n}": float(i + j) for i, n in enumerate(sites)}
        summary |= {f"layer_ci_l0_over_alive/{i}": 0.01 * (i + 1) * (j + 1) for i in range(30)}
        summary |= {f"mmcs/{n}": 0.9 for n in sites[:WIDEST]}  # one column each
        members.append(dataclasses.replace(m, summary=summary))
    lines = dataclasses.replace(one_device_sweep, members=tuple(members)).table().splitlines()
    head = lines[0].split()
    assert [h for h in head if h.startswith("mmcs/")] == [
        f"mmcs/{n}" for n in sorted(sites[:WIDEST])
    ]
    assert head[head.index("kl/ci_masked") :] == [
        *("kl/ci_masked", "ce/ci_masked", "layer_l0/alive", "min", "layer_l0/alive", "max"),
        *("ci_l0", "min", "ci_l0", "max"),
    ]
    for j, line in enumerate(lines[1:4]):
        cells = [float(c) for c in line.split()[-6:]]
        assert cells == pytest.approx([0.5 + j, 5 + j, 0.01 * (j + 1), 0.3 * (j + 1), j, 89 + j])


def test_the_cli_sweeps_over_the_devices_and_a_grid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two seeds × two learning rates: two groups, each spread over the (simulated) devices; one
    folder per member with its figures, the table on stdout; `train.eval_every` evaluates each
    member during training, as a run does. The second rate makes the loss non-finite: its
    members are in the table with the sentence a run stops with, and get no folder."""
    settings = [*TINY, "train.eval_every=4", "eval.figures=true"]
    sets = [a for t in settings for a in ("--set", t)]
    out = tmp_path / "grid"
    argv = ["sweep", "tms_5-2", "--seeds", "0-1", "--grid", "train.lr.start=[1e-3,1e30]"]
    assert main([*argv, *sets, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "recovered" in printed and "sweep folder:" in printed
    assert printed.count("training diverged at step ") == 2
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["train.lr.start=0.001"]
    for seed in (0, 1):
        member_dir = out / "train.lr.start=0.001" / f"seed-{seed}"
        for name in (*RUN_FILES, "ci_probes.png", "components.png", "losses.png"):
            assert (member_dir / name).is_file(), (member_dir, name)
        assert (member_dir / "ci_probes.png").read_bytes()[:4] == b"\x89PNG"
        config = json.loads((member_dir / "config.json").read_text())
        assert config["train"]["lr"]["start"] == 1e-3 and config["seed"] == seed
        evaluated = [r["step"] for r in _rows(member_dir) if "eval/alive/linear1" in r]
        assert evaluated == [0, 4]  # as `run` evaluates: every 4 steps, not the last
    record = json.loads((out / "sweep.json").read_text())
    assert [bool(m["diverged"]) for m in record["members"]] == [False, False, True, True]
    compiles = json.loads((out / "compile.json").read_text())
    for name in ("init_train_state", "faithfulness_warmup", "train_steps"):
        assert compiles[name]["compiles"] == 2, name  # once per group: its lanes share them
    for m in record["members"][2:]:
        assert m["recovered"] is False and m["diverged"].startswith("training diverged at step ")


def test_cpu_lanes_take_every_dth_member_on_the_first_device() -> None:
    """On D CPU devices a sweep trains D lanes side by side, each with every D-th member,
    `per_program` at a time (None: its whole share), all with programs on the first device."""
    devices = jax.devices()[:4]
    for per_program, lanes in [
        (1, [[[0], [4]], [[1], [5]], [[2]], [[3]]]),
        (2, [[[0, 4]], [[1, 5]], [[2]], [[3]]]),
        (None, [[[0, 4]], [[1, 5]], [[2]], [[3]]]),
    ]:
        layout = _layout(6, per_program, devices)
        assert [[indices for indices, _ in lane] for lane in layout.lanes] == lanes
        assert all(size == len(indices) for lane in layout.lanes for indices, size in lane)
        assert list(layout.mesh.devices.flat) == devices[:1]
    assert [[c for c, _ in lane] for lane in _layout(2, None, devices).lanes] == [[[0]], [[1]]]


def test_a_lane_that_fails_stops_the_sweep_with_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two lanes; the second member's training fails: the sweep raises that error (not the
    other lane's stop) and leaves no sweep folder."""
    train = Chunk.train

    def failing(self: Chunk, folders: list[Path], stop: threading.Event) -> object:
        if self.members[0].name == "seed-1":
            raise RuntimeError("lane failed")
        return train(self, folders, stop)

    monkeypatch.setattr(Chunk, "train", failing)
    spec = seed_sweep(load_config("tms_5-2", TINY), [0, 1])
    with pytest.raises(RuntimeError, match="lane failed"):
        sweep(spec, tmp_path / "sweep", devices=jax.devices()[:2])
    assert not (tmp_path / "sweep").exists()


def test_a_member_with_its_own_target_follows_its_run_alone(tmp_path: Path) -> None:
    """`vary_target_seed`: each member's target is trained with its seed; the frozen
    parameters are stacked along the member axis."""
    config = load_config("tms_5-2", TINY)
    spec = seed_sweep(config, [0, 1], vary_target_seed=True)
    assert [dataclasses.asdict(m.config.target)["seed"] for m in spec.members] == [0, 1]
    result = sweep(spec, tmp_path / "targets", members_per_program=2, devices=jax.devices()[:1])
    a, b = result.members
    leaves = zip(jax.tree.leaves(a.frozen), jax.tree.leaves(b.frozen), strict=True)
    assert not all(np.array_equal(x, y) for x, y in leaves)
    _compiled_once(result)  # with the frozen parameters stacked
    alone = run(b.member.config, tmp_path / "alone")
    _assert_close(b.frozen, alone.frozen)
    _assert_close(b.state, alone.state)


def jittable_tiny_target() -> OwnTarget:
    """`pd.testing.tiny_target` with its batches declared jittable: a factory for the test below
    (pytest puts tests/ on the path, so `test_sweep:jittable_tiny_target` imports)."""
    return dataclasses.replace(tiny_target(), jittable=True)


def test_a_sweep_of_a_callers_target_factory_follows_its_runs_alone(tmp_path: Path) -> None:
    """A grid over two factories of one caller's MLP, two seeds each: the batches come from the
    host a step at a time, or are drawn inside the sweep's program (`jittable`). Each member
    equals its twin in the other group and the first group's second member its run alone, to
    1e-5."""
    short = ["train.steps=6", "train.log_every=2", "train.faith_warmup_steps=2"]
    evaluation = ["eval.n_samples=128", "eval.batch=64", "eval.figures=false"]
    factories = '["pd.testing:tiny_target","test_sweep:jittable_tiny_target"]'
    spec = load_sweep(
        "tms_5-2",
        [0, 1],
        ['target={factory="pd.testing:tiny_target"}', *short, *evaluation],
        [f"target.factory={factories}"],
    )
    result = sweep(spec, tmp_path / "sweep", members_per_program=2, devices=jax.devices()[:1])
    assert "mse/ci_masked" in result.table().splitlines()[0]  # no known answer: how faithful
    programs = result.compile_times.by_name
    assert programs["train_step"]["compiles"] == programs["train_steps"]["compiles"] == 1
    host, drawn = result.members[:2], result.members[2:]
    for a, b in zip(host, drawn, strict=True):
        assert a.member.config.seed == b.member.config.seed and int(a.state.step) == 6
        _assert_close(a.state, b.state)
    _follows_its_run_alone(host[1], other=host[0], tmp_path=tmp_path)


def test_a_language_model_sweep_follows_its_runs_alone(tmp_path: Path) -> None:
    """Two seeds of a tiny language model, one on each of two devices: each member draws its
    own token windows from the host, the second equals its run alone to 1e-5, and the table
    gives each seed's KL under CI masks."""
    kinds = [
        'target.kinds=["q","down"]',
        f'target.tokens="{token_file(tmp_path)}"',  # a 20-step target, not the preset's 3000
        "target.train_steps=20",
        "train.steps=4",
        "train.log_every=2",
    ]
    spec = seed_sweep(load_config("tiny_llama", [*TINY_LM, *kinds]), [0, 1])
    result = sweep(spec, tmp_path / "sweep", members_per_program=2, devices=jax.devices()[:2])
    assert "kl/ci_masked" in result.table().splitlines()[0]
    for member in result.members:
        assert member.run_dir is not None and (member.run_dir / "decomposition.npz").is_file()
        assert math.isfinite(member.summary["kl/ci_masked"]) and int(member.state.step) == 4
    first, second = result.members
    _follows_its_run_alone(second, other=first, tmp_path=tmp_path)


@pytest.mark.parametrize("spec", ["5-2", "a", "1,,2", "0-3,2", "", "-1", "1-", "٣"])
def test_a_bad_seeds_spec_is_one_sentence(
    spec: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep"
    assert main(["sweep", "tms_5-2", "--seeds", spec, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --seeds ") and err.count("\n") == 0, err
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "grid", ["loss.importance=1e-3", "loss.importance=[]", "=[1]", "loss.importance"]
)
def test_a_bad_grid_is_one_sentence(
    grid: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sweep", "tms_5-2", "--seeds", "0", "--grid", grid, "--out", str(tmp_path / "s")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --grid ") and err.count("\n") == 0, err


def test_seed_specs_and_grids_name_their_members() -> None:
    assert parse_seeds("0-3,8, 10-11") == (0, 1, 2, 3, 8, 10, 11)
    spec = load_sweep("tms_5-2", [3, 4], grid=["C=[10,20]", "loss.p.start=[1.0]"])
    assert [m.name for m in spec.members] == [
        "C=10/loss.p.start=1.0/seed-3",
        "C=10/loss.p.start=1.0/seed-4",
        "C=20/loss.p.start=1.0/seed-3",
        "C=20/loss.p.start=1.0/seed-4",
    ]
    assert [m.config.C for m in spec.members] == [10, 10, 20, 20]
    assert spec.name == "tms_5-2"
    with pytest.raises(ConfigError, match="config key 'C' is 0"):
        load_sweep("tms_5-2", [0], grid=["C=[0]"])
