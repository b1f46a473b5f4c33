"""§5: faithfulness (S17), importance minimality (S7/S8), MSE, recon plans and routing (S10/S11)."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd.losses import faithfulness, importance_terms, mse, recon_plan, uniform_k_routing
from pd.sites import SiteSpec, SiteTable


def test_s17_faithfulness_hand_computed() -> None:
    # Two groups: W − V U = [[1, 0], [0, 0]] (one site) and [[2], [1]] / [[1]] (two sites).
    W0 = jnp.asarray([[[1.0, 0.0], [0.0, 1.0]]])
    V0 = jnp.asarray([[[0.0], [1.0]]])
    U0 = jnp.asarray([[[0.0, 1.0]]])
    W1 = jnp.asarray([[[2.0], [1.0]], [[1.0], [1.0]]])
    V1 = jnp.zeros((2, 2, 1))
    U1 = jnp.zeros((2, 1, 1))
    got = faithfulness((W0, W1), (V0, V1), (U0, U1))
    # squared errors: 1 + (4 + 1) + (1 + 1) = 8 over 4 + 2 + 2 = 8 elements.
    assert float(got) == pytest.approx(8.0 / 8.0)


def test_s7_importance_is_per_site_mean_over_positions_of_powered_upper() -> None:
    # one group, two sites, 2 positions, C = 2
    upper = jnp.asarray([[[0.5, 0.0], [1.0, 0.25]], [[0.0, 0.0], [1.0, 1.0]]])
    lp, freq = importance_terms((upper,), jnp.float32(2.0), 0.0, 1.0)
    f = np.asarray([[(0.25 + 1.0) / 2, (0.0 + 0.0625) / 2], [(0.0 + 1.0) / 2, (0.0 + 1.0) / 2]])
    assert float(lp) == pytest.approx(f.sum())
    assert float(freq) == pytest.approx(float(np.sum(f * np.log2(1 + f))))


def test_s8_frequency_uses_global_f_inside_the_log_per_site() -> None:
    # Site A is used half the time, site B always: merging sites or splitting the batch before the
    # log would give a different value than the per-(site, c) global f.
    upper = jnp.asarray([[[1.0], [0.0]], [[1.0], [1.0]]])
    a = 100.0
    _, freq = importance_terms((upper,), jnp.float32(1.0), 0.0, a)
    expected = 0.5 * math.log2(1 + a * 0.5) + 1.0 * math.log2(1 + a * 1.0)
    assert float(freq) == pytest.approx(expected, rel=1e-6)


def test_s7_eps_and_p_schedule_value_are_applied() -> None:
    upper = jnp.zeros((1, 3, 2))
    lp, _ = importance_terms((upper,), jnp.float32(0.5), 1e-4, 1.0)
    assert float(lp) == pytest.approx(2 * (1e-4) ** 0.5, rel=1e-5)


def test_mse_is_sum_of_squares_over_elements() -> None:
    assert float(mse(jnp.asarray([[1.0, 2.0]]), jnp.asarray([[0.0, 0.0]]))) == pytest.approx(2.5)


def _table() -> SiteTable:
    return SiteTable((SiteSpec("a", 3, 2, 4), SiteSpec("b", 2, 3, 4), SiteSpec("c", 3, 2, 4)))


def test_s10_plans() -> None:
    table = _table()
    (everything,) = recon_plan("all", table)
    assert everything.live == ("a", "b", "c") and not everything.routed
    per_site = recon_plan("per_site", table)
    assert [e.live for e in per_site] == [("a",), ("b",), ("c",)]
    (subset,) = recon_plan("subset", table)
    assert subset.routed and subset.live == table.names


def test_s11_uniform_k_routing_k_is_uniform_and_every_subset_reachable() -> None:
    n_live, n = 3, 60_000
    routes = np.asarray(uniform_k_routing(jax.random.key(0), (n,), n_live))
    k = routes.sum(axis=-1)
    counts = np.bincount(k, minlength=n_live + 1)
    assert counts[0] == 0  # k >= 1: some site is always routed
    # each k in {1, 2, 3} has probability 1/3: within 5 standard deviations
    sd = math.sqrt(n * (1 / 3) * (2 / 3))
    assert np.all(np.abs(counts[1:] - n / 3) < 5 * sd)
    # given k, each k-subset is equally likely: every one of the 7 non-empty subsets appears
    seen = {tuple(r) for r in routes}
    expected = {s for s in itertools.product([False, True], repeat=n_live) if any(s)}
    assert seen == expected
    for size in (1, 2):
        rows = routes[k == size]
        per_site = rows.mean(axis=0)  # each site is in a uniform k-subset with prob size / n_live
        assert np.allclose(per_site, size / n_live, atol=0.02)
