"""`run()` with a target of the caller's own (`OwnTarget`): a haiku MLP written the plain way,
its sites chosen by module-name patterns, decomposed end to end without presets or target
training; the generic evaluation (divergence under each mask kind, CI-L0, alive) and figures."""

import dataclasses
import json
from pathlib import Path

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float

import pd
from pd.init import key_tree
from pd.targets.configs import TMSConfig
from pd.targets.haiku_model import haiku_target
from pd.targets.train import load_or_train
from pd.train import KnownAnswer, OwnTarget, load_config, run
from pd.train.config import ConfigError
from pd.train.step import make_sampler, make_train_step, make_train_steps

N = 8  # sparse features in, N outputs


def mlp(x: Float[Array, "B 8"]) -> Float[Array, "B 8"]:
    return hk.nets.MLP([16, N], name="mlp")(x)


def sparse(step: int, batch: int = 256) -> Float[Array, "B 8"]:
    """Each feature present with probability 0.1, uniform in [0, 1]: a pure function of step."""
    key = jax.random.fold_in(jax.random.key(7), step)
    on = jax.random.bernoulli(jax.random.fold_in(key, 0), 0.1, (batch, N))
    return jnp.where(on, jax.random.uniform(jax.random.fold_in(key, 1), (batch, N)), 0.0)


def test_a_users_haiku_mlp_is_decomposed_through_run(tmp_path: Path) -> None:
    params = hk.transform(mlp).init(jax.random.key(0), sparse(0))
    target = haiku_target(mlp, params, sparse(0), {"mlp/~/linear_*": 12})
    config = load_config(
        "tms_5-2",
        [
            "train.steps=1000",
            "train.log_every=100",
            "eval.n_samples=1024",
            "eval.batch=256",
            "loss.importance=1e-5",
        ],
    )
    own = OwnTarget(target, params, sparse, jittable=True)
    result = run(config, tmp_path / "own", own=own)
    folder = tmp_path / "own"
    for name in ("metrics.jsonl", "summary.json", "decomposition.npz", "ci_sequence.png"):
        assert (folder / name).is_file(), name
    summary = json.loads((folder / "summary.json").read_text())
    assert summary == result.summary
    assert set(target.table.names) == {"mlp/~/linear_0", "mlp/~/linear_1"}
    for site in target.table.names:
        assert 0 < summary[f"ci_l0/{site}"] < 12 and summary[f"alive/{site}"] >= 1
    # The decomposition stands in for the network: far closer than deleting the sites.
    assert summary["mse/ci_masked"] < 0.2 * summary["mse/zero_masked"], summary
    assert summary["mse/unmasked"] < 0.2 * summary["mse/zero_masked"], summary
    assert "identity_ci_error_0.1/mlp/~/linear_0" not in summary  # no known answer declared

    # `jittable`: the run drew `sparse(step)` inside `train_steps` (compiled once, no program
    # per step), and three more of its steps equal three `train_step` calls given the batches,
    # as a run takes them when its batches are not declared jittable (1e-5).
    programs = result.compile_times.by_name
    assert programs["train_steps"]["compiles"] == 1 and "train_step" not in programs
    sample = result.kind.sampler(result.recipe.target, config.train.batch)
    assert sample is not None
    steps = make_train_steps(result.recipe, sample)  # the run's own program
    one, run_key = make_train_step(result.recipe), key_tree(config.seed)[2]
    drawn = steps(jax.tree.map(jnp.copy, result.state), params, run_key, jnp.int32(3))[0]
    given = jax.tree.map(jnp.copy, result.state)
    for s in range(1000, 1003):
        given = one(given, params, sparse(s), run_key)[0]
    assert int(drawn.step) == int(given.step) == 1003
    for a, b in zip(jax.tree.leaves(drawn), jax.tree.leaves(given), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_a_target_factory_named_in_the_config_is_run_and_loaded(tmp_path: Path) -> None:
    # `pd.testing.tiny_target` is such a function: no arguments, an OwnTarget back.
    short = ["train.steps=3", "train.faith_warmup_steps=2", "eval.n_samples=256", "eval.batch=256"]
    config = load_config("tms_5-2", [*short, 'target={factory="pd.testing:tiny_target"}'])
    result = run(config, tmp_path / "factory")
    loaded = pd.load(tmp_path / "factory")  # the factory rebuilds the target; weights checked
    assert (
        loaded.sites == ("mlp/~/linear_0", "mlp/~/linear_1") and "mse/ci_masked" in result.summary
    )
    x = loaded.batch(1)
    np.testing.assert_array_equal(
        np.asarray(loaded.ci(x)["mlp/~/linear_1"]),
        np.asarray(result.decomposition.ci(x)["mlp/~/linear_1"]),
    )
    for spec, says in (
        ("pd.testing", "expected 'package.module:function'"),
        ("no_such_module:build", "whose module cannot be imported"),
        ("pd.testing:absent", "has no function 'absent'"),
        ("os:getcwd", "returned a str, expected a pd.train.OwnTarget"),
    ):
        with pytest.raises(ConfigError, match=says):
            run(load_config("tms_5-2", [*short, f'target={{factory="{spec}"}}']), tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_a_target_given_in_python_is_given_again_to_load(tmp_path: Path) -> None:
    params = hk.transform(mlp).init(jax.random.key(0), sparse(0))
    own = OwnTarget(haiku_target(mlp, params, sparse(0), {"mlp/~/linear_0": 4}), params, sparse)
    short = ["train.steps=3", "train.faith_warmup_steps=2", "eval.n_samples=256", "eval.batch=256"]
    run(load_config("tms_5-2", short), tmp_path / "given", own=own)
    # config.json records what the run used: the target's C and its batches' size, not the
    # preset's (which a caller's target does not read).
    recorded = json.loads((tmp_path / "given" / "config.json").read_text())
    assert recorded["C"] == 4 and recorded["train"]["batch"] == len(sparse(0))
    assert recorded["target"]["kind"] == "own"
    with pytest.raises(ConfigError, match=r"must be given again: pd\.load\(run_dir, own=\.\.\.\)"):
        pd.load(tmp_path / "given")
    assert pd.load(tmp_path / "given", own=own).sites == ("mlp/~/linear_0",)
    other = jax.tree.map(lambda a: a + 1.0, params)
    with pytest.raises(ValueError, match=r"frozen weights .* are not the ones"):
        pd.load(tmp_path / "given", own=dataclasses.replace(own, frozen=other))


def test_batches_declared_jittable_that_do_not_trace_stop_before_any_compile(
    tmp_path: Path,
) -> None:
    params = hk.transform(mlp).init(jax.random.key(0), sparse(0))
    target = haiku_target(mlp, params, sparse(0), {"mlp/~/linear_0": 4})

    def host(step: int) -> Float[Array, "16 8"]:  # drawn by numpy: the step must be an int
        return jnp.asarray(np.random.default_rng(step).random((16, N), dtype=np.float32))

    config = load_config("tms_5-2", ["train.steps=3"])
    with pytest.raises(
        ConfigError, match=r"OwnTarget\.jittable is True but batches\(step\) cannot be traced"
    ):
        run(config, tmp_path / "host", own=OwnTarget(target, params, host, jittable=True))
    assert not (tmp_path / "host").exists()


def tms(x: Float[Array, "B 5"]) -> Float[Array, "B 5"]:
    """TMS 5-2 the plain haiku way: two hk.Linear layers and a ReLU."""
    h = hk.Linear(2, with_bias=False, name="linear1")(x)
    return jax.nn.relu(hk.Linear(5, name="linear2")(h))


@pytest.mark.slow
def test_tms_written_with_hk_linear_recovers_every_feature(tmp_path: Path) -> None:
    # pd's own trained TMS 5-2 weights in hk.Linear modules (linear2's w is linear1's
    # transpose, as TMS ties them), its feature sampler as the caller's batches.
    cfg = TMSConfig()
    toy = cfg.build(20)
    W1, b = (load_or_train(cfg, toy).params["~"][k] for k in ("linear1", "b"))
    params = {"linear1": {"w": W1}, "linear2": {"w": W1.T, "b": b}}
    x0 = toy.sample(jax.random.key(0), 8)
    target = haiku_target(tms, params, x0, {"linear*": 20})
    sample, run_key = make_sampler(toy, 1024), key_tree(0)[2]
    own = OwnTarget(
        target,
        params,
        lambda step: sample(run_key, jnp.asarray(step, jnp.int32)),
        known=KnownAnswer(5, feature_sites=("linear1",)),
        jittable=True,  # the steps between logged steps as one call, as for pd's own toys
    )
    config = load_config("tms_5-2", ["eval.n_samples=20480", "eval.batch=1024"])
    summary = run(config, tmp_path / "tms", own=own).summary
    for site in ("linear1", "linear2"):
        assert summary[f"identity_ci_error_0.1/{site}"] == 0.0, summary
        assert summary[f"alive/{site}"] == 5.0, summary
    assert summary["mmcs/linear1"] >= 0.99 and 0.95 <= summary["ml2r/linear1"] <= 1.05, summary
    assert (tmp_path / "tms" / "ci_probes.png").is_file()
