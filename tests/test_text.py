"""Real text into token files: the tokenizer of the SmolLM2 GGUF, built from its metadata, and
`python -m pd.text tokenize`."""

from pathlib import Path

import numpy as np
import pytest
from test_smollm2 import smollm2_file

from pd.data import load_tokens
from pd.text import gguf_tokenizer, main


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
    assert int(np.sum(np.asarray(train.tokens) == 2)) == 2  # one end-of-sequence per document


def test_unreadable_text_is_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("café".encode("latin-1"))
    assert main(["tokenize", str(smollm2_file()), str(tmp_path / "out"), str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "latin1.txt" in err and "\n" not in err
    assert not (tmp_path / "out").exists()
