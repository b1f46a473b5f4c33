"""The language-model evaluation's additions (`pd.train.evaluate_masks`, `pd.train.report`):
rounded masks, the fresh adversary, the per-layer counts and the tables of `evaluation.md`."""

import jax
import jax.numpy as jnp
import numpy as np
from test_lm_recipe import _frozen, _lm

from pd.sites import SiteSpec, SiteTable
from pd.train.evaluate_masks import make_pgd_eval
from pd.train.init_state import init_train_state
from pd.train.report import MASKS, evaluation_markdown, per_layer, robustness


def _table() -> SiteTable:
    return SiteTable(
        (
            SiteSpec("layers.0.q", 4, 4, C=3, layer=0, kind="q"),
            SiteSpec("layers.0.down", 4, 4, C=5, layer=0, kind="down"),
            SiteSpec("layers.1.q", 4, 4, C=3, layer=1, kind="q"),
            SiteSpec("layers.1.down", 4, 4, C=5, layer=1, kind="down"),
        )
    )


def _summary(table: SiteTable) -> dict[str, float]:
    rng = np.random.default_rng(0)
    summary: dict[str, float] = {}
    for spec in table.sites:
        summary[f"alive/{spec.name}"] = float(rng.integers(1, spec.C + 1))
        summary[f"ci_l0/{spec.name}"] = float(rng.uniform(0, 2))
    return summary


def test_per_layer_counts_sum_the_sites_of_each_layer() -> None:
    table = _table()
    summary = _summary(table)
    layers = per_layer(summary, table)
    for layer in (0, 1):
        names = [s.name for s in table.sites if s.layer == layer]
        alive = sum(summary[f"alive/{n}"] for n in names)
        l0 = sum(summary[f"ci_l0/{n}"] for n in names)
        assert layers[f"layer_C/{layer}"] == 8.0
        assert layers[f"layer_alive/{layer}"] == alive
        assert layers[f"layer_ci_l0/{layer}"] == l0
        assert layers[f"layer_ci_l0_over_alive/{layer}"] == l0 / alive
    assert layers["ci_l0_over_alive/max_layer"] == max(
        layers["layer_ci_l0_over_alive/0"], layers["layer_ci_l0_over_alive/1"]
    )


def test_evaluation_markdown_has_a_row_per_mask_and_per_layer() -> None:
    table = _table()
    summary = _summary(table) | per_layer(_summary(table), table)
    for i, mask in enumerate(MASKS):
        summary[f"ce/{mask}"] = 5.0 + i
        if mask != "clean":
            summary[f"kl/{mask}"] = 0.1 * i
    summary |= {"kl/pgd_20": 1.5, "kl/pgd_80": 2.5}
    text = evaluation_markdown(summary)
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    masks = [r.split("|")[1].strip() for r in rows[1 : 1 + len(MASKS) + 2]]
    assert masks == [*MASKS, "pgd_20", "pgd_80"]
    assert "| pgd_80 | a fresh adversary, 80 ascent steps |  | 2.5 |" in text
    assert [r.split("|")[1].strip() for r in rows[-2:]] == ["0", "1"]
    # A toy's summary (no per-layer counts) has no tables.
    assert evaluation_markdown({"mse/ci_masked": 0.1}) == ""


def test_evaluation_says_when_an_adversary_breaks_the_model_more_than_zero_masks() -> None:
    table = _table()
    summary = _summary(table) | per_layer(_summary(table), table)
    summary |= {"kl/zero_masked": 100.0, "kl/adversarial": 16.0, "kl/pgd_20": 97.0}
    assert robustness(summary) == ""
    assert "Not robust" not in evaluation_markdown(summary)
    summary |= {"kl/pgd_80": 178.0}
    note = robustness(summary)
    assert "`pgd_80`" in note and "KL 178" in note and "(100)" in note
    assert note in evaluation_markdown(summary)
    # Without the zero masks or without an adversary, it says nothing.
    assert robustness({"mse/adversarial": 2.0}) == ""
    assert robustness({"kl/zero_masked": 1.0}) == ""


def test_the_fresh_adversary_ascends_the_divergence() -> None:
    _, recipe = _lm(['target.kinds=["q","down"]'])
    frozen = _frozen(recipe)
    state = init_train_state(recipe, jax.random.key(0), jax.random.key(1))
    x = jax.random.randint(jax.random.key(2), (4, recipe.seq_len), 0, 16, dtype=jnp.int32)
    pgd = make_pgd_eval(recipe, (0, 3, 12), 0.05)
    values = jax.device_get(pgd(state, frozen, x, jax.random.key(3)))
    # Its sources start U[0, 1) and climb: after 12 Adam ascents the KL is well above the start.
    assert values["kl/pgd_0"] < values["kl/pgd_3"] < values["kl/pgd_12"]
    assert values["kl/pgd_12"] > 1.5 * values["kl/pgd_0"]
