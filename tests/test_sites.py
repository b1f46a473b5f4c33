"""§2: canonical order, shape groups and per-site views over stacked storage."""

import jax
import jax.numpy as jnp
import pytest

from pd.sites import SiteSpec, SiteTable, SiteViews


def test_shape_groups_are_per_kind_and_views() -> None:
    """A group holds the sites of one kind with one shape, in canonical order; a kind of the
    same shape (`gate` beside `in`) and the same C has groups of its own."""
    sites = (
        SiteSpec("l0.in", 4, 2, 3, 0, "in"),
        SiteSpec("l0.gate", 4, 2, 3, 0, "gate"),
        SiteSpec("l0.out", 2, 4, 3, 0, "out"),
        SiteSpec("l1.in", 4, 2, 3, 1, "in"),
    )
    table = SiteTable(sites)
    assert [g.names for g in table.groups] == [("l0.in", "l1.in"), ("l0.gate",), ("l0.out",)]
    assert [g.names for g in table.c_groups] == [g.names for g in table.groups]
    assert table.where("l1.in") == (0, 1)
    assert table.group_indices(0) == (0, 3)
    stacked = (jnp.arange(2 * 4 * 2).reshape(2, 4, 2), jnp.ones((1, 4, 2)), jnp.zeros((1, 2, 4)))
    views = table.views(stacked)
    assert list(views) == ["l0.in", "l0.gate", "l0.out", "l1.in"]
    assert bool(jnp.all(views["l1.in"] == stacked[0][1]))
    assert table.by_kind(stacked, "in") is stacked[0]  # a kind's layer stack is its group
    # The lazy mapping (`Decomposition.V`) holds the same views, sliced one at a time.
    lazy = SiteViews(table, stacked)
    assert list(lazy) == list(views) and len(lazy) == 4
    assert all(bool(jnp.all(lazy[n] == v)) for n, v in views.items())
    assert "l0.out" in lazy and "l2.in" not in lazy
    with pytest.raises(KeyError, match=r"unknown site 'l2\.in'"):
        lazy["l2.in"]


def test_bad_sites_are_refused() -> None:
    with pytest.raises(ValueError, match="C is 0, expected a positive integer"):
        SiteSpec("x", 2, 2, 0)
    with pytest.raises(ValueError, match="unique"):
        SiteTable((SiteSpec("x", 2, 2, 1), SiteSpec("x", 2, 2, 1)))
    with pytest.raises(KeyError, match="unknown site 'y'"):
        SiteTable((SiteSpec("x", 2, 2, 1),)).where("y")


def test_layers_before_a_kinds_first_site_get_no_gradient_and_no_cotangent() -> None:
    """`by_kind` over a model decomposed in its last two of five layers: every layer before the
    first site holds slot 0's value (never live), and a pass that starts at the first site
    (`Target.resume`) differentiates only the two rows it scans. Compiled, that gradient forms
    no array of the whole depth: the zero cotangent of the three skipped layers, which a
    gather over every layer would pad and scatter back, is never built."""
    sites = (SiteSpec("l3.mlp", 4, 2, 3, 3, "mlp"), SiteSpec("l4.mlp", 4, 2, 3, 4, "mlp"))
    table = SiteTable(sites, 5)
    V = (jnp.arange(2 * 4 * 3, dtype=jnp.float32).reshape(2, 4, 3),)
    rows = table.by_kind(V, "mlp")
    assert rows.shape == (5, 4, 3)
    assert bool(jnp.all(rows[:3] == V[0][0])) and bool(jnp.all(rows[3:] == V[0]))

    def resumed(V: tuple[jax.Array, ...]) -> jax.Array:
        return jnp.sum(table.by_kind(V, "mlp")[3:] ** 2)

    (grad,) = jax.grad(resumed)(V)
    assert bool(jnp.all(grad == 2 * V[0]))
    compiled = jax.jit(jax.grad(resumed)).lower(V).compile().as_text()
    assert compiled is not None and "f32[5," not in compiled
