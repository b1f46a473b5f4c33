"""Real text into the token files pd reads: the tokenizer of a GGUF model, built from the file's
own metadata with Hugging Face's `tokenizers` (byte-level BPE: `tokenizer.ggml.tokens` and
`.merges`), and a command that tokenizes text files into a train and a held-out `.npy`.

    python -m pd.text tokenize MODEL.gguf OUT_DIR TEXT_FILE ... [--held-out 0.1] [--separator %]

Documents (one per file, or split at a `--separator` line) end with the model's end-of-sequence
token. No text is in both parts: the held-out part is every `1 / held_out`-th document of a split
file, and the last `--held-out` fraction of the tokens of a whole one.
"""

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from pd.data import DataError


def gguf_tokenizer(path: str | Path) -> tuple[Tokenizer, int]:
    """The byte-level BPE tokenizer stored in a GGUF file, and its end-of-sequence id."""
    from pd.targets.gguf import gguf_reader  # the model's stack, only where a GGUF file is read

    fields = gguf_reader(path).fields

    def field(key: str) -> object:
        if key not in fields:
            raise DataError(f"GGUF file {path} has no {key}, expected a byte-level BPE tokenizer")
        value: object = fields[key].contents()
        return value

    kind = field("tokenizer.ggml.model")
    if kind != "gpt2":
        raise DataError(f"GGUF file {path} has tokenizer.ggml.model {kind!r}, expected 'gpt2'")
    tokens, merges, eos = (
        field(f"tokenizer.ggml.{k}") for k in ("tokens", "merges", "eos_token_id")
    )
    assert isinstance(tokens, list) and isinstance(merges, list) and isinstance(eos, int)
    pairs = [(a, b) for a, _, b in (str(m).partition(" ") for m in merges)]
    bpe = models.BPE({str(t): i for i, t in enumerate(tokens)}, pairs)
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer, eos


def tokenize_files(
    tokenizer: Tokenizer, eos: int, files: list[Path], held_out: float, separator: str = ""
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """`(train, held_out)` token ids of the files.

    A file is one document, or several split at each `separator` line (`%` in the `fortune`
    format); every document ends with `eos`. Of documents split from a file, every
    `1 / held_out`-th one is held out (spread through the file, which may be sorted); a whole
    file is cut, its last `held_out` fraction of tokens held out."""
    train: list[int] = []
    test: list[int] = []
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"text file {file} cannot be read as UTF-8 ({e})") from e
        if separator:
            for i, enc in enumerate(tokenizer.encode_batch(text.split(f"\n{separator}\n"))):
                held = math.floor((i + 1) * held_out) > math.floor(i * held_out)
                (test if held else train).extend((*enc.ids, eos))
        else:
            ids = [*tokenizer.encode(text).ids, eos]
            cut = len(ids) - round(held_out * len(ids))
            train += ids[:cut]
            test += ids[cut:]
    return np.asarray(train, np.int64), np.asarray(test, np.int64)


def _save(path: Path, tokens: npt.NDArray[np.int64], vocab: int) -> None:
    dtype = np.uint16 if vocab <= 2**16 else np.int32
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as f:
        np.save(f, tokens.astype(dtype))
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pd.text")
    sub = parser.add_subparsers(dest="command", required=True)
    tok = sub.add_parser("tokenize", help="text files → train.npy and held_out.npy")
    tok.add_argument("model", type=Path, help="a GGUF file whose tokenizer to use")
    tok.add_argument("out", type=Path, help="folder for train.npy and held_out.npy")
    tok.add_argument("texts", type=Path, nargs="+")
    tok.add_argument("--held-out", type=float, default=0.1)
    tok.add_argument("--separator", default="", help="a line that separates documents, e.g. %%")
    args = parser.parse_args(argv)
    try:
        if not 0.0 <= args.held_out < 1.0:
            raise DataError(f"--held-out is {args.held_out}, expected a fraction in [0, 1)")
        tokenizer, eos = gguf_tokenizer(args.model)
        train, held_out = tokenize_files(tokenizer, eos, args.texts, args.held_out, args.separator)
    except (DataError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    vocab = tokenizer.get_vocab_size()
    _save(args.out / "train.npy", train, vocab)
    _save(args.out / "held_out.npy", held_out, vocab)
    print(f"{train.size} train and {held_out.size} held-out tokens in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
