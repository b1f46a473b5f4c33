"""Every built-in preset loads, validates and builds its sites; the default is `tms_5-2`."""

import pytest

from pd.train.config import load_config, preset_names
from pd.train.run import make_recipe


def test_the_shipped_presets() -> None:
    assert preset_names() == ["resid_mlp1", "tms_40-10", "tms_5-2", "tms_5-2-id"]


@pytest.mark.parametrize("preset", preset_names())
def test_preset_builds(preset: str) -> None:
    config = load_config(preset)
    assert config.name == preset
    recipe = make_recipe(config)
    assert all(site.C == config.C for site in recipe.table.sites)
    assert recipe.ci_fn.table is recipe.table
