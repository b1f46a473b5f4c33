"""`components.html`: one self-contained page of a harvest (inline CSS and JS, the data
embedded, no network), and the per-subcomponent tables it shows (PMI, co-firing partners)."""

import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import cast

import numpy as np
import scipy.sparse as sp
from jaxtyping import Float, Int

from pd.train.harvest import PAD, Harvest, SiteHarvest

Labels = Callable[[list[int]], list[str]]


# Tokens seen at fewer of a subcomponent's firings are left out of its PMI tables: a rare token
# seen once at a firing has the highest PMI there by chance.
PMI_MIN_COUNT = 3


def pmi_rows(
    counts: sp.csr_matrix,
    fired: Int[np.ndarray, " A"],
    totals: Int[np.ndarray, " V"],
    top: int,
    min_count: int = 1,
) -> list[tuple[list[tuple[int, float]], list[tuple[int, float]]]]:
    """Per subcomponent, its `top` highest- and lowest-PMI tokens among those seen at at least
    `min_count` of its firings: `log(P(t | fires) / P(t)) = log(n(c, t) · n / (n(c) · n(t)))`,
    with `n` the positions read; ties go to the lower token id."""
    n = max(int(totals.sum()), 1)
    out: list[tuple[list[tuple[int, float]], list[tuple[int, float]]]] = []
    for a in range(counts.shape[0]):
        row = counts.getrow(a)
        keep = row.data >= min_count
        ids, c = row.indices[keep], row.data[keep]
        if not ids.size:
            out.append(([], []))
            continue
        pmi = np.log(c * n / (max(int(fired[a]), 1) * np.maximum(totals[ids], 1)))
        order = np.lexsort((ids, -pmi))
        high = [(int(ids[i]), float(pmi[i])) for i in order[:top]]
        low = [(int(ids[i]), float(pmi[i])) for i in np.lexsort((ids, pmi))[:top]]
        out.append((high, low))
    return out


def partners(
    cofire: Int[np.ndarray, "A A"], fired: Int[np.ndarray, " A"], top: int
) -> tuple[Int[np.ndarray, "A top"], Float[np.ndarray, "A top"]]:
    """Each subcomponent's `top` co-firing partners by Jaccard index (itself left out)."""
    union = fired[:, None] + fired[None, :] - cofire
    jaccard = np.where(union > 0, cofire / np.maximum(union, 1), 0.0)
    np.fill_diagonal(jaccard, -1.0)
    order = np.argsort(-jaccard, axis=1, kind="stable")[:, :top]
    return order, np.take_along_axis(jaccard, order, axis=1)


def _picks(p: tuple[np.ndarray, ...], a: int) -> list[list[list[float | int]]]:
    """One subcomponent's picks as `[[CI window], [input window]]` (empty picks left out)."""
    _, at, ci, inputs = p
    keep = at[a] != PAD
    cis, ids = np.round(ci[a][keep], 3).tolist(), inputs[a][keep].tolist()
    return [[c, i] for c, i in zip(cis, ids, strict=True)]


# Per site, more fields of its cards: `{field: one value per alive subcomponent}`.
Extras = dict[str, dict[str, list[object]]]
# The extras that hold token tables, per subcomponent `[[[token, value], ...] per table]`.
TOKEN_EXTRAS = ("out", "ablated")
# More alive subcomponents than this (a page of some 50 MB), and each site gets a page of its own.
PAGE_CARDS = 5000


def _site_cards(
    name: str, s: SiteHarvest, h: Harvest, extras: dict[str, list[object]]
) -> list[dict[str, object]]:
    n = max(h.n_positions, 1)
    order, jac = partners(s.cofire, s.count, 5)
    tables = {}
    if s.inputs is not None and h.token_counts is not None and h.next_counts is not None:
        tables = {
            "in": pmi_rows(s.inputs, s.count, h.token_counts, 10, PMI_MIN_COUNT),
            "nx": pmi_rows(s.next_tokens, s.count, h.next_counts, 10, PMI_MIN_COUNT),
        }
    cards = []
    for a, c in enumerate(s.alive.tolist()):
        card: dict[str, object] = {
            "s": name,
            "c": c,
            "d": float(s.count[a]) / n,
            "m": float(s.ci_sum[a]) / n,
            "h": s.hist[a].tolist(),
            "top": _picks(s.top, a),
            "smp": _picks(s.sample, a),
            "p": [
                [int(s.alive[j]), round(float(v), 3)]
                for j, v in zip(order[a], jac[a], strict=True)
                if v > 0
            ],
        }
        for key, rows in tables.items():
            card[key] = [[[t, round(v, 2)] for t, v in part] for part in rows[a]]
        card |= {key: values[a] for key, values in extras.items()}
        cards.append(card)
    return cards


def _shown_tokens(h: Harvest, extras: Extras) -> set[int]:
    """Every token id the cards can show: in a window, in a token table, or in the extras'
    token tables (`TOKEN_EXTRAS`)."""
    ids: set[int] = set()
    for s in h.sites.values():
        for picks in (s.top, s.sample):
            ids.update(np.unique(picks[3]).tolist())
        for counts in (s.inputs, s.next_tokens):
            if counts is not None:
                ids.update(np.unique(counts.indices).tolist())
    for fields in extras.values():
        for key in TOKEN_EXTRAS:
            rows = cast(list[list[list[list[float]]]], fields.get(key, []))
            ids.update(int(pair[0]) for card in rows for part in card for pair in part)
    ids.discard(PAD)
    return ids


def page_data(
    h: Harvest,
    labels: Labels | None,
    summary: dict[str, float],
    title: str,
    extras: Extras | None = None,
    pages: dict[str, str] | None = None,
) -> dict[str, object]:
    """What the page embeds: the run's summary, one row per site, one card per alive
    subcomponent (with the `extras` fields of its site), and the text of every token the cards
    show. With `pages` (`{site: relative path}`), the cards are left out and each site's row
    links to its own page."""
    extras = extras or {}
    cards = (
        [
            card
            for name, s in h.sites.items()
            for card in _site_cards(name, s, h, extras.get(name, {}))
        ]
        if pages is None
        else []
    )
    ordered = sorted(_shown_tokens(h, extras)) if pages is None else []
    texts = labels(ordered) if labels is not None and ordered else [str(i) for i in ordered]
    sites = [
        {
            "name": name,
            "C": s.C,
            "alive": int(s.alive.size),
            "l0": summary.get(f"ci_l0/{name}", float(s.count.sum()) / max(h.n_positions, 1)),
        }
        | ({"page": pages[name]} if pages else {})
        for name, s in h.sites.items()
    ]
    clean = {k: v for k, v in summary.items() if isinstance(v, float) and math.isfinite(v)}
    return {
        "title": title,
        "summary": clean,
        "threshold": h.config.threshold,
        "positions": h.n_positions,
        "tokens": dict(zip(map(str, ordered), texts, strict=True)),
        "sites": sites,
        "cards": cards,
    }


def write_pages(
    folder: Path,
    h: Harvest,
    labels: Labels | None,
    summary: dict[str, float],
    title: str,
    extras: Extras | None = None,
) -> Path:
    """`folder/components.html`: every card, where there are at most `PAGE_CARDS`; else the
    sites, each linking to a page of its own cards, `folder/sites/SITE.html`. Returns the
    first."""
    extras = extras or {}
    index = folder / "components.html"
    if sum(s.alive.size for s in h.sites.values()) <= PAGE_CARDS:
        write_page(index, page_data(h, labels, summary, title, extras))
        return index
    (folder / "sites").mkdir(exist_ok=True)
    pages = {name: f"sites/{re.sub(r'[^A-Za-z0-9._-]', '_', name)}.html" for name in h.sites}
    for name, s in h.sites.items():
        one = replace(h, sites={name: s})
        heading = f"{title} · {name}: {s.alive.size} alive"
        data = page_data(one, labels, summary, heading, {name: extras.get(name, {})})
        write_page(folder / pages[name], data | {"index": "../components.html"})
    write_page(index, page_data(h, labels, summary, title, extras, pages))
    return index


def write_page(path: Path, data: dict[str, object]) -> None:
    """`components.html` at `path`, with `data` embedded as JSON: the same text as one
    `json.dumps(data, separators=(",", ":"))`, but written a value at a time, and each list
    (the cards) an item at a time, so the whole text is never held (each piece by json's C
    encoder)."""
    template = (Path(__file__).parent / "dashboard.html").read_text()
    before, after = template.split("/*DATA*/")
    encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode

    def pieces() -> Iterator[str]:
        for i, (key, value) in enumerate(data.items()):
            yield ("{" if i == 0 else ",") + encode(key) + ":"
            if isinstance(value, list):
                yield "[" + ",".join(encode(item) for item in value[:1])
                yield from ("," + encode(item) for item in value[1:])
                yield "]"
            else:
                yield encode(value)
        yield "}" if data else "{}"

    with path.open("w") as f:
        f.write(before)
        # "</" can only be inside a string, and every string is inside one piece
        f.writelines(piece.replace("</", "<\\/") for piece in pieces())
        f.write(after)
