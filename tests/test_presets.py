"""Every built-in preset loads, validates and builds its sites; the default is `tms_5-2`."""

import re
from pathlib import Path

import pytest

from pd.train.config import load_config, preset_names
from pd.train.run import make_recipe


def test_the_shipped_presets() -> None:
    assert preset_names() == [
        "llama8b_full",
        "resid_mlp1",
        "smollm2",
        "smollm2_full",
        "tiny_llama",
        "tms_40-10",
        "tms_5-2",
        "tms_5-2-id",
    ]


def test_the_usage_docs_list_every_preset() -> None:
    usage = (Path(__file__).parents[1] / "docs" / "usage.md").read_text()
    table = usage.split("## Presets", 1)[1].split("\n\n", 2)[1]
    assert sorted(re.findall(r"^\| `([^`]+)`", table, re.M)) == preset_names()


@pytest.mark.parametrize("preset", preset_names())
def test_preset_builds(preset: str) -> None:
    config = load_config(preset)
    assert config.name == preset
    recipe = make_recipe(config)
    assert getattr(recipe.ci_fn, "table", None) is recipe.table
    if preset == "llama8b_full":  # the production C per kind of compile-time-pr.md
        Cs = {name.rsplit(".", 1)[1]: recipe.table.spec(name).C for name in recipe.table.names}
        assert Cs == {
            "q": 2048,
            "k": 2048,
            "v": 4096,
            "o": 4096,
            "gate": 8192,
            "up": 8192,
            "down": 10240,
        }
        assert len(recipe.table.names) == 224
    elif preset == "smollm2_full":  # every matrix, C = its rank (3 KV heads of 64 for k, v)
        Cs = {name.rsplit(".", 1)[1]: recipe.table.spec(name).C for name in recipe.table.names}
        assert Cs == {"q": 576, "k": 192, "v": 192, "o": 576, "gate": 576, "up": 576, "down": 576}
        assert len(recipe.table.names) == 210
    else:
        assert all(site.C == config.C for site in recipe.table.sites)
