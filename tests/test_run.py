"""End to end on a tiny budget: the run folder, `pd.load`, the step's purity (S18), I1 for V/U."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pd
from pd.init import init_vu, key_tree
from pd.targets.tms import TMS
from pd.targets.train import trained_shapes
from pd.train import arrays, load_config, run
from pd.train.init_state import init_train_state
from pd.train.kinds import as_toy
from pd.train.run import RunResult, make_recipe
from pd.train.step import make_sampler, make_train_step

TINY = [
    "train.steps=40",
    "train.batch=256",
    "train.log_every=10",
    "train.faith_warmup_steps=5",
    "eval.n_samples=2000",
    "eval.batch=1000",
    "target.train_steps=1500",
    "target.train_batch=1024",
]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    """With evaluations (and figures) during training too, the first at step 0, before any
    row is logged."""
    config = load_config("tms_5-2-id", [*TINY, "loss.adversary.coeff=1.0", "train.eval_every=20"])
    return run(config, tmp_path_factory.mktemp("runs") / "tiny")


def test_run_folder_contents(tiny_run: RunResult) -> None:
    d = tiny_run.run_dir
    for name in ("config.json", "metrics.jsonl", "summary.json", "decomposition.npz"):
        assert (d / name).is_file(), name
    compiled = json.loads((d / "compile.json").read_text())
    for jit_name in ("init_train_state", "train_steps", "eval_step"):
        row = compiled[jit_name]
        assert row["compile_s"] > 0.0 and row["trace_s"] > 0.0, jit_name
    # The loop found its step program compiled ahead (pd/train/ahead.py), not compiled again:
    # for the shapes the target's training gives, while it trained. The program returns the
    # monitors of logged steps too, so only the evaluation compiles eval_step.
    assert compiled["train_steps"]["compiles"] == compiled["init_train_state"]["compiles"] == 1
    shapes = trained_shapes(as_toy(tiny_run.recipe.target))
    assert jax.tree.map(lambda a: (a.shape, a.dtype), tiny_run.frozen) == jax.tree.map(
        lambda a: (a.shape, a.dtype), shapes
    )
    assert compiled["eval_step"]["compiles"] == 1 and "monitor_step" not in compiled
    for name in ("ci_probes.png", "components.png", "losses.png"):
        assert (d / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 10, 20, 30, 39]
    assert [r["step"] for r in rows if "eval/alive/linear1" in r] == [0, 20]
    assert all(isinstance(v, float) for r in rows for k, v in r.items() if k != "step")
    summary = json.loads((d / "summary.json").read_text())
    for key in (
        "alive/linear1",
        "alive/hidden.0",
        "identity_ci_error_0.1/linear2",
        "dense_ci_error_0.1/hidden.0",
        "mmcs/linear1",
        "ml2r/linear1",
        "ci_l0/linear1",
        "loss/recon_all",
        "monitor/ci_masked_recon",
        "loss/adversarial",
    ):
        assert key in summary, key
    assert 0.0 <= summary["alive/linear1"] <= 20.0


def test_load_gives_typed_views_and_masked_forwards(tiny_run: RunResult) -> None:
    decomposition = pd.load(tiny_run.run_dir)
    assert decomposition.sites == ("linear1", "hidden.0", "linear2")
    table = tiny_run.recipe.table
    for name, V in decomposition.V.items():
        np.testing.assert_array_equal(
            np.asarray(V), np.asarray(table.view(tiny_run.state.components.V, name))
        )
    x = 0.75 * jnp.eye(5)
    ci = decomposition.ci(x)
    assert {k: v.shape for k, v in ci.items()} == {s: (5, 20) for s in decomposition.sites}
    ones = {s: jnp.ones((5, 20)) for s in decomposition.sites}
    # S1: every mask 1 with the delta channel on is the frozen model.
    np.testing.assert_allclose(
        np.asarray(decomposition.masked_forward(x, ones, delta=1.0)),
        np.asarray(decomposition.clean(x)),
        atol=1e-5,
    )


def test_overwrite_by_a_failing_run_keeps_the_old_run(
    tiny_run: RunResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = tmp_path / "old"
    shutil.copytree(tiny_run.run_dir, old)
    before = {p: p.read_bytes() for p in old.rglob("*") if p.is_file()}

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # Ctrl-C in the middle of training

    # `pd.train.run` the attribute is the function; the module is in sys.modules.
    monkeypatch.setattr(sys.modules["pd.train.run"], "_train_in", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_run.config, old, overwrite=True)
    assert {p: p.read_bytes() for p in old.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]


@pytest.mark.parametrize("name", ["decomposition.npz", "frozen.npz"])
def test_load_refuses_a_corrupt_checkpoint(tiny_run: RunResult, tmp_path: Path, name: str) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_run.run_dir, broken)
    (broken / name).write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="is corrupt"):
        pd.load(broken)
    with pytest.raises(FileNotFoundError, match=r"has no config\.json"):
        pd.load(tmp_path / "nowhere")


def test_the_run_folder_holds_its_frozen_target(tiny_run: RunResult, tmp_path: Path) -> None:
    # The copy in the folder is the target V/U were fitted to: pd.load needs no cache.
    loaded = pd.load(tiny_run.run_dir)
    assert arrays.fingerprint(loaded.frozen) == arrays.fingerprint(tiny_run.frozen)
    # Without the copy, the target is rebuilt and must match the recorded fingerprint.
    moved = tmp_path / "moved"
    shutil.copytree(tiny_run.run_dir, moved)
    (moved / "frozen.npz").unlink()
    meta = json.loads((moved / "frozen.json").read_text())
    (moved / "frozen.json").write_text(json.dumps({"fingerprint": meta["fingerprint"]}))
    assert pd.load(moved).sites == loaded.sites
    (moved / "frozen.json").write_text(json.dumps({"fingerprint": "0" * 64}))
    with pytest.raises(ValueError, match=r"frozen weights .* are not the ones run folder"):
        pd.load(moved)


def test_run_result_decomposition_equals_the_loaded_one(tiny_run: RunResult) -> None:
    mine, loaded = tiny_run.decomposition, pd.load(tiny_run.run_dir)
    x = mine.batch(3)
    assert x.shape == (256, 5) and mine.known is not None and mine.known.n_features == 5
    for site in mine.sites:
        np.testing.assert_array_equal(np.asarray(mine.ci(x)[site]), np.asarray(loaded.ci(x)[site]))


def test_ablate_takes_rank_one_pieces_out_of_the_weight(tiny_run: RunResult) -> None:
    d = tiny_run.decomposition
    x = d.batch(0)[:16]
    np.testing.assert_allclose(np.asarray(d.ablate(x, "linear1", [])), np.asarray(d.clean(x)))
    # Ablating c is the frozen model with W − V[:, c] U[c, :] at linear1 (TMS: relu(h W2 + b)).
    V, U, W = d.V["linear1"], d.U["linear1"], d.frozen["~"]["linear1"]
    h = x @ (W - jnp.outer(V[:, 2], U[2]) - jnp.outer(V[:, 7], U[7]))
    assert isinstance(d.target, TMS)
    for i in range(d.target.n_identity):
        h = h @ d.frozen["~"][f"hidden_{i}"]
    expected = jax.nn.relu(h @ d.frozen["~"]["linear2"] + d.frozen["~"]["b"])
    np.testing.assert_allclose(
        np.asarray(d.ablate(x, "linear1", [2, 7])), np.asarray(expected), atol=1e-5
    )
    with pytest.raises(KeyError, match="subcomponent 20 is not in the decomposition"):
        d.ablate(x, "linear1", [20])


def test_a_wrong_shaped_input_is_one_sentence(tiny_run: RunResult) -> None:
    d = tiny_run.decomposition
    with pytest.raises(
        ValueError, match=r"input x has shape \[3, 7\] of float32, expected \[B, 5\]"
    ):
        d.ci(jnp.ones((3, 7)))


def test_s18_batch_is_pure_and_frozen_params_are_traced_arguments() -> None:
    config = load_config("tms_5-2", TINY)
    recipe = make_recipe(config)
    init_key, src_key, run_key = key_tree(0)
    sample = make_sampler(as_toy(recipe.target), 64)
    np.testing.assert_array_equal(
        np.asarray(sample(run_key, jnp.int32(7))), np.asarray(sample(run_key, jnp.int32(7)))
    )
    assert not np.array_equal(
        np.asarray(sample(run_key, jnp.int32(7))), np.asarray(sample(run_key, jnp.int32(8)))
    )
    step = make_train_step(recipe)
    W = jax.random.normal(jax.random.key(5), (5, 2))
    outs = []
    for scale in (1.0, 2.0):
        frozen = as_toy(recipe.target).expand({"W1": scale * W, "b": jnp.zeros(5)})
        state = init_train_state(recipe, init_key, src_key)
        _, metrics = step(state, frozen, sample(run_key, state.step), run_key)
        outs.append(float(metrics["loss/faithfulness"]))
    # Another frozen W changes the result without a recompile: an argument, not a constant.
    assert outs[0] != outs[1]
    assert step._cache_size() == 1  # type: ignore[attr-defined]  # jit's private cache counter


def test_i1_batched_vu_init_equals_the_unrolled_reference() -> None:
    recipe = make_recipe(load_config("tms_5-2-id", TINY))
    table = recipe.table
    init_key, _, _ = key_tree(11)
    batched = jax.jit(init_vu, static_argnums=1)(init_key, table)

    @jax.jit
    def unrolled(key: jax.Array) -> tuple[list[jax.Array], list[jax.Array]]:
        keys = jax.random.split(key, 2 * len(table.sites))
        V = [
            jax.random.normal(keys[2 * i], (s.d_in, s.C)) / jnp.sqrt(jnp.float32(s.d_in))
            for i, s in enumerate(table.sites)
        ]
        U = [
            jax.random.normal(keys[2 * i + 1], (s.C, s.d_out)) / jnp.sqrt(jnp.float32(s.C))
            for i, s in enumerate(table.sites)
        ]
        return V, U

    V_ref, U_ref = unrolled(init_key)
    for i, name in enumerate(table.names):
        np.testing.assert_array_equal(np.asarray(table.view(batched.V, name)), np.asarray(V_ref[i]))
        np.testing.assert_array_equal(np.asarray(table.view(batched.U, name)), np.asarray(U_ref[i]))


def test_ci_probes_label_columns_with_real_subcomponent_indices(
    tiny_run: RunResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from matplotlib.figure import Figure

    from pd.train import figures
    from pd.train.evaluate import ALIVE_THRESHOLD, probe_ci

    drawn: list[Figure] = []

    def keep(fig: Figure, *args: object, **kwargs: object) -> None:  # to read the figure
        drawn.append(fig)

    monkeypatch.setattr(Figure, "savefig", keep)
    d = tiny_run.decomposition
    assert d.known is not None
    figures._ci_probes(d.recipe, tiny_run.state, d.frozen, d.known, tmp_path / "p.png")
    probes = probe_ci(d.recipe, d.ci_params, d.components, d.frozen, 5)
    for ax, (site, ci) in zip(drawn[0].axes[: len(probes)], probes.items(), strict=True):
        used = {str(c) for c in np.flatnonzero(ci.max(axis=0) > ALIVE_THRESHOLD)}
        labels = {t.get_text() for t in ax.get_xticklabels()}
        assert labels == used, site


def test_drawing_figures_leaves_the_callers_matplotlib_backend_alone() -> None:
    # A notebook's backend: pd draws on Figures of its own, never through pyplot.
    code = (
        "import matplotlib; matplotlib.use('svg'); import pd.train.figures; "
        "print(matplotlib.get_backend())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "svg", out


def test_a_run_writes_tensorboard_events_tensorboard_reads(tiny_run: RunResult) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tiny_run.run_dir / "tensorboard"))
    events.Reload()
    rows = [
        json.loads(line) for line in (tiny_run.run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    curve = events.Scalars("loss/total")
    assert [e.step for e in curve] == [r["step"] for r in rows]
    np.testing.assert_allclose([e.value for e in curve], [r["loss/total"] for r in rows], rtol=1e-6)
