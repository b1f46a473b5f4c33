"""Token data (SPEC S18, §12): batches are a pure function of (seed, step) with O(1) resume,
per-process rows are slices of the global batch, token files round-trip and fail loudly, and the
synthetic corpus has the entropy it claims and needs more than bigram statistics."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pd.data import DataError, TokenSource, load_tokens, synthetic_corpus


def _arange_source(n: int = 1000) -> TokenSource:
    return TokenSource(np.arange(n, dtype=np.int32), "arange")


def test_s18_batch_is_a_pure_function_of_seed_and_step() -> None:
    src = _arange_source()
    a = src.batch(3, 5, 8, 16)
    assert a.dtype == np.int32 and a.shape == (8, 16)
    src.batch(3, 6, 8, 16)  # no state carried between calls
    np.testing.assert_array_equal(src.batch(3, 5, 8, 16), a)
    assert not np.array_equal(src.batch(3, 6, 8, 16), a)
    assert not np.array_equal(src.batch(4, 5, 8, 16), a)
    # Every row is one contiguous window of the corpus.
    np.testing.assert_array_equal(a - a[:, :1], np.broadcast_to(np.arange(16), a.shape))
    assert a.min() >= 0 and a.max() < 1000


def test_s18_resume_at_step_s_needs_no_replay(tmp_path: Path) -> None:
    path = tmp_path / "tokens.npy"
    np.save(path, np.arange(5000, dtype=np.uint16))
    run = load_tokens(path)
    first = [run.batch(11, s, 4, 32) for s in range(10)]
    resumed = load_tokens(path)  # a fresh process: it jumps straight to step 7
    for s in (7, 8, 9):
        np.testing.assert_array_equal(resumed.batch(11, s, 4, 32), first[s])


@given(
    seed=st.integers(0, 2**64 - 1),
    step=st.integers(0, 2**64 - 1),
    batch_size=st.integers(1, 13),
    cut=st.tuples(st.integers(0, 13), st.integers(0, 13)),
)
def test_s18_rows_are_the_slice_of_the_global_batch(
    seed: int, step: int, batch_size: int, cut: tuple[int, int]
) -> None:
    src = _arange_source(200)
    start, stop = sorted(min(c, batch_size) for c in cut)
    full = src.batch(seed, step, batch_size, 7)
    np.testing.assert_array_equal(src.rows(seed, step, 7, start, stop), full[start:stop])


def test_s18_rows_split_over_processes_reassemble_the_batch() -> None:
    src = _arange_source(300)
    parts = [src.rows(0, 9, 10, p * 6, (p + 1) * 6) for p in range(4)]
    np.testing.assert_array_equal(np.concatenate(parts), src.batch(0, 9, 24, 10))


def test_s18_every_window_start_is_reachable() -> None:
    src = _arange_source(20)  # 16 windows of 5 tokens, the last one ends at the last token
    starts = {int(row[0]) for s in range(100) for row in src.batch(0, s, 8, 5)}
    assert starts == set(range(16))


@pytest.mark.parametrize("dtype", ["int32", "uint16", "uint32", "int64"])
def test_npy_round_trip(tmp_path: Path, dtype: str) -> None:
    ids = np.random.default_rng(0).integers(0, 50_000, 4096).astype(dtype)
    path = tmp_path / "tokens.npy"
    np.save(path, ids)
    src = load_tokens(path)
    assert src.n_tokens == 4096 and str(path) in src.name
    src.check_vocab(50_000)
    b = src.batch(1, 2, 3, 64)
    assert b.dtype == np.int32
    for row in b:  # each row occurs verbatim in the file
        o = int(np.flatnonzero(ids[: 4096 - 63] == row[0])[0])
        np.testing.assert_array_equal(row, ids[o : o + 64])


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_bin_round_trip(tmp_path: Path, dtype: str) -> None:
    ids = np.arange(3000, dtype=dtype)
    path = tmp_path / "shard.bin"
    ids.tofile(path)
    src = load_tokens(path, bin_dtype=dtype)
    assert src.n_tokens == 3000
    np.testing.assert_array_equal(src.tokens, ids)
    b = src.batch(5, 0, 2, 9)
    np.testing.assert_array_equal(b - b[:, :1], np.broadcast_to(np.arange(9), b.shape))


def _write(path: Path, array: np.ndarray) -> Path:
    np.save(path, array)
    return path


def test_load_errors_name_the_file_and_value(tmp_path: Path) -> None:
    missing = tmp_path / "absent.npy"
    with pytest.raises(DataError, match=rf"{missing} does not exist"):
        load_tokens(missing)
    txt = tmp_path / "tokens.txt"
    txt.write_text("1 2 3")
    with pytest.raises(DataError, match=r"tokens\.txt has suffix '\.txt', expected \.npy or \.bin"):
        load_tokens(txt)
    two_d = _write(tmp_path / "two_d.npy", np.zeros((4, 5), np.int32))
    with pytest.raises(
        DataError, match=r"two_d\.npy holds an array of shape \(4, 5\), expected a 1-D"
    ):
        load_tokens(two_d)
    floats = _write(tmp_path / "floats.npy", np.zeros(10, np.float32))
    with pytest.raises(DataError, match=r"floats\.npy holds dtype float32, expected integer"):
        load_tokens(floats)
    objects = _write(tmp_path / "objects.npy", np.array([1, "a"], dtype=object))
    with pytest.raises(DataError, match=r"objects\.npy is not a plain \.npy array"):
        load_tokens(objects)
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x00" * 7)
    with pytest.raises(DataError, match=r"odd\.bin has 7 bytes, expected a multiple of 2"):
        load_tokens(odd)
    with pytest.raises(DataError, match=r"odd\.bin read as dtype float32, expected an integer"):
        load_tokens(odd, bin_dtype="float32")


def test_too_few_tokens_for_a_window(tmp_path: Path) -> None:
    short = load_tokens(_write(tmp_path / "short.npy", np.arange(10, dtype=np.int32)))
    short.batch(0, 0, 2, 10)  # exactly one window fits
    with pytest.raises(DataError, match=r"short\.npy has 10 tokens, expected .* seq_len 11"):
        short.batch(0, 0, 2, 11)
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match=r"empty\.bin has 0 tokens"):
        load_tokens(empty).batch(0, 0, 1, 1)


def test_vocab_and_range_errors(tmp_path: Path) -> None:
    src = load_tokens(_write(tmp_path / "ids.npy", np.array([0, 5, 99, 7], np.int32)))
    src.check_vocab(100)
    with pytest.raises(DataError, match=r"ids\.npy holds token id 99, expected ids below vocab 64"):
        src.check_vocab(64)
    neg = load_tokens(_write(tmp_path / "neg.npy", np.array([3, -2, 1], np.int32)))
    with pytest.raises(DataError, match=r"neg\.npy holds token id -2, expected ids >= 0"):
        neg.check_vocab(10)
    with pytest.raises(DataError, match=r"neg\.npy holds token id -2"):
        neg.batch(0, 0, 4, 3)  # the only window contains it
    huge = load_tokens(_write(tmp_path / "huge.npy", np.array([2**31] * 3, np.int64)))
    with pytest.raises(DataError, match=r"huge\.npy holds token id 2147483648, expected ids in"):
        huge.batch(0, 0, 1, 2)  # int32 output must not wrap silently
    with pytest.raises(DataError, match=r"seed -1 for .*ids\.npy"):
        src.batch(-1, 0, 1, 2)
    with pytest.raises(DataError, match=r"rows \[3, 1\)"):
        src.rows(0, 0, 2, 3, 1)


def _conditional_entropy(tokens: np.ndarray, vocab: int, order: int) -> float:
    """Plug-in H(x_t | previous `order` tokens) with the Miller–Madow bias correction."""
    x = tokens.astype(np.int64)
    ctx = np.zeros(len(x) - 2, np.int64)
    for k in range(order, 0, -1):
        ctx = ctx * vocab + x[2 - k : len(x) - k]
    nxt = x[2:]
    joint = np.bincount(ctx * vocab + nxt).astype(np.float64)
    marg = np.bincount(ctx).astype(np.float64)
    joint, marg, n = joint[joint > 0], marg[marg > 0], len(nxt)
    plug_in = (marg @ np.log(marg) - joint @ np.log(joint)) / n
    return float(plug_in + (len(joint) - len(marg)) / (2 * n))


@pytest.mark.parametrize(("vocab", "n_classes"), [(16, 4), (64, 4), (32, 32)])
def test_synthetic_entropy_matches_a_long_sample(vocab: int, n_classes: int) -> None:
    src, entropy = synthetic_corpus(0, vocab, 1_000_000, n_classes=n_classes)
    src.check_vocab(vocab)
    trigram = _conditional_entropy(src.tokens, vocab, 2)
    assert trigram == pytest.approx(entropy, rel=0.01)
    # Attention matters: the token before the current one removes a large part of the entropy.
    assert _conditional_entropy(src.tokens, vocab, 1) > entropy + 0.2


def test_synthetic_corpus_is_deterministic_and_extends() -> None:
    a, ha = synthetic_corpus(5, 32, 5000)
    b, hb = synthetic_corpus(5, 32, 5000)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert ha == hb and 0.0 < ha < np.log(8)  # at most log(n_successors)
    longer, hl = synthetic_corpus(5, 32, 9000)
    np.testing.assert_array_equal(longer.tokens[:5000], a.tokens)
    assert hl == ha
    other, ho = synthetic_corpus(6, 32, 5000)
    assert not np.array_equal(other.tokens, a.tokens) and ho != ha
    assert a.tokens.dtype == np.int32 and a.batch(0, 0, 2, 8).shape == (2, 8)


def test_synthetic_corpus_argument_errors() -> None:
    with pytest.raises(DataError, match="vocab 1, expected 2"):
        synthetic_corpus(0, 1, 100)
    with pytest.raises(DataError, match="n_successors 9, expected 2 to 8"):
        synthetic_corpus(0, 8, 100, n_successors=9)
    with pytest.raises(DataError, match="n_classes 0"):
        synthetic_corpus(0, 8, 100, n_classes=0)
    with pytest.raises(DataError, match=r"alpha 0\.0"):
        synthetic_corpus(0, 8, 100, alpha=0.0)
    with pytest.raises(DataError, match="n_tokens 0"):
        synthetic_corpus(0, 8, 0)
