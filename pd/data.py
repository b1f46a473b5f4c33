"""Token data for language-model targets: batches as a pure function of `(seed, step)` (SPEC S18).

A run never streams from a hub (PITFALLS 37): it reads a local file of token ids (`.npy`, or
raw `.bin`) through a memory map, a local text file it tokenizes at start (`pd.text`), or the
built-in synthetic corpus. A local file may be named inside an installed package
(`package:NAME/PATH`, `local_file`), so that presets can use what `make setup` installs. Window
start offsets come from the counter-based Philox generator keyed by `(seed, step)`, so the batch
of step s is computed directly (O(1) resume) and each process can build only its own rows.
"""

import bisect
import importlib.metadata
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from jaxtyping import Float64, Int32, Integer

_INT32_MAX = int(np.iinfo(np.int32).max)
_UINT64_MAX = 2**64 - 1


class DataError(ValueError):
    """A token file or batch request that cannot be used, named with the offending value."""


PACKAGE = "package:"


def local_file(spec: str, key: str) -> Path:
    """The path of `spec`: a plain path, or `package:NAME/PATH`, the installed file of the
    distribution NAME whose recorded path ends with PATH. `key` names the config field."""
    if not spec.startswith(PACKAGE):
        return Path(spec)
    name, _, tail = spec.removeprefix(PACKAGE).partition("/")
    try:
        files = importlib.metadata.files(name) or []
    except importlib.metadata.PackageNotFoundError:
        raise DataError(
            f"config key '{key}' is {spec!r}, but package {name!r} is not installed "
            "(make setup installs it)"
        ) from None
    for file in files:
        if f"/{file.as_posix()}".endswith(f"/{tail}"):
            return Path(str(file.locate())).resolve()
    raise DataError(f"config key '{key}' is {spec!r}, but package {name!r} has no file {tail!r}")


def _check_tokens(tokens: np.ndarray, name: str) -> None:
    if tokens.ndim != 1:
        raise DataError(f"{name} holds an array of shape {tokens.shape}, expected a 1-D array")
    if not np.issubdtype(tokens.dtype, np.integer):
        raise DataError(
            f"{name} holds dtype {tokens.dtype}, expected integer token ids "
            "(int32, uint16 or uint32)"
        )


@dataclass(frozen=True, eq=False)  # identity equality and hash: an array has neither
class TokenSource:
    """A 1-D array of token ids (any integer dtype; memory maps welcome) and a name for errors.

    Batches are exposed as int32 whatever the storage dtype.
    """

    tokens: Integer[np.ndarray, " n"]
    name: str = "in-memory tokens"

    def __post_init__(self) -> None:
        _check_tokens(self.tokens, self.name)

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[0])

    def check_vocab(self, vocab: int) -> None:
        """Every id must index the model's embedding: `0 <= id < vocab` (one pass over the file)."""
        if not 0 < vocab <= _INT32_MAX + 1:
            raise DataError(f"vocab {vocab} for {self.name}, expected 1 to 2**31")
        if self.n_tokens == 0:
            return
        lo, hi = int(self.tokens.min()), int(self.tokens.max())
        if lo < 0:
            raise DataError(f"{self.name} holds token id {lo}, expected ids >= 0")
        if hi >= vocab:
            raise DataError(f"{self.name} holds token id {hi}, expected ids below vocab {vocab}")

    def batch(
        self, seed: int, step: int, batch_size: int, seq_len: int
    ) -> Int32[np.ndarray, "{batch_size} {seq_len}"]:
        """S18: `batch_size` random windows of `seq_len` tokens, a pure function of (seed, step).

        Ask for `seq_len + 1` tokens to get next-token inputs and labels from one window.
        """
        return self.rows(seed, step, seq_len, 0, batch_size)

    def rows(
        self, seed: int, step: int, seq_len: int, start: int, stop: int
    ) -> Int32[np.ndarray, "{stop}-{start} {seq_len}"]:
        """Rows `[start, stop)` of step `step`'s batch, without building the other rows: what
        one process contributes to a global batch. A row does not depend on the batch size.

        Row r's window starts at `word_r mod n_windows`, where `word_r` is the r-th 64-bit output
        of Philox4x64 keyed by `(seed, step)` (key words `[seed, step]`, counter from 0): four
        words per counter value, so rows from `start` on need only counter `start // 4`.
        BitGenerator streams are stable across NumPy versions (unlike `Generator` methods). The
        modulo bias is below `n_windows / 2**64`.
        """
        for what, value in (("seed", seed), ("step", step)):
            if not 0 <= value <= _UINT64_MAX:
                raise DataError(f"{what} {value} for {self.name}, expected 0 to 2**64 - 1")
        if seq_len <= 0 or not 0 <= start <= stop:
            raise DataError(
                f"rows [{start}, {stop}) of length {seq_len} from {self.name}, expected "
                "0 <= start <= stop and seq_len > 0"
            )
        n_windows = self.n_tokens - seq_len + 1
        if n_windows <= 0:
            raise DataError(
                f"{self.name} has {self.n_tokens} tokens, expected at least one window of "
                f"seq_len {seq_len}"
            )
        gen = np.random.Philox(key=np.array([seed, step], np.uint64), counter=start // 4)
        words = gen.random_raw(stop - start + start % 4)[start % 4 :]
        offsets = (words % np.uint64(n_windows)).astype(np.int64)
        window = np.asarray(self.tokens[offsets[:, None] + np.arange(seq_len)])
        if window.size and (window.min() < 0 or window.max() > _INT32_MAX):
            bad = window.min() if window.min() < 0 else window.max()
            raise DataError(f"{self.name} holds token id {bad}, expected ids in [0, 2**31)")
        return window.astype(np.int32)


def load_tokens(path: str | Path, bin_dtype: str = "uint16") -> TokenSource:
    """A memory-mapped token file: `.npy` (1-D integer array) or `.bin` (raw ids of `bin_dtype`,
    native byte order; uint16 is the usual GPT-2-style shard format)."""
    path = Path(path)
    name = f"token file {path}"
    if path.suffix not in (".npy", ".bin"):
        raise DataError(f"{name} has suffix '{path.suffix}', expected .npy or .bin")
    if not path.is_file():
        raise DataError(f"{name} does not exist, expected a readable file")
    tokens: np.ndarray
    if path.suffix == ".npy":
        try:
            tokens = np.load(path, mmap_mode="r")
        except (ValueError, OSError) as e:  # pickled, object or malformed arrays
            raise DataError(f"{name} is not a plain .npy array ({e}), expected one") from e
    else:
        dtype = np.dtype(bin_dtype)
        if not np.issubdtype(dtype, np.integer):
            raise DataError(f"{name} read as dtype {dtype}, expected an integer dtype")
        size = path.stat().st_size
        if size % dtype.itemsize:
            raise DataError(
                f"{name} has {size} bytes, expected a multiple of {dtype.itemsize} "
                f"({dtype} token ids)"
            )
        # np.memmap refuses empty files; an empty array fails later, naming the window it lacks.
        tokens = np.memmap(path, dtype, mode="r") if size else np.zeros(0, dtype)
    _check_tokens(tokens, name)
    return TokenSource(tokens, name)


def synthetic_corpus(
    seed: int,
    vocab: int,
    n_tokens: int,
    *,
    n_successors: int = 8,
    n_classes: int = 4,
    alpha: float = 0.5,
) -> tuple[TokenSource, float]:
    """A corpus with known structure, so a language-model preset needs no files, and its exact
    entropy rate in nats: the best achievable mean next-token loss given enough context.

    Generative process (all draws NumPy, from `default_rng([seed, 0])` for the tables and
    `default_rng([seed, 1])` for the sample, so the tables do not depend on `n_tokens` and a
    longer corpus extends a shorter one):

    - every token has a class, `cls = permutation(vocab) % n_classes` (balanced);
    - every token b has a successor pool of `n_successors` distinct tokens: `(b + 1) % vocab`
      (which makes every state reachable: one recurrent class) and the others drawn without
      replacement;
    - the next token depends on the current token b AND the class g of the token before it:
      `p(· | g, b) ~ Dirichlet(alpha · 1)` over pool(b), one independent draw per (g, b);
    - `x_0` and a virtual preceding class are uniform; then
      `x_{t+1} ~ p(· | cls[x_{t-1}], x_t)`.

    So bigram statistics narrow the next token to the pool of the current token, and only
    attention to the previous position tells which distribution over the pool applies.
    `n_classes = vocab` gives a plain second-order Markov chain.

    Entropy: the state `s_t = (cls[x_{t-1}], x_t)` is a Markov chain with transitions
    `(g, b) → (cls[b], c)` of probability `p(c | g, b)`. With its stationary distribution π
    (solved exactly: `π P = π`, `Σ π = 1`),
    `H = Σ_{g,b} π(g, b) · (−Σ_c p(c | g, b) log p(c | g, b))`.
    """
    _check_synthetic(vocab, n_tokens, n_successors, n_classes, alpha)
    cls, pool, probs = _chain_tables(seed, vocab, n_successors, n_classes, alpha)
    tokens = _sample_chain(seed, cls, pool, probs, n_tokens)
    entropy = _entropy_rate(cls, pool, probs)
    return TokenSource(tokens, f"synthetic corpus (seed {seed}, vocab {vocab})"), entropy


def _check_synthetic(
    vocab: int, n_tokens: int, n_successors: int, n_classes: int, alpha: float
) -> None:
    if vocab < 2 or vocab > _INT32_MAX + 1:
        raise DataError(f"synthetic corpus vocab {vocab}, expected 2 to 2**31")
    if not 2 <= n_successors <= vocab:
        raise DataError(f"synthetic corpus n_successors {n_successors}, expected 2 to {vocab}")
    if not 1 <= n_classes <= vocab:
        raise DataError(f"synthetic corpus n_classes {n_classes}, expected 1 to {vocab}")
    if not (alpha > 0 and math.isfinite(alpha)):
        raise DataError(f"synthetic corpus alpha {alpha}, expected a finite value > 0")
    if n_tokens < 1:
        raise DataError(f"synthetic corpus n_tokens {n_tokens}, expected at least 1")


def _chain_tables(
    seed: int, V: int, m: int, n_classes: int, alpha: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`synthetic_corpus`'s classes `[V]`, successor pools `[V, m]` and next-token
    distributions `[n_classes, V, m]`, from `default_rng([seed, 0])`."""
    tables = np.random.default_rng([seed, 0])
    cls = tables.permutation(V) % n_classes
    pool = np.empty((V, m), np.int64)
    for b in range(V):
        nxt = (b + 1) % V
        others = tables.choice(V - 1, m - 1, replace=False)
        pool[b] = [nxt, *(others + (others >= nxt))]  # skip nxt: the pool stays distinct
    probs = tables.dirichlet(np.full(m, alpha), size=(n_classes, V))  # [g, b, j]
    return cls, pool, probs


def _sample_chain(
    seed: int, cls: np.ndarray, pool: np.ndarray, probs: np.ndarray, n_tokens: int
) -> np.ndarray:
    """`n_tokens` of the chain, from `default_rng([seed, 1])`."""
    n_classes, V = probs.shape[:2]
    # Sample with plain Python lists: a per-token loop over NumPy scalars is ~5x slower.
    draws = np.random.default_rng([seed, 1])
    g0, x0 = int(draws.integers(n_classes)), int(draws.integers(V))
    cdf = np.cumsum(probs, axis=-1)
    cdf[..., -1] = 1.0  # u < 1 always lands in the pool despite rounding
    cdf_l, pool_l, cls_l = cdf.tolist(), pool.tolist(), cls.tolist()
    out = [x0]
    g, b = g0, x0
    for u in draws.random(n_tokens - 1).tolist():
        c = pool_l[b][bisect.bisect_right(cdf_l[g][b], u)]
        out.append(c)
        g, b = cls_l[b], c
    return np.asarray(out, np.int32)


def _entropy_rate(
    cls: Integer[np.ndarray, " V"],
    pool: Integer[np.ndarray, "V m"],
    probs: Float64[np.ndarray, "g V m"],
) -> float:
    """`Σ π(g, b) H(p(· | g, b))` for the state chain `(g, b) → (cls[b], c)` (see above)."""
    import scipy.sparse as sp  # lazily: only the synthetic corpus needs it
    from scipy.sparse.linalg import spsolve

    n_classes, V, m = probs.shape
    S = n_classes * V
    # A[t, s] = P[s, t] − δ(s, t): π is its null vector. With one recurrent class A has rank
    # S − 1 and its rows sum to zero, so row 0 may be replaced by the normalization Σ π = 1.
    t = np.broadcast_to(cls[:, None] * V + pool, (n_classes, V, m)).reshape(-1)
    s = np.repeat(np.arange(S), m)
    keep = t != 0
    rows = np.concatenate([t[keep], np.arange(1, S), np.zeros(S, np.int64)])
    cols = np.concatenate([s[keep], np.arange(1, S), np.arange(S)])
    vals = np.concatenate([probs.reshape(-1)[keep], -np.ones(S - 1), np.ones(S)])
    rhs = np.zeros(S)
    rhs[0] = 1.0
    pi = spsolve(sp.csc_matrix((vals, (rows, cols)), shape=(S, S)), rhs)
    pi = np.clip(np.asarray(pi, np.float64), 0.0, None)  # rounding can leave −1e-18
    plogp = probs * np.log(np.where(probs > 0, probs, 1.0))  # 0 log 0 = 0
    return float(pi @ -plogp.sum(-1).reshape(S) / pi.sum())
