"""Real text into token files: the tokenizer of the SmolLM2 GGUF, built from its metadata, and
`python -m pd.text tokenize`."""

import itertools
from pathlib import Path

import numpy as np
import pytest
from test_smollm2 import smollm2_file

from pd.data import load_tokens
from pd.text import gguf_tokenizer, main, tokenize_files


def test_the_gguf_tokenizer_splits_words_as_the_models_vocabulary_does() -> None:
    tokenizer, eos = gguf_tokenizer(smollm2_file())
    assert tokenizer.get_vocab_size() == 49152 and eos == 2
    encoded = tokenizer.encode("The capital of France is Paris.")
    assert encoded.tokens == ["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis", "ĠParis", "."]
    text = "Line one,\n  two spaces; 2,140 digits — and ünïcödé!"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text  # byte-level: lossless


def test_tokenize_writes_train_and_held_out_token_files(tmp_path: Path) -> None:
    for i in range(2):
        (tmp_path / f"doc{i}.txt").write_text(" ".join(["word"] * 100) + f" end{i}.")
    out = tmp_path / "tokens"
    args = [str(tmp_path / "doc0.txt"), str(tmp_path / "doc1.txt"), "--held-out", "0.2"]
    assert main(["tokenize", str(smollm2_file()), str(out), *args]) == 0
    train, held_out = load_tokens(out / "train.npy"), load_tokens(out / "held_out.npy")
    assert train.tokens.dtype == np.uint16
    train.check_vocab(49152)
    n_train, n_held = train.n_tokens, held_out.n_tokens
    assert abs(n_held / (n_train + n_held) - 0.2) < 0.05
    n_eos = sum(int(np.sum(np.asarray(t.tokens) == 2)) for t in (train, held_out))
    assert n_eos == 2  # one end-of-sequence per document


def test_a_separator_line_splits_a_file_into_documents(tmp_path: Path) -> None:
    tokenizer, eos = gguf_tokenizer(smollm2_file())
    text = tmp_path / "fortunes"
    text.write_text("A penny saved.\n%\nLook before you leap.\n%\n100% sure.\n")
    train, held_out = tokenize_files(tokenizer, eos, [text], 0.0, separator="%")
    assert held_out.tolist() == [] and train[-1] == eos
    ends = [-1, *np.flatnonzero(train == eos).tolist()]
    docs = [tokenizer.decode(train[a + 1 : b].tolist()) for a, b in itertools.pairwise(ends)]
    assert docs == ["A penny saved.", "Look before you leap.", "100% sure.\n"]
    # Every second document held out: the second, not the last part of the file.
    train, held_out = tokenize_files(tokenizer, eos, [text], 0.5, separator="%")
    assert tokenizer.decode(held_out[:-1].tolist()) == "Look before you leap."
    assert tokenizer.decode(train.tolist()).count("<|im_end|>") == 2


def test_unreadable_text_is_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("café".encode("latin-1"))
    assert main(["tokenize", str(smollm2_file()), str(tmp_path / "out"), str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "latin1.txt" in err and "\n" not in err
    assert not (tmp_path / "out").exists()
