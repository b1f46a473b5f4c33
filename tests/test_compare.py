"""Seed consistency (`pd.compare`): the factorized cosine and the command's errors; two TMS runs
matching each other is in test_convergence.py, beside the runs."""

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from pd.train.compare import main, rank_one_cosines


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


def test_a_folder_that_is_not_a_run_is_one_sentence_and_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(tmp_path), str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "config.json" in err and "\n" not in err
