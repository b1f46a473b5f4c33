"""The harvest (`pd.train.harvest`) against a brute-force NumPy computation over the same tokens,
and its sample's uniformity; `python -m pd.inspect` on a TMS run is in test_convergence.py."""

import json
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import cast

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from test_lm_recipe import TINY_LM, token_file

from pd.train import dashboard, load_config, run
from pd.train import harvest as harvest_module
from pd.train.ablation import ablation_effects
from pd.train.dashboard import page_data, partners, pmi_rows, write_page, write_pages
from pd.train.decomposition import Decomposition
from pd.train.harvest import (
    PAD,
    Harvest,
    HarvestConfig,
    batch_ci,
    harvest,
    initial_carry,
    read_batches,
    site_step,
)
from pd.train.inspection import output_tokens

CFG = HarvestConfig(threshold=0.1, k=3, window=2, bins=5, max_tokens=4 * 8 * 8, rows=8)


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Decomposition, Harvest]:
    folder = tmp_path_factory.mktemp("harvest")
    overrides = [
        'target.kinds=["q","down"]',
        f'target.tokens="{token_file(folder)}"',
        "target.train_steps=20",
        "train.steps=10",
        "train.faith_warmup_steps=2",
        "eval.n_samples=16",
        "eval.batch=8",
        "eval.figures=false",
    ]
    d = run(load_config("tiny_llama", [*TINY_LM, *overrides]), folder / "run").decomposition
    return d, harvest(d, CFG, bar=False)


def _brute(d: Decomposition, site: str) -> tuple[np.ndarray, np.ndarray]:
    """Every position's CI `[N, C]` at `site` (from the program the harvest runs, so the values
    are the same bits) and the token ids `[B · batches, T]`, in read order."""
    batches = read_batches(d, CFG.max_tokens, CFG.rows)
    ci_of = partial(batch_ci, d)
    C = d.V[site].shape[1]
    ci = np.concatenate([np.asarray(ci_of(x)[site]).reshape(-1, C) for x in batches])
    return ci, np.concatenate([np.asarray(x) for x in batches])


def test_the_harvest_equals_a_brute_force_count_over_the_same_tokens(
    lm: tuple[Decomposition, Harvest],
) -> None:
    d, h = lm
    assert CFG.skip_first == 1  # each window's first position is context only
    assert len(read_batches(d, CFG.max_tokens, CFG.rows)) == 4 and h.n_positions == 4 * 8 * 7
    for site, s in h.sites.items():
        ci, tokens = _brute(d, site)
        flat, T = tokens.reshape(-1), tokens.shape[1]
        counted = np.arange(flat.size) % T >= CFG.skip_first
        fires = (ci > CFG.threshold) & counted[:, None]
        alive = np.flatnonzero(fires.any(0))
        np.testing.assert_array_equal(s.alive, alive)
        f, c = fires[:, alive], ci[:, alive]
        np.testing.assert_array_equal(s.count, f.sum(0))
        np.testing.assert_allclose(s.ci_sum, c[counted].sum(0), rtol=1e-5)
        bins = np.clip((c[counted] * CFG.bins).astype(int), 0, CFG.bins - 1)
        np.testing.assert_array_equal(s.hist, [np.bincount(b, minlength=CFG.bins) for b in bins.T])
        np.testing.assert_array_equal(s.cofire, f.T.astype(int) @ f.astype(int))
        for a in range(alive.size):
            at = np.flatnonzero(f[:, a])
            order = at[np.lexsort((at, -c[at, a]))][: CFG.k]  # CI descending, earlier first
            got = s.top[1][a][s.top[1][a] != PAD]
            np.testing.assert_array_equal(got, order)
            for j, p in enumerate(order):
                t = int(p) % T
                for w, off in enumerate(range(-CFG.window, CFG.window + 1)):
                    inside = 0 <= t + off < T
                    want_tok = flat[p + off] if inside else PAD
                    assert s.top[3][a, j, w] == want_tok
                    assert s.top[2][a, j, w] == (ci[p + off, alive[a]] if inside else 0)
            assert s.inputs is not None and s.next_tokens is not None
            np.testing.assert_array_equal(
                s.inputs.getrow(a).toarray()[0], np.bincount(flat[at], minlength=s.inputs.shape[1])
            )
            has_next = at[at % T < T - 1]
            np.testing.assert_array_equal(
                s.next_tokens.getrow(a).toarray()[0],
                np.bincount(flat[has_next + 1], minlength=s.next_tokens.shape[1]),
            )
            sampled = s.sample[1][a][s.sample[1][a] != PAD]
            assert sampled.size == min(CFG.k, at.size) and set(sampled) <= set(at)
    assert h.token_counts is not None and h.next_counts is not None
    vocab = h.token_counts.size
    skip = CFG.skip_first
    np.testing.assert_array_equal(
        h.token_counts, np.bincount(tokens[:, skip:].ravel(), minlength=vocab)
    )
    np.testing.assert_array_equal(
        h.next_counts, np.bincount(tokens[:, skip + 1 :].ravel(), minlength=vocab)
    )


def test_pmi_and_partners_follow_their_definitions(lm: tuple[Decomposition, Harvest]) -> None:
    _, h = lm
    assert h.token_counts is not None
    n = h.token_counts.sum()
    for s in h.sites.values():
        assert s.inputs is not None
        for m in (1, 2):  # tokens seen at fewer than m of the firings are left out
            rows = pmi_rows(s.inputs, s.count, h.token_counts, 3, min_count=m)
            for a, (high, low) in enumerate(rows):
                row = s.inputs.getrow(a).toarray()[0]
                seen = np.flatnonzero(row >= m)
                pmi = np.log(row[seen] * n / (s.count[a] * h.token_counts[seen]))
                assert [t for t, _ in high] == seen[np.lexsort((seen, -pmi))][:3].tolist()
                assert [t for t, _ in low] == seen[np.lexsort((seen, pmi))][:3].tolist()
        idx, jac = partners(s.cofire, s.count, 2)
        for a in range(s.count.size):
            for j, v in zip(idx[a], jac[a], strict=True):
                union = s.count[a] + s.count[j] - s.cofire[a, j]
                assert j != a and v == pytest.approx(s.cofire[a, j] / max(union, 1))


def test_the_sample_of_firings_is_uniform() -> None:
    """One subcomponent firing at every one of 3 × 8 positions, a sample of 2 drawn 3000 times
    with different keys: each position is kept 2/24 of the time (a chi-square test that a
    sampler keeping early or late firings fails)."""
    cfg = HarvestConfig(k=2, window=0, bins=2, skip_first=0)
    ci = jnp.ones((2, 4, 1))  # [B, T, A]: 8 positions a batch, all firing
    x = jnp.zeros((2, 4), jnp.int32)

    def draw(key: jax.Array) -> jax.Array:
        carry = initial_carry(1, cfg)
        for b in range(3):
            sub = jax.random.fold_in(key, b)
            carry, _ = site_step(carry, ci, x, sub, jnp.int32(8 * b), cfg)
        return carry[5][1][0]

    keys = jax.random.split(jax.random.key(0), 3000)
    kept = np.asarray(jax.jit(jax.vmap(draw))(keys)).reshape(-1)
    counts = np.bincount(kept, minlength=24)
    assert counts.sum() == 6000 and np.all(kept >= 0)
    assert stats.chisquare(counts).pvalue > 1e-3, counts


def test_active_names_each_tokens_most_important_subcomponents(
    lm: tuple[Decomposition, Harvest],
) -> None:
    d, _ = lm
    tokens = [3, 1, 4, 1, 5]
    ci = d.ci(np.asarray([tokens]))
    got = d.active(tokens, top=2)
    assert [at.token for at in got] == tokens
    for t, at in enumerate(got):
        assert set(at.top) == set(d.sites)
        for site, best in at.top.items():
            row = np.asarray(ci[site][0, t])
            want = [int(j) for j in np.argsort(-row, kind="stable")[:2] if row[j] > 0]
            assert [c for c, _ in best] == want
            assert [v for _, v in best] == pytest.approx([float(row[j]) for j in want])
    with pytest.raises(ValueError, match="reads no text"):
        d.active("some text")


def test_output_tokens_read_a_residual_writers_direction_through_the_unembedding(
    lm: tuple[Decomposition, Harvest],
) -> None:
    d, h = lm
    extras = output_tokens(d, h, top=3)
    tokens = set(map(int, cast(dict[str, str], page_data(h, None, {}, "", extras)["tokens"])))
    assert set(extras) == {s for s in h.sites if s.endswith(".mlp.down")}  # q writes no stream
    p = d.frozen["~"]
    for site, fields in extras.items():
        s = h.sites[site]
        U = np.asarray(d.U[site], np.float64)[s.alive]
        head = np.asarray(p["head"], np.float64)
        logits = (U * np.asarray(p["final_norm"], np.float64)) @ head
        rows = cast(list[list[list[tuple[int, float]]]], fields["out"])  # as output_tokens builds
        for a, (high, low) in enumerate(rows):
            assert [t for t, _ in high] == np.argsort(-logits[a], kind="stable")[:3].tolist()
            assert [t for t, _ in low] == np.argsort(logits[a], kind="stable")[:3].tolist()
            assert {t for t, _ in high} | {t for t, _ in low} <= tokens


def test_two_passes_keep_what_one_pass_keeps(
    lm: tuple[Decomposition, Harvest], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A site over `ONE_PASS_C` subcomponents is read twice, the second time for the alive ones
    alone: the same statistics (the random sample aside, whose keys are drawn per column)."""
    d, one = lm
    monkeypatch.setattr(harvest_module, "ONE_PASS_C", 0)
    two = harvest(d, CFG, bar=False)
    for site, s in one.sites.items():
        t = two.sites[site]
        for a, b in [
            (s.alive, t.alive),
            (s.count, t.count),
            (s.hist, t.hist),
            (s.cofire, t.cofire),
        ]:
            np.testing.assert_array_equal(a, b)
        for a, b in zip(s.top, t.top, strict=True):
            np.testing.assert_array_equal(a, b)
        assert s.inputs is not None and t.inputs is not None
        assert (s.inputs != t.inputs).nnz == 0


def test_the_ci_read_in_parts_is_the_ci_of_the_whole_batch(
    lm: tuple[Decomposition, Harvest], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`batch_ci` splits a batch by rows, `CI_POSITIONS` positions at a time, the last part
    padded: the same CI as the whole batch read at once (up to float rounding)."""
    d, _ = lm
    x = read_batches(d, CFG.max_tokens, CFG.rows)[0]
    whole = d._ci_jit(x)
    monkeypatch.setattr(harvest_module, "CI_POSITIONS", 3 * x.shape[1])  # 3 of 8 rows a part
    parts = batch_ci(d, x)
    assert set(parts) == set(whole)
    for site, ci in whole.items():
        assert parts[site].shape == ci.shape
        np.testing.assert_allclose(parts[site], ci, rtol=1e-5, atol=1e-6)


def test_the_page_is_written_in_parts_as_one_json(
    lm: tuple[Decomposition, Harvest], tmp_path: Path
) -> None:
    """`write_page` writes the data a list item at a time: the same bytes as the template with
    the whole data's JSON in its place (`</` escaped)."""
    _, h = lm
    data = page_data(h, None, {"kl/ci_masked": 0.5}, "a </script> title")
    write_page(tmp_path / "page.html", data)
    template = (Path(harvest_module.__file__).parent / "dashboard.html").read_text()
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    assert (tmp_path / "page.html").read_text() == template.replace("/*DATA*/", payload)


def test_a_harvest_of_many_cards_gets_a_page_per_site(
    lm: tuple[Decomposition, Harvest], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over `PAGE_CARDS` alive subcomponents, `components.html` lists the sites, each linking
    to a page that holds the cards the one page would hold for it."""
    d, h = lm
    extras = output_tokens(d, h, top=3)
    whole = page_data(h, None, {}, "t", extras)
    monkeypatch.setattr(dashboard, "PAGE_CARDS", 1)
    index = write_pages(tmp_path, h, None, {}, "t", extras)

    def embedded(path: Path) -> dict[str, object]:
        text = path.read_text()
        start = text.index('id="data">') + len('id="data">')
        found: dict[str, object] = json.loads(text[start : text.index("</script>", start)])
        return found

    listed = cast(list[dict[str, str]], embedded(index)["sites"])
    assert embedded(index)["cards"] == [] and [s["name"] for s in listed] == list(h.sites)
    cards = cast(list[dict[str, object]], whole["cards"])
    for site in listed:
        page = embedded(tmp_path / site["page"])
        assert page["cards"] == [c for c in cards if c["s"] == site["name"]]
        assert page["index"] == "../components.html"


def test_a_skip_as_long_as_the_window_is_refused(lm: tuple[Decomposition, Harvest]) -> None:
    d, _ = lm
    with pytest.raises(ValueError, match=r"skip_first is 8, expected .* fewer than the 8"):
        harvest(d, replace(CFG, skip_first=8), bar=False)


def test_ablation_effects_are_the_mean_logit_change_of_exact_ablations(
    lm: tuple[Decomposition, Harvest],
) -> None:
    """For a site that does not write the residual stream (q), each subcomponent's listed
    tokens are the largest rises and falls of the mean over its first two sampled firings of
    `Decomposition.ablate(...) - clean` at the firing's position."""
    d, h = lm
    extras = ablation_effects(d, h, n=2, top=3, bar=False)
    tokens = set(map(int, cast(dict[str, str], page_data(h, None, {}, "", extras)["tokens"])))
    assert set(extras) == {s for s in h.sites if s.endswith(".attn.q")}
    windows = np.concatenate([np.asarray(x) for x in read_batches(d, CFG.max_tokens, CFG.rows)])
    T = h.seq_len
    for site, fields in extras.items():
        s = h.sites[site]
        rows = cast(list[list[list[tuple[int, float]]]], fields["ablated"])
        assert len(rows) == s.alive.size
        for a in range(min(3, s.alive.size)):  # exact ablations are eager: a few suffice
            picks = [int(p) for p in s.sample[1][a, :2] if p != PAD]
            change = np.mean(
                [
                    np.asarray(d.ablate(windows[p // T][None], site, [int(s.alive[a])]))[0, p % T]
                    - np.asarray(d.clean(windows[p // T][None]))[0, p % T]
                    for p in picks
                ],
                axis=0,
            )
            for sign, listed in zip((1.0, -1.0), rows[a], strict=True):
                third = np.sort(sign * change)[-3]
                for token, value in listed:
                    assert value == pytest.approx(change[token], abs=2e-3)
                    assert sign * change[token] >= third - 2e-3
                    assert token in tokens
