"""§12: toy targets train in-process, pass their task check, and are cached by config hash."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd.decompose import FROZEN, Draw, Sites, decomposed_hook, layer_sites
from pd.init import init_vu
from pd.targets.configs import ResidMLPConfig, TMSConfig
from pd.targets.train import _cache_key, load_or_train, train_target

SMALL_TMS = TMSConfig(n_features=5, n_hidden=2, train_steps=2000, train_batch=1024)


def test_tms_learns_every_feature_and_records_the_attempt() -> None:
    target = SMALL_TMS.build(C=4)
    trained = train_target(target, SMALL_TMS.training, SMALL_TMS.seed)
    norms = np.linalg.norm(np.asarray(trained.params["~"]["linear1"]), axis=1)
    assert np.all(np.abs(norms - 1.0) < 0.25)
    assert target.check(trained.params, trained.loss) is None
    assert trained.attempt >= 0 and not trained.from_cache


def test_a_broken_tms_is_rejected() -> None:
    target = SMALL_TMS.build(C=4)
    W1 = jnp.asarray([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [-1.0, 0.0], [0.0, -1.0]])
    params = target.expand({"W1": W1, "b": jnp.zeros(5)})
    reason = target.check(params, loss=0.001)
    assert reason is not None and "feature norms" in reason


def test_cache_is_reused_and_a_corrupt_file_is_retrained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PD_CACHE_DIR", str(tmp_path))
    cfg = TMSConfig(n_features=5, n_hidden=2, train_steps=1500, train_batch=1024, seed=3)
    target = cfg.build(C=4)
    first = load_or_train(cfg, target)
    second = load_or_train(cfg, target)
    assert not first.from_cache and second.from_cache
    for name, value in first.params["~"].items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(second.params["~"][name]))
    npz = tmp_path / "targets" / f"{_cache_key(cfg)}.npz"
    data = bytearray(npz.read_bytes())
    data[len(data) // 2] ^= 0xFF  # flip one byte
    npz.write_bytes(bytes(data))
    third = load_or_train(cfg, target)
    assert not third.from_cache  # detected and retrained, never trusted
    fourth = load_or_train(cfg, target)
    assert fourth.from_cache and fourth.attempt == third.attempt  # the retrained one was saved


def test_resid_mlp_forward_taps_and_label() -> None:
    cfg = ResidMLPConfig(n_features=6, d_embed=8, d_mlp=3, n_layers=2)
    target = cfg.build(C=5)
    assert target.table.names == (
        "layers.0.mlp_in",
        "layers.0.mlp_out",
        "layers.1.mlp_in",
        "layers.1.mlp_out",
    )
    params = target.expand(target.init_train(jax.random.key(0)))
    x = target.sample(jax.random.key(1), 16)
    assert float(jnp.max(jnp.abs(x))) <= 1.0
    taps, clean = target.taps(params, x)
    p = params["~"]
    assert p["mlp_in"].shape == (2, 8, 3) and p["mlp_out"].shape == (2, 3, 8)  # layer-stacked
    r = x @ p["embed"]
    for i in range(2):
        np.testing.assert_allclose(np.asarray(taps["in.mlp_in"][i]), np.asarray(r), atol=1e-6)
        hidden = jax.nn.relu(r @ p["mlp_in"][i])
        np.testing.assert_allclose(np.asarray(taps["in.mlp_out"][i]), np.asarray(hidden), atol=1e-6)
        r = r + hidden @ p["mlp_out"][i]
    np.testing.assert_allclose(np.asarray(clean), np.asarray(r @ p["embed"].T), atol=1e-5)
    np.testing.assert_allclose(
        np.asarray(target.forward(params, x, FROZEN)), np.asarray(clean), atol=1e-6
    )
    np.testing.assert_array_equal(np.asarray(target.label(x)), np.asarray(x + jax.nn.relu(x)))


def test_resid_mlp_resumed_from_the_clean_embedding_equals_the_whole_masked_forward() -> None:
    """`resume` starts at layer 0 from the clean pass's embedding tap: the same masked output
    as `forward` and the same gradient on V."""
    target = ResidMLPConfig(n_features=6, d_embed=8, d_mlp=3, n_layers=2).build(C=5)
    params = target.expand(target.init_train(jax.random.key(0)))
    x = jax.random.uniform(jax.random.key(1), (16, 6), minval=-1.0, maxval=1.0)  # dense
    taps, _ = target.taps(params, x)
    table = target.table
    comps = init_vu(jax.random.key(2), table)
    ci = tuple(
        jax.random.uniform(jax.random.key(3 + g), (len(grp.names), 16, grp.C))
        for g, grp in enumerate(table.groups)
    )

    def out(V: tuple[jax.Array, ...], resumed: bool) -> jax.Array:
        sites = Sites(decomposed_hook(Draw(jax.random.key(4))), layer_sites(table, V, comps.U, ci))
        if resumed:
            return target.resume(params, x, taps, sites)
        return target.forward(params, x, sites)

    whole, resumed = (out(comps.V, r) for r in (False, True))
    assert float(jnp.std(whole)) > 0.1
    np.testing.assert_allclose(np.asarray(resumed), np.asarray(whole), rtol=1e-5, atol=1e-6)
    for a, b in zip(
        *(jax.grad(lambda V, r=r: jnp.sum(jnp.sin(out(V, r))))(comps.V) for r in (False, True)),
        strict=True,
    ):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)


def test_a_target_pd_did_not_train_says_where_it_came_from() -> None:
    """The run's log line "target ready (…)" for a caller's target names it as given, not as a
    training attempt with a loss of nan."""
    from pd.testing import tiny_target
    from pd.train.kinds import OwnKind

    own = tiny_target()
    trained = OwnKind(own).load_frozen(own.target)
    assert trained.describe() == "given in Python" and trained.params is own.frozen
    assert "nan" not in trained.describe()
