"""`run()` with a target of the caller's own (`OwnTarget`): a haiku MLP written the plain way,
its sites chosen by module-name patterns, decomposed end to end without presets or target
training; the generic evaluation (divergence under each mask kind, CI-L0, alive) and figures."""

import json
from pathlib import Path

import haiku as hk
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from pd.targets.haiku import haiku_target
from pd.train import load_config
from pd.train.run import OwnTarget, run

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
    result = run(config, tmp_path / "own", own=OwnTarget(target, params, sparse))
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
