"""The language-model recipe: KL direction (S25), chunks(k) plans (S10), the adversarial term with
fixed sources (S12), warmup and final ascents (S13, S14), traced frozen weights (S18),
device-count invariance (D4), and a run from a token file on 1 device resumed on 4.

The tests that compile a training step share one config (`lm_runs`), since runs of one recipe
in a process share their compiled programs and a language-model step is the suite's costliest
compile."""

import functools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float
from test_resume import metric_rows, sigterm_at

import pd
from pd.adversary import SourceAdam, Sources, ascend
from pd.ci import squash
from pd.decompose import make_mask
from pd.init import key_tree
from pd.losses import kl, recon_plan
from pd.shard import ShardingError, make_mesh
from pd.state import Components, TrainState
from pd.targets.llama import Llama
from pd.train import RunResult, load_config, run
from pd.train.compile_only import compile_only
from pd.train.config import RunConfig
from pd.train.evaluate import ci_program
from pd.train.init_state import state_shardings
from pd.train.kinds import as_toy
from pd.train.objective import PassInputs, Recipe, adversarial_recon, flat_metrics
from pd.train.placement import ONE_DEVICE, placement_of
from pd.train.run import make_batches, make_recipe
from pd.train.schedule import schedule_value
from pd.train.step import make_train_step

TINY_LM = [
    "C=4",
    "target.vocab=16",
    "target.d_model=16",
    "target.n_heads=2",
    "target.n_kv_heads=1",
    "target.d_mlp=32",
    "target.seq_len=8",
    "target.corpus_tokens=5000",
    "chunkwise.d_model=8",
    "chunkwise.n_heads=2",
    "chunkwise.mlp_hidden=16",
    "train.batch=8",
    "train.steps=50",
    # One loop body per iteration, not the preset's two: the programs compile in two thirds of
    # the time. `tests/test_scan_step.py` runs the preset's.
    "train.unroll=1",
    # No fresh adversary after training: one program less to compile per run
    # (tests/test_evaluation_tables.py and tests/test_whole_model.py run it).
    "eval.pgd_steps=[]",
]


def _lm(overrides: list[str] | None = None) -> tuple[RunConfig, Recipe]:
    """A tiny language-model config and its recipe."""
    config = load_config("tiny_llama", [*TINY_LM, *(overrides or [])])
    recipe = make_recipe(config)
    assert isinstance(recipe.target, Llama)
    return config, recipe


@functools.cache
def _frozen(recipe: Recipe) -> hk.Params:
    """Randomly initialized frozen weights (no training), made once per recipe: haiku's init op
    by op took 9 s here, its program 4."""
    assert isinstance(recipe.target, Llama)
    params: hk.Params = jax.jit(recipe.target.init)(jax.random.key(7))
    return params


def token_file(folder: Path) -> Path:
    """A token file of 4000 random ids below the tiny vocabulary: a model trained on a token file
    is accepted as is (no entropy-rate check), so `target.train_steps=20` is enough."""
    path = folder / "tokens.npy"
    np.save(path, np.random.default_rng(0).integers(0, 16, size=4000).astype(np.uint16))
    return path


@dataclass(frozen=True)
class LMRuns:
    """The overrides (after `TINY_LM`) of one token-file config, its run on 4 devices, and the
    same run on 1 device stopped by SIGTERM at step 3 and resumed on 4."""

    overrides: list[str]
    whole: RunResult
    resumed: RunResult


@pytest.fixture(scope="module")
def lm_runs(tmp_path_factory: pytest.TempPathFactory) -> LMRuns:
    folder = tmp_path_factory.mktemp("lm")
    overrides = [
        # Two kinds, in two groups of different shapes: a third of the compile of all seven.
        'target.kinds=["q","down"]',
        f'target.tokens="{token_file(folder)}"',
        "target.train_steps=20",
        "train.steps=6",
        "train.log_every=1",
        "train.faith_warmup_steps=2",
        "train.checkpoint_every=2",
        "eval.n_samples=16",
        "eval.batch=8",
        # S14's final ascent drops the coefficient, which 0.5 shows; batch-scoped sources are
        # the ones a mesh splits over its data axis (D4).
        "loss.adversary.coeff=0.5",
        "loss.adversary.n_warmup=2",
        "loss.adversary.scope=bsc",
    ]
    # The whole run is on 4 devices, as the resumed one, which finds its programs compiled. The
    # stopped run on 1 device starts from a state made by its placement's initializer, as the
    # tests below do, and compiles the programs they call.
    four = _lm([*overrides, "mesh.data=4"])[0]
    whole = run(four, folder / "whole")
    with sigterm_at(3):
        run(_lm(overrides)[0], folder / "moved")
    resumed = run(four, folder / "moved", resume=True)
    return LMRuns(overrides, whole, resumed)


def test_s25_kl_is_clean_to_masked_and_hand_computed() -> None:
    clean = jnp.log(jnp.asarray([[0.5, 0.5], [0.25, 0.75]]))
    masked = jnp.log(jnp.asarray([[0.9, 0.1], [0.25, 0.75]]))
    # KL(clean ‖ masked) per position, mean over the two positions (the second is 0).
    expected = (0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)) / 2
    reverse = (0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)) / 2
    got = float(kl(masked, clean))
    assert got == pytest.approx(expected, rel=1e-6)
    assert abs(got - reverse) > 0.01  # the direction matters on this pair
    _, recipe = _lm()
    assert recipe.divergence(masked, clean) == kl(masked, clean)


def test_s10_chunks_plan_takes_sequential_groups_of_k_with_routing() -> None:
    _, recipe = _lm()
    names = recipe.table.names
    assert len(names) == 14
    halves = recon_plan("chunks", recipe.table, 7)
    assert [e.live for e in halves] == [names[:7], names[7:]]
    assert all(e.routed for e in halves)
    fives = recon_plan("chunks", recipe.table, 5)
    assert [len(e.live) for e in fives] == [5, 5, 4]
    assert sum((e.live for e in fives), ()) == names


def test_p_anneals_from_2_to_0_4_over_the_run() -> None:
    config, _ = _lm()
    p = config.loss.p
    assert float(schedule_value(p, config.train.steps, 0)) == pytest.approx(2.0)
    assert float(schedule_value(p, config.train.steps, config.train.steps - 1)) == pytest.approx(
        0.4
    )


def test_s12_adversarial_term_with_fixed_sources_is_hand_computed() -> None:
    """TMS 5-2 with fixed V/U, CI and sources (no randomness) against NumPy."""
    recipe = make_recipe(load_config("tms_5-2", ["C=3", "loss.adversary.coeff=1.0"]))
    toy = as_toy(recipe.target)
    rng = np.random.default_rng(0)
    W1 = rng.normal(size=(5, 2)).astype(np.float32)
    b = rng.normal(size=5).astype(np.float32)
    frozen = toy.expand({"W1": jnp.asarray(W1), "b": jnp.asarray(b)})
    x = rng.uniform(size=(4, 5)).astype(np.float32)
    shapes = {"linear1": (5, 2), "linear2": (2, 5)}
    V = {n: rng.normal(size=(d, 3)).astype(np.float32) for n, (d, _) in shapes.items()}
    U = {n: rng.normal(size=(3, o)).astype(np.float32) for n, (_, o) in shapes.items()}
    ci = {n: rng.uniform(size=(4, 3)).astype(np.float32) for n in shapes}
    src = {n: rng.uniform(size=(1, 4)).astype(np.float32) for n in shapes}  # scope c: [1, C + 1]

    table = recipe.table
    comps = Components(
        tuple(jnp.stack([V[n] for n in g.names]) for g in table.groups),
        tuple(jnp.stack([U[n] for n in g.names]) for g in table.groups),
    )
    ci_lower = tuple(jnp.stack([ci[n] for n in g.names]) for g in table.groups)
    sources = tuple(jnp.stack([src[n] for n in g.names]) for g in table.c_groups)
    taps, clean = toy.taps(frozen, jnp.asarray(x))
    inp = PassInputs(frozen, jnp.asarray(x), comps, ci_lower, clean, taps)
    got = float(adversarial_recon(recipe, inp, sources))

    def site(n: str, h: np.ndarray, W: np.ndarray) -> np.ndarray:
        mask = ci[n] + (1 - ci[n]) * src[n][:, :3]  # S1, broadcast over the batch
        delta = src[n][:, 3:]
        inner = h @ V[n]
        out: np.ndarray = (inner * mask) @ U[n] + delta * (h @ W - inner @ U[n])
        return out

    h = site("linear1", x, W1)
    out = np.maximum(site("linear2", h, W1.T) + b, 0.0)
    ref = np.maximum((x @ W1) @ W1.T + b, 0.0)
    assert got == pytest.approx(float(np.mean((out - ref) ** 2)), rel=1e-5)


def _state_and_batch(
    overrides: list[str], preset: str = "tiny_llama"
) -> tuple[RunConfig, Recipe, hk.Params, TrainState, Array, jax.Array]:
    """`preset` with `overrides` (after `TINY_LM` for tiny_llama), randomly initialized frozen
    weights, its initial state and its first batch."""
    if preset == "tiny_llama":
        config, recipe = _lm(overrides)
        frozen = _frozen(recipe)
    else:
        config = load_config(preset, overrides)
        recipe = make_recipe(config)
        toy = as_toy(recipe.target)
        frozen = toy.expand(toy.init_train(jax.random.key(7)))
    init_key, src_key, run_key = key_tree(config.seed)
    state = ONE_DEVICE.init(recipe, init_key, src_key)  # placed as a run places it
    x = make_batches(config, recipe, run_key)(0)
    return config, recipe, frozen, state, x, run_key


def _copy(state: TrainState) -> TrainState:
    copied: TrainState = jax.tree.map(jnp.array, state)  # the step donates its input
    return copied


@pytest.mark.parametrize("n_warmup", [0, 2])
def test_s13_s14_warmup_ascents_then_the_final_ascent_on_pre_update_parameters(
    lm_runs: LMRuns, n_warmup: int
) -> None:
    """Two warmups on the language model (its step is the other tests'), none on TMS 5-2 (a
    language model's step of its own would take a minute to compile)."""
    if n_warmup:
        _, recipe, frozen, state, x, run_key = _state_and_batch(lm_runs.overrides)
    else:
        # A large learning rate: TMS's components must move enough in one step that the last
        # assertion (post-update components give other sources) can tell them apart.
        tms = ["loss.adversary.coeff=0.5", "loss.adversary.n_warmup=0", "train.lr.start=0.1"]
        _, recipe, frozen, state, x, run_key = _state_and_batch(tms, "tms_5-2")
    assert (recipe.loss.adversary.coeff, recipe.loss.adversary.n_warmup) == (0.5, n_warmup)
    adv = recipe.loss.adversary
    step = make_train_step(recipe)
    # One step first, so that Adam's moments hold history: a first Adam step is ±lr whatever the
    # gradient's size, which could not tell pre-update from post-update parameters apart.
    state, _ = step(_copy(state), frozen, x, run_key)
    comps = state.components
    taps, clean = jax.jit(recipe.target.taps)(frozen, x)
    ci = ci_program(recipe)(state.ci_params, comps, frozen, x)[0]
    lr = schedule_value(adv.lr, recipe.train.steps, 1)

    @jax.jit  # one compile for both calls; op by op, the reference took most of the test's time
    def ascents(
        comps: Components, ci_lower: tuple[Float[Array, "..."], ...]
    ) -> tuple[Sources, SourceAdam]:
        inp = PassInputs(frozen, x, comps, ci_lower, clean, taps)

        def ascent(_: int, carry: tuple[Sources, SourceAdam]) -> tuple[Sources, SourceAdam]:
            sources, opt = carry
            g = jax.grad(lambda s: adversarial_recon(recipe, inp, s))(sources)
            return ascend(sources, opt, g, lr, adv.beta1, adv.beta2, adv.eps)

        # The warmups and the final ascent, one Adam state (a loop: one body to compile).
        out: tuple[Sources, SourceAdam] = jax.lax.fori_loop(
            0, n_warmup + 1, ascent, (state.sources, state.source_opt)
        )
        return out

    expected, _ = ascents(comps, ci.lower)
    new, _ = step(_copy(state), frozen, x, run_key)
    assert int(np.asarray(new.source_opt.count)) == 2 * (n_warmup + 1)
    for a, b in zip(new.sources, expected, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # With the post-update components the sources would differ: the test can tell them apart.
    post = ci_program(recipe)(new.ci_params, new.components, frozen, x)[0]
    other, _ = ascents(new.components, post.lower)
    assert any(not np.allclose(a, b, atol=1e-6) for a, b in zip(new.sources, other, strict=True))


def test_s18_compiled_step_holds_no_large_constant(lm_runs: LMRuns) -> None:
    """The frozen weights are an argument: no array of a weight's size is baked into the HLO."""
    _, recipe, frozen, state, x, run_key = _state_and_batch(lm_runs.overrides)
    step = make_train_step(recipe)
    text = step.lower(state, frozen, x, run_key).as_text()  # type: ignore[attr-defined]  # jit's lower
    sizes = []
    for shape in re.findall(
        r"stablehlo\.constant dense<[^>]*>\s*:\s*tensor<([0-9x]+)x?[a-z]", text
    ):
        dims = [int(d) for d in shape.split("x") if d]
        sizes.append(math.prod(dims))
    smallest_weight = min(int(np.prod(w.shape)) for w in recipe.target.weights(frozen).values())
    assert max(sizes, default=0) < smallest_weight


def _trajectory(config: RunConfig, recipe: Recipe, frozen: hk.Params) -> list[dict[str, float]]:
    placement = placement_of(config)
    init_key, src_key, run_key = key_tree(config.seed)
    state = placement.init(recipe, init_key, src_key)
    frozen = placement.frozen(recipe.target, frozen)
    step = make_train_step(recipe, placement.shardings(recipe))
    batches = make_batches(config, recipe, run_key, placement)
    out = []
    for s in range(3):
        state, metrics = step(state, frozen, batches(s), run_key)
        out.append(flat_metrics(recipe.table, jax.device_get(metrics)))
    V0 = state.components.V[0]
    assert len(V0.sharding.device_set) == config.mesh.data  # really spread over the mesh
    return out


def test_d4_three_steps_on_1_and_4_devices_agree(lm_runs: LMRuns) -> None:
    config1, recipe = _lm(lm_runs.overrides)
    config4, recipe4 = _lm([*lm_runs.overrides, "mesh.data=4"])
    frozen = _frozen(recipe)
    assert config1.loss.adversary.scope == "bsc"
    one = _trajectory(config1, recipe, frozen)
    four = _trajectory(config4, recipe4, frozen)
    for a, b in zip(one, four, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            x, y = float(a[k]), float(b[k])
            assert abs(x - y) <= 1e-4 * abs(x) + 1e-7, (k, x, y)


def test_ci_of_the_chunkwise_function_is_squashed_per_group(lm_runs: LMRuns) -> None:
    _, recipe, frozen, state, x, _ = _state_and_batch(lm_runs.overrides)
    ci, clean = ci_program(recipe)(state.ci_params, state.components, frozen, x)
    assert clean.shape == (8, 8, 16)
    assert [c.shape for c in ci.lower] == [(len(g.names), 8, 8, g.C) for g in recipe.table.groups]
    again = squash(ci.logits)
    for a, b in zip(again.lower, ci.lower, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    mask, delta = make_mask(ci.lower[0][0], jnp.zeros((8, 8, recipe.table.groups[0].C + 1)))
    np.testing.assert_array_equal(np.asarray(mask), np.asarray(ci.lower[0][0]))
    assert float(jnp.abs(delta).max()) == 0.0


def test_a_language_model_run_from_a_token_file(lm_runs: LMRuns) -> None:
    """End to end on a tiny budget: the token-file path, LM evaluation, the run folder."""
    for result in (lm_runs.whole, lm_runs.resumed):
        summary = json.loads((result.run_dir / "summary.json").read_text())
        for kind in ("ci_masked", "unmasked", "stochastic", "zero_masked", "adversarial"):
            assert math.isfinite(summary[f"kl/{kind}"]) and summary[f"kl/{kind}"] >= 0.0, kind
            assert math.isfinite(summary[f"ce/{kind}"]), kind
        assert summary["kl_ratio/ci_masked_vs_zero"] == pytest.approx(
            summary["kl/ci_masked"] / summary["kl/zero_masked"]
        )
        assert {f"ci_l0/{n}" for n in result.recipe.table.names} <= summary.keys()
        assert (result.run_dir / "ci_sequence.png").read_bytes()[:4] == b"\x89PNG"
    # The whole run compiled each program once: the step and monitor programs compiled ahead
    # (pd/train/ahead.py) are the ones the loop calls. The resumed run, of the same recipe on
    # the same devices in this process, compiled none: it called the whole run's programs.
    compiled = json.loads((lm_runs.whole.run_dir / "compile.json").read_text())
    resumed = json.loads((lm_runs.resumed.run_dir / "compile.json").read_text())
    assert "init_train_state" in compiled
    for jit_name in ("train_step", "monitor_step", "eval_step"):
        assert compiled[jit_name]["compiles"] == 1, jit_name
        assert resumed.get(jit_name, {"compiles": 0})["compiles"] == 0, jit_name
    loaded = pd.load(lm_runs.resumed.run_dir)  # config.json round-trips, kind_C zeros included
    ci = loaded.ci(jnp.zeros((2, 8), jnp.int32))
    assert ci["layers.1.mlp.down"].shape == (2, 8, 4)
    np.testing.assert_allclose(
        np.asarray(loaded.V["layers.0.attn.q"]),
        np.asarray(
            lm_runs.resumed.recipe.table.view(lm_runs.resumed.state.components.V, "layers.0.attn.q")
        ),
    )


def test_a_language_model_run_on_1_device_resumes_on_4(lm_runs: LMRuns) -> None:
    """The run stopped at step 3 on 1 device and resumed on 4 ends where the whole run on 4
    ends, its state and every logged step equal to D4's 1e-4 relative: its first three steps
    ran on 1 device, whose reductions (the divergence's over a vocabulary split over 4 devices)
    are ordered differently, and the sources' Adam ascent divides each element's step by its
    own gradient's size, which turns a float-level difference into a 1e-5 one."""
    whole, resumed = lm_runs.whole, lm_runs.resumed
    assert len(whole.state.components.V[0].sharding.device_set) == 4
    assert len(resumed.state.components.V[0].sharding.device_set) == 4
    for x, y in zip(jax.tree.leaves(whole.state), jax.tree.leaves(resumed.state), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5)
    rows = [metric_rows(whole), metric_rows(resumed)]
    assert [r["step"] for r in rows[1]] == list(range(6))
    for a, b in zip(*rows, strict=True):
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key


def test_compile_only_lowers_init_and_step_on_abstract_inputs() -> None:
    # Two kinds in two groups, as the runs above: a third of the compile of all seven
    # (`tests/test_scan_step.py` compiles the preset's seven).
    config = load_config("tiny_llama", [*TINY_LM, 'target.kinds=["q","down"]', "mesh.data=4"])
    report = compile_only(config)
    times = report.times
    assert report.flops["train_step"] > 0
    m = report.step_memory
    assert m is not None and m.arguments > 0 and m.temporaries > 0
    for name in ("init_train_state", "train_step"):
        assert times.by_name[name]["compile_s"] > 0.0, name
    # What `--compile-only` prints: a function under the threshold is counted, and no file it
    # does not write is named.
    table = times.table(min_total_s=1e9, written="")
    assert "more under 1000000000.0 s)" in table and "compile.json" not in table
    assert "in compile.json)" in times.table(min_total_s=1e9)


def test_a_mesh_that_does_not_divide_stops_before_compiling() -> None:
    config = load_config("tiny_llama", [*TINY_LM, "target.d_mlp=30", "mesh.data=4"])
    with pytest.raises(ShardingError, match=r"axis 'd_in' of size 30 does not divide"):
        state_shardings(make_recipe(config), make_mesh({"data": 4, "model": 1}))


@pytest.mark.parametrize(
    "layers",
    [[], ["target.n_layers=4", "target.layers=[1, 3]"]],
    ids=["every layer", "layers 1 and 3 of 4"],
)
def test_the_layer_scan_adding_into_the_running_gradient_takes_the_same_steps(
    layers: list[str],
) -> None:
    """With `remat = "full"` each masked pass's backward adds into the running gradient in place
    (`pd.loops.scan_adding`): two steps (every pass kind: the chunk plan, the adversarial term
    with a warmup ascent) equal those of the plain backward (`remat = "none"`), with a model
    decomposed in every layer and in some, where layers without sites lie inside the scan. Two
    kinds, one in attention and one in the MLP, in two groups: a third of the compiles of all
    seven."""
    kinds = 'target.kinds=["q","down"]'
    common = [*layers, kinds, "loss.adversary.coeff=0.5", "loss.adversary.n_warmup=1"]
    states = []
    for remat in ("none", "full"):
        _, recipe, frozen, state, x, run_key = _state_and_batch([*common, f"target.remat={remat}"])
        assert recipe.target.adds_into == (remat == "full")
        step = make_train_step(recipe)
        for _ in range(2):
            state, _ = step(state, frozen, x, run_key)
        states.append(jax.device_get(state))
    plain, adding = states
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(plain), jax.tree.leaves(adding), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8, err_msg=jax.tree_util.keystr(path))
