"""The default job recovers the known answer (§13), on two seeds trained as one sweep: one
subcomponent per feature; the two decompositions find each other's subcomponents (seed
consistency, `pd.compare`); and the component browser of one of them (`pd.inspect`) shows one
card per alive subcomponent, each answering its own feature's probe."""

import dataclasses
import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from browser import CHROMIUM, DRIVER, console_errors, opened
from selenium.webdriver.common.by import By

import pd
from pd.train import load_config
from pd.train.compare import compare
from pd.train.compare import main as compare_main
from pd.train.decomposition import Decomposition
from pd.train.inspection import main as inspect_main
from pd.train.sweep import SweepResult, seed_sweep, sweep

# The default job itself (about a minute on 2 cores for both seeds), with a lighter evaluation.
OVERRIDES = ["eval.n_samples=20000", "eval.figures=false"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SweepResult]:
    out = tmp_path_factory.mktemp("converge") / "sweep"
    spec = seed_sweep(load_config("tms_5-2", OVERRIDES), [0, 1])
    return out, sweep(spec, out, devices=jax.devices()[:1])


@pytest.mark.slow
def test_tms_5_2_identity_ci_error_is_zero(pair: tuple[Path, SweepResult]) -> None:
    # Seeds 0 and 1 both recover all five features (README's results).
    for member in pair[1].members:
        summary = member.summary
        for site in ("linear1", "linear2"):
            assert summary[f"identity_ci_error_0.1/{site}"] == 0.0, summary
            assert summary[f"alive/{site}"] == 5.0, summary
        assert summary["mmcs/linear1"] >= 0.99
        assert 0.95 <= summary["ml2r/linear1"] <= 1.05


def _shuffled_V(d: Decomposition, seed: int) -> Decomposition:
    """`d` with the columns of every V permuted (U kept): each rank-1 piece pairs a V column
    with another subcomponent's U row."""
    perm = np.random.default_rng(seed).permutation
    V = tuple(v[..., perm(v.shape[-1])] for v in d.components.V)
    return dataclasses.replace(d, components=d.components._replace(V=V))


@pytest.mark.slow
def test_the_two_seeds_find_each_others_subcomponents(pair: tuple[Path, SweepResult]) -> None:
    out = pair[0]
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
    assert compare_main([str(out / "seed-0"), str(out / "seed-1")]) == 0
    # The sweep reports the same, per member, against its first member.
    first, second = pair[1].members
    mean = float(np.mean([m.mean for m in same.sites.values()]))
    assert first.consistency is None and second.consistency == pytest.approx(mean, abs=1e-6)
    record = json.loads((out / "sweep.json").read_text())["members"]
    assert record[1]["consistency_with_first"] == pytest.approx(mean, abs=1e-6)
    assert f"{mean:.4f}" in (out / "sweep.txt").read_text()


@pytest.mark.slow
def test_inspect_finds_each_features_own_subcomponent(pair: tuple[Path, SweepResult]) -> None:
    folder = pair[0] / "seed-0"
    assert inspect_main([str(folder), "--no-bar", "--max-tokens", "50000"]) == 0
    page = (folder / "inspect" / "components.html").read_text()
    found = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    assert found is not None
    cards = json.loads(found.group(1).replace("<\\/", "</"))["cards"]
    summary = json.loads((folder / "summary.json").read_text())
    assert len(cards) == summary["alive/linear1"] + summary["alive/linear2"] == 10
    probe_ci = pd.load(folder).ci(0.75 * jnp.eye(5))
    for site in ("linear1", "linear2"):
        mine = [card for card in cards if card["s"] == site]
        assert sorted(card["probe"] for card in mine) == [0, 1, 2, 3, 4]  # one per feature
        for card in mine:
            assert int(np.argmax(np.asarray(probe_ci[site])[:, card["c"]])) == card["probe"]
    if CHROMIUM is not None and DRIVER is not None:  # the page of a real run, in a browser
        with opened(folder / "inspect" / "components.html") as driver:
            assert driver.find_element(By.ID, "count").text == "10 of 10 alive subcomponents"
            assert console_errors(driver) == []
    with np.load(folder / "inspect" / "harvest.npz") as saved:
        batch = load_config("tms_5-2", OVERRIDES).eval.batch  # whole batches, as many as fit
        assert json.loads(str(saved["meta"]))["n_positions"] == 50000 // batch * batch
