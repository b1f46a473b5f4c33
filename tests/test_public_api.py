"""The public API at the top of the package: `import pd` gives `pd.run`, `pd.sweep`, `pd.load`,
`pd.RunConfig`, `pd.OwnTarget`, `pd.haiku_target`, `pd.KnownAnswer` and their companions, each
the object its module defines, and importing pd alone imports neither jax nor the training
stack."""

import subprocess
import sys
from importlib import import_module

import pytest


def test_import_pd_is_cheap() -> None:
    code = "import sys, pd; print(sorted(m for m in sys.modules if m in ('jax', 'pd.train')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


@pytest.mark.parametrize(
    ("name", "home"),
    [
        ("run", "pd.train.run"),
        ("sweep", "pd.train.sweep"),
        ("load", "pd.train.decomposition"),
        ("Decomposition", "pd.train.decomposition"),
        ("RunConfig", "pd.train.config"),
        ("load_config", "pd.train.config"),
        ("OwnTarget", "pd.train.kinds"),
        ("haiku_target", "pd.targets.haiku_model"),
        ("KnownAnswer", "pd.train.evaluate"),
    ],
)
def test_each_top_level_name_is_its_modules_object(name: str, home: str) -> None:
    import pd

    assert getattr(pd, name) is getattr(import_module(home), name)
    assert name in pd.__all__


def test_an_unknown_name_is_an_attribute_error() -> None:
    import pd

    with pytest.raises(AttributeError, match="module 'pd' has no attribute 'runn'"):
        pd.runn  # noqa: B018
