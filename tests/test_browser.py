"""`components.html` in a real browser: a page of 2,000 cards (a synthetic harvest the size of
`smollm2`'s) loads from `file://` with no console errors, renders its cards lazily, filters by
a typed token, and a `#site/index` link scrolls to its card (clearing a filter that hid it)."""

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from browser import console_errors, needs_browser, opened
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait

from pd.train import dashboard
from pd.train.dashboard import Extras, page_data, write_page, write_pages
from pd.train.harvest import PAD, Harvest, HarvestConfig, SiteHarvest

VOCAB, K, W = 5000, 20, 21


def _site(rng: np.random.Generator, A: int) -> SiteHarvest:
    count = rng.integers(1, 1000, A)
    inputs = rng.integers(0, VOCAB, (A, K, W)).astype(np.int32)
    inputs[:, :, :3] = PAD  # the start of a sequence
    picks = (rng.random((A, K)), np.arange(A * K).reshape(A, K), rng.random((A, K, W)), inputs)
    tokens = sp.csr_matrix(rng.integers(0, 3, (A, VOCAB)) * (rng.random((A, VOCAB)) < 0.02))
    cofire = np.minimum(count[:, None], count[None, :]) // 3
    hist = rng.integers(0, 100, (A, 20))
    return SiteHarvest(
        A, np.arange(A), count, count * 0.5, hist, picks, picks, cofire, tokens, tokens
    )


def _labels(ids: list[int]) -> list[str]:
    return [f"w{i}" for i in ids]


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    rng = np.random.default_rng(0)
    sites = {"layers.0.mlp.down": _site(rng, 1000), "layers.1.mlp.down": _site(rng, 1000)}
    counts = rng.integers(1, 50, VOCAB)
    h = Harvest(HarvestConfig(), 60_000, 128, sites, counts, counts)
    effects: list[object] = [
        [[[int(t), 0.5] for t in rng.integers(0, VOCAB, 10)] for _ in "+-"] for _ in range(1000)
    ]
    extras: Extras = {
        "layers.0.mlp.down": {"ablated": effects},
        "layers.1.mlp.down": {"out": effects},
    }
    data = page_data(h, _labels, {"kl/ci_masked": 0.5}, "synthetic", extras)
    path = tmp_path_factory.mktemp("page") / "components.html"
    write_page(path, data)
    return path, data


def _expected_matches(data: dict[str, object], needle: str) -> int:
    """The cards a typed token keeps: a window or an input-token table shows a token whose
    text, trimmed, is the typed text (the page's rule, case aside)."""
    cards = data["cards"]
    assert isinstance(cards, list)

    def has(t: int) -> bool:
        return t != PAD and f"w{t}" == needle

    def shown(card: dict[str, list[list[list[int]]]]) -> bool:
        windows = [w[1] for key in ("top", "smp") for w in card[key]]
        tables = [t for part in card.get("in", []) for t, _ in part]
        return any(has(t) for w in windows for t in w) or any(has(t) for t in tables)

    return sum(shown(c) for c in cards)


@needs_browser
def test_the_page_loads_filters_and_follows_links(page: tuple[Path, dict[str, object]]) -> None:
    path, data = page
    with opened(path) as driver:
        ready = driver.execute_script("return window.pdReady")
        print(f"interactive after {ready:.0f} ms with 2000 cards")
        assert console_errors(driver) == []
        count = driver.find_element(By.ID, "count")
        assert count.text == "2000 of 2000 alive subcomponents"
        filled = "return document.querySelectorAll('.card:not(.slot)').length"
        assert 0 < driver.execute_script(filled) < 100  # the cards near the viewport only
        box = driver.find_element(By.ID, "token")
        box.send_keys("w49")
        want = _expected_matches(data, "w49")
        assert 0 < want < 2000 and count.text == f"{want} of 2000 alive subcomponents"
        driver.get(f"{path.resolve().as_uri()}#layers.1.mlp.down/997")  # a hash change
        card = driver.find_element(By.ID, "layers.1.mlp.down/997")

        def in_view(driver: WebDriver) -> bool:
            top = driver.execute_script("return arguments[0].getBoundingClientRect().top", card)
            return bool(0 <= top < driver.execute_script("return window.innerHeight"))

        WebDriverWait(driver, 10).until(in_view)
        assert driver.find_element(By.ID, "token").get_attribute("value") == ""
        assert "logits it raises" in card.text and "ablated" not in card.text
        driver.get(f"{path.resolve().as_uri()}#layers.0.mlp.down/3")
        card = driver.find_element(By.ID, "layers.0.mlp.down/3")
        WebDriverWait(driver, 10).until(in_view)
        assert "ablated: logits that rise" in card.text and "logits it raises" not in card.text
        assert console_errors(driver) == []


@needs_browser
def test_pages_per_site_load_and_link(
    page: tuple[Path, dict[str, object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over `PAGE_CARDS` cards, the index lists the sites with links to their own pages, which
    load with their cards and link back."""
    monkeypatch.setattr(dashboard, "PAGE_CARDS", 100)
    rng = np.random.default_rng(1)
    sites = {"layers.0.mlp.down": _site(rng, 150), "layers.1.mlp.down": _site(rng, 150)}
    counts = rng.integers(1, 50, VOCAB)
    h = Harvest(HarvestConfig(), 60_000, 128, sites, counts, counts)
    folder = page[0].parent / "split"
    folder.mkdir()
    index = write_pages(folder, h, _labels, {"kl/ci_masked": 0.5}, "split")
    with opened(index) as driver:
        assert console_errors(driver) == []
        assert not driver.find_element(By.ID, "controls").is_displayed()
        link = driver.find_element(By.LINK_TEXT, "layers.1.mlp.down")
        link.click()
        WebDriverWait(driver, 10).until(lambda d: d.current_url.endswith("layers.1.mlp.down.html"))
        assert driver.find_element(By.ID, "count").text == "150 of 150 alive subcomponents"
        assert (
            driver.find_element(By.LINK_TEXT, "all sites").get_attribute("href")
            == index.resolve().as_uri()
        )
        assert console_errors(driver) == []
