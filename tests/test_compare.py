"""Seed consistency (`pd.compare`): the factorized cosine, and two TMS runs that recovered the
same features matching each other while a decomposition with shuffled V columns does not."""

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pd
from pd.train import load_config
from pd.train.compare import compare, main, rank_one_cosines
from pd.train.decomposition import Decomposition
from pd.train.sweep import seed_sweep, sweep


def test_the_factorized_cosine_equals_the_cosine_of_the_materialized_matrices() -> None:
    rng = np.random.default_rng(0)
    Va, Ua = rng.normal(size=(7, 4)), rng.normal(size=(4, 5))
    Vb, Ub = rng.normal(size=(7, 3)), rng.normal(size=(3, 5))
    got = np.asarray(rank_one_cosines(*(jnp.asarray(x, jnp.float32) for x in (Va, Ua, Vb, Ub))))
    for c in range(4):
        for d in range(3):
            A, B = np.outer(Va[:, c], Ua[c]), np.outer(Vb[:, d], Ub[d])
            want = abs(np.sum(A * B)) / (np.linalg.norm(A) * np.linalg.norm(B))
            assert got[c, d] == pytest.approx(want, abs=1e-6)


def _shuffled_V(d: Decomposition, seed: int) -> Decomposition:
    """`d` with the columns of every V permuted (U kept): each rank-1 piece pairs a V column
    with another subcomponent's U row."""
    perm = np.random.default_rng(seed).permutation
    V = tuple(v[..., perm(v.shape[-1])] for v in d.components.V)
    return dataclasses.replace(d, components=d.components._replace(V=V))


@pytest.mark.slow
def test_two_tms_runs_that_recovered_the_features_find_each_others_subcomponents(
    tmp_path: Path,
) -> None:
    # Seeds 0 and 1 of the default job both recover all five features (README's results).
    config = load_config("tms_5-2", ["eval.n_samples=20000", "eval.figures=false"])
    out = tmp_path / "sweep"
    result = sweep(seed_sweep(config, [0, 1]), out, devices=jax.devices()[:1])
    for member in result.members:
        for site in ("linear1", "linear2"):
            assert member.summary[f"identity_ci_error_0.1/{site}"] == 0.0, member.summary
    a, b = pd.load(out / "seed-0"), pd.load(out / "seed-1")
    same, shuffled = compare(a, b), compare(a, _shuffled_V(b, seed=0))
    assert set(same.sites) == {"linear1", "linear2"}
    # Where the target fixes each feature's piece (`linear1`: row i of W is feature i's
    # direction), the two runs find the same pieces, and shuffling V breaks them. `linear2`'s
    # pieces are not fixed by the target: a feature's piece may write anything into the outputs
    # that the ReLU clips, so the runs differ there; each of A's pieces still has a partner of
    # its own in B, closer than after shuffling (whose 2-d V columns keep a high |cosine|).
    assert a.known is not None and a.known.feature_sites == ("linear1",)
    assert same.sites["linear1"].min >= 0.99, same.table()
    assert shuffled.sites["linear1"].mean < 0.5, shuffled.table()
    for site, match in same.sites.items():
        assert match.a.size == 5 and match.alive_b == 5, site
        assert len(set(match.b.tolist())) == 5, same.table()  # one partner each
        assert shuffled.sites[site].mean < match.mean, (same.table(), shuffled.table())
    assert main([str(out / "seed-0"), str(out / "seed-1")]) == 0


def test_a_folder_that_is_not_a_run_is_one_sentence_and_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(tmp_path), str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "config.json" in err and "\n" not in err
