"""What each subcomponent responds to: the run's held-out data streamed through the CI function.

`harvest(decomposition)` reads the run's evaluation batches (held-out token windows of a
language model, fresh samples of a toy) up to `max_tokens` positions, twice where a site has
more than `ONE_PASS_C` subcomponents (else once, keeping every subcomponent until the end):

1. which subcomponents fire (CI > `threshold`) anywhere: the alive ones, the only ones kept;
2. per site, for every alive subcomponent, in jitted accumulators whose size does not grow
   with the data: its firing count, CI sum and CI histogram; its `k` highest-CI firings and a
   uniform sample of `k` of its firings (the `k` smallest of uniform random keys drawn per
   position and subcomponent: a sample without replacement), each with the CI and the inputs
   of the `± window` positions around it; its co-firing counts with the site's other alive
   subcomponents; and, for tokens, how often each input token and each next token occurs at
   its firings (sparse).

Positions are numbered in the order they are read: `batch · B · T + row · T + t`. Among equal
CI the earlier position ranks first. The first `skip_first` positions of each token window are
read as context only (they show in the windows around firings, and nothing else counts them):
a window starts mid-text, so its first token, which attends to nothing before it, is where the
model parks attention it does not need, and many subcomponents fire there whatever the token.
"""

import ctypes
import ctypes.util
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import cache, partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp
from jaxtyping import Array, Bool, Float, Int
from tqdm import tqdm

from pd.init import key_tree
from pd.targets.base import Batch
from pd.train.decomposition import Decomposition
from pd.train.evaluate import EVAL_FOLD
from pd.train.recipe import make_batches

PAD = -1  # an input outside the sequence, or the position of an empty pick
# Up to this many subcomponents a site, the harvest reads the data once, keeping every one
# (co-firing counts C × C) and dropping those that never fired; beyond it, a first pass finds
# the alive ones and the second keeps only them.
ONE_PASS_C = 2048
# Positions a CI call reads at most (a batch is split by rows): the program's temporaries grow
# with it, mostly the target's taps of every layer, some 0.55 MB a position for smollm2.
CI_POSITIONS = 512


@dataclass(frozen=True)
class HarvestConfig:
    threshold: float = 0.1  # a subcomponent fires where its CI exceeds this
    k: int = 20  # top firings and sampled firings kept per subcomponent
    window: int = 10  # positions kept on either side of a firing
    bins: int = 20  # CI histogram bins over [0, 1]
    max_tokens: int = 200_000  # positions read at most (examples, for a toy)
    seed: int = 0  # the sample's random keys
    skip_first: int = 1  # positions at the start of each token window read as context only
    # Examples per batch read; 0: the run's eval.batch, and for tokens at least 4096 positions.
    rows: int = 0


DEFAULTS = HarvestConfig()

# `(key, position, CI window, input window)`, each `[A, n, ...]`: n picks per subcomponent
Picks = tuple[Array, Array, Array, Array]


@dataclass(frozen=True)
class SiteHarvest:
    """One site's harvest; every array's first axis runs over its alive subcomponents."""

    C: int  # the site's subcomponents
    alive: Int[np.ndarray, " A"]  # the alive ones' indices into C
    count: Int[np.ndarray, " A"]  # firings
    ci_sum: Float[np.ndarray, " A"]  # CI summed over every position read
    hist: Int[np.ndarray, "A bins"]  # positions per CI bin
    top: tuple[np.ndarray, ...]  # Picks: CI, position, CI window, input window
    sample: tuple[np.ndarray, ...]  # Picks: the same for the uniform sample (key, not CI)
    cofire: Int[np.ndarray, "A A"]  # positions where both fire
    inputs: sp.csr_matrix | None  # [A, vocab] input tokens at firings
    next_tokens: sp.csr_matrix | None  # [A, vocab] the token after each firing


@dataclass(frozen=True)
class Harvest:
    config: HarvestConfig
    n_positions: int  # positions counted (not a window's first `skip_first`)
    seq_len: int  # positions per example (1 for a toy)
    sites: dict[str, SiteHarvest]
    token_counts: Int[np.ndarray, " vocab"] | None  # every input token counted (tokens only)
    next_counts: Int[np.ndarray, " vocab"] | None  # the token after every position counted


def _windows(x: Array, at: Int[Array, "A n"], w: int, pad: float | int) -> Array:
    """`x` (`[B, T, A]`, per subcomponent, or `[B, T]`, shared): the `2w + 1` values around each
    flat position `at` of each subcomponent, `pad` outside the row."""
    T = x.shape[1]
    row, t = at // T, at % T
    ts = t[..., None] + jnp.arange(-w, w + 1)
    inside = (ts >= 0) & (ts < T)
    ts, rows = jnp.clip(ts, 0, T - 1), jnp.broadcast_to(row[..., None], ts.shape)
    if x.ndim == 3:
        sub = jnp.broadcast_to(jnp.arange(at.shape[0])[:, None, None], ts.shape)
        vals = x[rows, ts, sub]
    else:
        vals = x[rows, ts]
    return jnp.where(inside, vals, jnp.asarray(pad, vals.dtype))


def _merge(a: Picks, b: Picks, k: int) -> Picks:
    """The `k` highest-keyed of two sets of picks; `a`'s (earlier positions) win ties."""
    both = [jnp.concatenate([x, y], axis=1) for x, y in zip(a, b, strict=True)]
    _, order = jax.lax.top_k(both[0], k)
    key, at, ci, inputs = (
        jnp.take_along_axis(x, order.reshape(*order.shape, *[1] * (x.ndim - 2)), axis=1)
        for x in both
    )
    return key, at, ci, inputs


def _candidates(
    keyed: Float[Array, "N A"], ci: Float[Array, "B T A"], x: Int[Array, "B T"], k: int, w: int
) -> Picks:
    """A batch's `k` highest-keyed positions per subcomponent, with their windows."""
    key, at = jax.lax.top_k(keyed.T, min(k, keyed.shape[0]))
    return key, at, _windows(ci, at, w, 0.0), _windows(x, at, w, PAD)


def empty_picks(n_alive: int, k: int, w: int) -> Picks:
    shape = (n_alive, k)
    return (
        jnp.full(shape, -jnp.inf),
        jnp.full(shape, PAD, jnp.int32),
        jnp.zeros((*shape, 2 * w + 1)),
        jnp.full((*shape, 2 * w + 1), PAD, jnp.int32),
    )


# count, CI sum, histogram, co-firing, top picks, sampled picks
Carry = tuple[Array, Array, Array, Array, Picks, Picks]


def initial_carry(n_alive: int, cfg: HarvestConfig) -> Carry:
    picks = empty_picks(n_alive, cfg.k, cfg.window)
    return (
        jnp.zeros(n_alive, jnp.int32),
        jnp.zeros(n_alive),
        jnp.zeros((n_alive, cfg.bins), jnp.int32),
        jnp.zeros((n_alive, n_alive), jnp.int32),
        picks,
        picks,
    )


@partial(jax.jit, static_argnames=("cfg",))
def site_step(
    carry: Carry,
    ci: Float[Array, "B T A"],
    x: Int[Array, "B T"],
    key: jax.Array,
    offset: Int[Array, ""],
    cfg: HarvestConfig,
) -> tuple[Carry, Bool[Array, "N A"]]:
    """One batch into a site's accumulators (`ci` of its alive subcomponents, `x` the inputs,
    or PAD where they are not tokens); also returns where each fires (never at a window's
    first `skip_first` positions)."""
    count, ci_sum, hist, cofire, top, sample = carry
    flat = ci.reshape(-1, ci.shape[-1])
    counted = (jnp.arange(flat.shape[0]) % ci.shape[1] >= cfg.skip_first)[:, None]
    fires = (flat > cfg.threshold) & counted
    as_float = fires.astype(jnp.float32)  # counts of a batch are exact in float32
    cofire = cofire + (as_float.T @ as_float).astype(jnp.int32)
    bin_of = jnp.clip((flat * cfg.bins).astype(jnp.int32), 0, cfg.bins - 1)
    # no [N, A, bins] one-hot
    hist = hist.at[jnp.arange(flat.shape[1])[None, :], bin_of].add(counted.astype(jnp.int32))
    k, w = cfg.k, cfg.window
    by_ci = _candidates(jnp.where(fires, flat, -jnp.inf), ci, x, k, w)
    u = jax.random.uniform(key, flat.shape)
    by_key = _candidates(jnp.where(fires, -u, -jnp.inf), ci, x, k, w)
    by_ci = (by_ci[0], by_ci[1] + offset, by_ci[2], by_ci[3])  # batch positions → global
    by_key = (by_key[0], by_key[1] + offset, by_key[2], by_key[3])
    top, sample = _merge(top, by_ci, k), _merge(sample, by_key, k)
    count = count + fires.sum(0, dtype=jnp.int32)
    return (count, ci_sum + jnp.where(counted, flat, 0.0).sum(0), hist, cofire, top, sample), fires


def _as_bt(ci: Array) -> Array:
    """A site's CI as `[B, T, C]` (a toy's `[B, C]` has T = 1)."""
    return ci if ci.ndim == 3 else ci[:, None, :]


def _inputs(x: Batch) -> np.ndarray:
    """The inputs a window shows: a language model's token ids `[B, T]`, else PAD `[B, 1]`."""
    if jnp.issubdtype(x.dtype, jnp.integer):
        return np.asarray(x, np.int32)
    return np.full((x.shape[0], 1), PAD, np.int32)


def batch_ci(d: Decomposition, x: Batch) -> dict[str, Float[Array, "B *T C"]]:
    """`{site: CI}` of a batch, computed `CI_POSITIONS` positions at a time (its examples are
    independent; the last part padded with copies of the first example to the same shape)."""
    B = x.shape[0]
    rows = max(1, CI_POSITIONS // (x[0].size if jnp.issubdtype(x.dtype, jnp.integer) else 1))
    if B <= rows:
        return d._ci_jit(x)
    n = -(-B // rows)
    x = jnp.concatenate([x, jnp.repeat(x[:1], n * rows - B, axis=0)])
    parts = [d._ci_jit(x[i * rows : (i + 1) * rows]) for i in range(n)]
    return {site: jnp.concatenate([p[site] for p in parts])[:B] for site in parts[0]}


def read_batches(d: Decomposition, max_tokens: int, rows: int = 0) -> list[Batch]:
    """The run's evaluation batches (steps counting down from EVAL_FOLD, as its evaluation
    reads them) of `rows` examples (see `HarvestConfig.rows`): whole batches, as many as fit in
    `max_tokens` positions, at least one."""
    cfg = d.config
    if not rows:
        rows = max(cfg.eval.batch, 4096 // d.kind.seq_len) if d.kind.seq_len else cfg.eval.batch
    cfg = replace(cfg, eval=replace(cfg.eval, batch=rows))
    batches = make_batches(cfg, d.recipe, key_tree(cfg.seed)[2], evaluation=True, kind=d.kind)
    out = [batches(EVAL_FOLD)]
    size = _inputs(out[0]).size  # positions a batch
    while (len(out) + 1) * size <= max_tokens:
        out.append(batches(EVAL_FOLD - len(out)))
    return out


def _token_counts(
    fires: Bool[np.ndarray, "N A"], tokens: Int[np.ndarray, "B T"], vocab: int
) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """`[A, vocab]` counts of the input token, and of the next one, at each firing: counted
    densely over the batch's own tokens (a few thousand columns, where a firing per entry of a
    sparse matrix would be sorted), then stored sparse over the vocabulary."""
    n, a = np.nonzero(fires)
    T, A = tokens.shape[1], fires.shape[1]
    ids, column = np.unique(tokens.reshape(-1), return_inverse=True)
    has_next = n % T < T - 1

    def counts(rows: np.ndarray, columns: np.ndarray) -> sp.csr_matrix:
        dense = np.bincount(rows * ids.size + columns, minlength=A * ids.size)
        found = sp.csr_matrix(dense.reshape(A, ids.size).astype(np.int32))
        return sp.csr_matrix((found.data, ids[found.indices], found.indptr), shape=(A, vocab))

    return counts(a, column[n]), counts(a[has_next], column[n[has_next] + 1])


def _finished(
    C: int, alive: np.ndarray, carry: Carry, tokens: tuple[sp.csr_matrix, sp.csr_matrix] | None
) -> SiteHarvest:
    count, ci_sum, hist, cofire, top, sample = jax.device_get(carry)

    def picks(p: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        key, at, ci, inputs = (np.asarray(v) for v in p)
        return key, np.where(np.isfinite(key), at, PAD), ci, inputs

    inputs, after = (None, None) if tokens is None else tokens
    return SiteHarvest(
        C, alive, count, ci_sum, hist, picks(top), picks(sample), cofire, inputs, after
    )


def _alive_only(s: SiteHarvest) -> SiteHarvest:
    """`s` without the subcomponents that never fired (a one-pass harvest keeps every one)."""
    keep = s.count > 0
    if keep.all():
        return s
    k = np.flatnonzero(keep)
    return SiteHarvest(
        s.C,
        s.alive[k],
        s.count[k],
        s.ci_sum[k],
        s.hist[k],
        tuple(p[k] for p in s.top),
        tuple(p[k] for p in s.sample),
        s.cofire[np.ix_(k, k)],
        None if s.inputs is None else s.inputs[k],
        None if s.next_tokens is None else s.next_tokens[k],
    )


def _add_batch(
    carries: dict[str, Carry],
    counts: dict[str, tuple[sp.csr_matrix, sp.csr_matrix]],
    ci: dict[str, Array],
    alive: dict[str, np.ndarray],
    inputs: np.ndarray,
    keys: list[jax.Array],
    offset: int,
    cfg: HarvestConfig,
    vocab: int,
) -> None:
    """A batch's CI into each site's accumulators, in place: `carries`, and for tokens
    (`vocab` > 0) `counts`. Each site's CI is dropped from `ci` once it is added."""
    for sub, (site, idx) in zip(keys, alive.items(), strict=True):
        c = _as_bt(ci.pop(site))
        if idx.size < c.shape[-1]:  # a two-pass harvest's alive ones (a copy: an XLA gather)
            c = c[..., idx]
        carries[site], fires = site_step(carries[site], c, inputs, sub, offset, cfg)
        if vocab:
            add = _token_counts(np.asarray(fires), inputs, vocab)
            was = counts.get(site)
            counts[site] = add if was is None else (was[0] + add[0], was[1] + add[1])


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None under another C library."""
    name = ctypes.util.find_library("c")
    trim: Callable[[int], int] | None = getattr(ctypes.CDLL(name), "malloc_trim", None)
    return trim


def _release_freed() -> None:
    """Hand the C heap's freed pages back to the system. A batch frees some hundred MB in
    pieces of about 10 MB (its token counts and their CSR sums, XLA's buffers), which glibc
    keeps for reuse; over smollm2's 14 batches they held some 300 MB more at the peak."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def harvest(d: Decomposition, cfg: HarvestConfig = DEFAULTS, bar: bool = True) -> Harvest:
    """The harvest of `d` over its held-out data (see the module's docstring)."""
    batches = read_batches(d, cfg.max_tokens, cfg.rows)
    tokens = jnp.issubdtype(batches[0].dtype, jnp.integer)
    if not tokens:  # a toy's example is one position: no neighbours, nothing before it
        cfg = replace(cfg, window=0, skip_first=0)
    T = batches[0].shape[1] if tokens else 1
    if not 0 <= cfg.skip_first < T:
        raise ValueError(
            f"skip_first is {cfg.skip_first}, expected 0 or more and fewer than the {T} "
            "positions of a window"
        )
    alive = _alive_candidates(d, batches, cfg)
    vocab = int(jax.eval_shape(d.clean, batches[0]).shape[-1]) if tokens else 0
    counts: dict[str, tuple[sp.csr_matrix, sp.csr_matrix]] = {}
    totals, next_totals = np.zeros(vocab, np.int64), np.zeros(vocab, np.int64)
    carries = {site: initial_carry(a.size, cfg) for site, a in alive.items()}
    key, offset, skip = jax.random.key(cfg.seed), 0, cfg.skip_first
    for b, x in enumerate(tqdm(batches, desc="harvest", unit="batch", disable=not bar)):
        inputs = _inputs(x)
        keys = [jax.random.fold_in(key, b * len(alive) + i) for i in range(len(alive))]
        _add_batch(carries, counts, batch_ci(d, x), alive, inputs, keys, offset, cfg, vocab)
        _release_freed()
        if tokens:
            totals += np.bincount(inputs[:, skip:].reshape(-1), minlength=vocab)
            next_totals += np.bincount(inputs[:, skip + 1 :].reshape(-1), minlength=vocab)
        offset += inputs.size
    spec = d.recipe.table.spec
    sites = {
        site: _alive_only(_finished(spec(site).C, idx, carries[site], counts.get(site)))
        for site, idx in alive.items()
    }
    read = offset // T * (T - skip)  # the positions counted
    if not tokens:
        return Harvest(cfg, read, 1, sites, None, None)
    return Harvest(cfg, read, T, sites, totals, next_totals)


def _alive_candidates(
    d: Decomposition, batches: list[Batch], cfg: HarvestConfig
) -> dict[str, Int[np.ndarray, " A"]]:
    """Per site, the subcomponents the harvest keeps: every one, where no site has more than
    `ONE_PASS_C` (the silent ones are dropped at the end), else those that fire somewhere in a
    first pass over `batches`."""
    sizes = {site: d.recipe.table.spec(site).C for site in d.sites}
    if max(sizes.values()) <= ONE_PASS_C:
        return {site: np.arange(C) for site, C in sizes.items()}
    fired = {site: np.zeros(C, bool) for site, C in sizes.items()}
    for x in batches:
        for site, ci in batch_ci(d, x).items():
            read = _as_bt(ci)[:, cfg.skip_first :]
            fired[site] |= np.asarray(jnp.any(read > cfg.threshold, axis=(0, 1)))
    return {site: np.flatnonzero(f) for site, f in fired.items()}


def save(h: Harvest, path: Path) -> None:
    """The harvest as one `.npz`: `meta` (JSON: the config, `n_positions`, `seq_len`, the
    sites), `token_counts` and `next_counts` (tokens only), and per site `SITE/NAME` for `C`,
    `alive`, `count`, `ci_sum`, `hist`, `cofire`, `top_ci`, `top_at`, `top_ci_window`,
    `top_inputs`, `sample_key`, `sample_at`, `sample_ci_window`, `sample_inputs` and, for
    tokens, the CSR parts `inputs_data`, `inputs_indices`, `inputs_indptr` and the same for
    `next_tokens` (the shapes in `SiteHarvest`; an empty pick's position is -1)."""
    arrays: dict[str, np.ndarray] = {}
    meta = {"config": asdict(h.config), "n_positions": h.n_positions, "seq_len": h.seq_len}
    arrays["meta"] = np.asarray(json.dumps(meta | {"sites": list(h.sites)}))
    if h.token_counts is not None and h.next_counts is not None:
        arrays["token_counts"], arrays["next_counts"] = h.token_counts, h.next_counts
    for name, s in h.sites.items():
        parts = {"C": np.asarray(s.C), "alive": s.alive, "count": s.count, "ci_sum": s.ci_sum}
        parts |= {"hist": s.hist, "cofire": s.cofire}
        for which, picks in (("top", s.top), ("sample", s.sample)):
            first = "ci" if which == "top" else "key"
            for part, array in zip((first, "at", "ci_window", "inputs"), picks, strict=True):
                parts[f"{which}_{part}"] = array
        for which, counts in (("inputs", s.inputs), ("next_tokens", s.next_tokens)):
            if counts is not None:
                parts |= {f"{which}_{p}": getattr(counts, p) for p in ("data", "indices", "indptr")}
        arrays |= {f"{name}/{key}": value for key, value in parts.items()}
    savez: Callable[..., None] = np.savez_compressed  # its stub types **arrays as options
    savez(path, **arrays)
