"""The research examples in examples/ run against a real (tiny) run and say what they claim."""

import importlib.util
from pathlib import Path
from types import ModuleType

import jax.numpy as jnp
import numpy as np
import pytest
from test_lm_recipe import TINY_LM, token_file

from pd.losses import kl
from pd.train import load_config, run
from pd.train.decomposition import Decomposition

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> Decomposition:
    folder = tmp_path_factory.mktemp("examples")
    overrides = [
        'target.kinds=["down"]',
        f'target.tokens="{token_file(folder)}"',
        "target.train_steps=20",
        "train.steps=4",
        "train.faith_warmup_steps=2",
        "eval.n_samples=8",
        "eval.batch=8",
        "eval.figures=false",
    ]
    return run(load_config("tiny_llama", [*TINY_LM, *overrides]), folder / "run").decomposition


def test_top_k_keeps_the_k_highest_ci_at_each_position() -> None:
    top_k = _example("top_k").top_k
    ci = jnp.asarray(np.random.default_rng(0).uniform(size=(3, 5, 7)), jnp.float32)
    for k in (0, 1, 3, 7, 9):
        cut = np.asarray(top_k(ci, k))
        kept = cut > 0
        assert (kept.sum(-1) == min(k, 7)).all()
        assert np.array_equal(cut[kept], np.asarray(ci)[kept])  # kept values are the CI's own
        lowest_kept = np.where(kept, cut, np.inf).min(-1)
        highest_cut = np.where(kept, -np.inf, np.asarray(ci)).max(-1)
        assert (lowest_kept > highest_cut).all()


def test_top_k_cut_at_c_is_the_ci_masked_model_and_at_0_the_site_switched_off(
    lm: Decomposition,
) -> None:
    example = _example("top_k")
    site = lm.sites[-1]
    x = lm.batch(0, evaluation=True)
    C = lm.V[site].shape[1]
    kls = example.cut_kl(lm, x, site, [0, C])
    clean, ci = lm.clean(x), lm.ci(x)
    assert kls[C] == float(kl(lm.masked_forward(x, ci), clean))
    off = {**ci, site: jnp.zeros_like(ci[site])}
    assert kls[0] == float(kl(lm.masked_forward(x, off), clean))
    assert kls[0] != kls[C]
