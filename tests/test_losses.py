"""§5: faithfulness (S17), importance minimality (S7/S8), MSE, recon plans and routing (S10/S11)."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd.losses import (
    faithfulness,
    importance_terms,
    mse,
    plan_arrays,
    recon_plan,
    uniform_k_routing,
)
from pd.sites import SiteSpec, SiteTable


def test_s17_faithfulness_hand_computed() -> None:
    # Kind "a" (one layer): W − V U = [[1, 0], [0, 0]]; kind "b" in layers 0 and 2 of a 3-layer
    # target: [[2], [1]] and [[1], [1]] (its layer-1 weight is not a site and must not count).
    table = SiteTable(
        (
            SiteSpec("a0", 2, 2, 1, 0, "a"),
            SiteSpec("b0", 2, 1, 1, 0, "b"),
            SiteSpec("b2", 2, 1, 1, 2, "b"),
        ),
        depth=3,
    )
    Wa = jnp.asarray([[[1.0, 0.0], [0.0, 1.0]]] * 3)
    Wb = jnp.asarray([[[2.0], [1.0]], [[9.0], [9.0]], [[1.0], [1.0]]])
    V = (jnp.asarray([[[0.0], [1.0]]]), jnp.zeros((2, 2, 1)))
    U = (jnp.asarray([[[0.0, 1.0]]]), jnp.zeros((2, 1, 1)))
    got = faithfulness(table, {"a": Wa, "b": Wb}, V, U)
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
    routes = np.asarray(uniform_k_routing(jax.random.key(0), (n,), n_live, n_live))
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


def test_s11_a_shorter_entry_routes_only_its_own_sites_and_equals_a_full_width_draw() -> None:
    """An entry with fewer sites than the plan's widest (the last of chunks(k)) routes among
    its own columns only; an entry of full width draws exactly what a width-n draw gives."""
    key, n = jax.random.key(1), 20_000
    padded = np.asarray(uniform_k_routing(key, (n,), 4, jnp.int32(2)))
    assert not padded[:, 2:].any()
    assert np.all(padded[:, :2].sum(axis=-1) >= 1)
    assert abs(padded[:, :2].sum(axis=-1).mean() - 1.5) < 0.02  # k uniform on {1, 2}
    full = uniform_k_routing(key, (n,), 3, jnp.int32(3))
    np.testing.assert_array_equal(np.asarray(full), np.asarray(uniform_k_routing(key, (n,), 3, 3)))


def test_s10_plan_arrays_mark_each_entrys_sites_and_route_columns() -> None:
    table = SiteTable(
        tuple(SiteSpec(f"l{i}.{k}", 2, 2, 3, i, k) for i in range(3) for k in ("p", "q")), depth=3
    )
    plan = plan_arrays(recon_plan("chunks", table, 4), table)  # [l0.p l0.q l1.p l1.q], [l2.*]
    np.testing.assert_array_equal(np.asarray(plan.n_live), [4, 2])
    np.testing.assert_array_equal(np.asarray(plan.live["p"]), [[1, 1, 0], [0, 0, 1]])
    np.testing.assert_array_equal(np.asarray(plan.column["q"]), [[1, 3, 0], [0, 0, 1]])
