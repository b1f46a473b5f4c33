"""Load Llama-architecture checkpoints in the Hugging Face layout from a local directory.

A directory holds `config.json` and either `model.safetensors` or a sharded
`model.safetensors.index.json` (its `weight_map` names the shard of every tensor). HF Linear
weights are `[out, in]`; pd's are `[d_in, d_out]`, so projections and the head are transposed.
The parameter tree is the one `pd.targets.llama` documents: per-layer tensors are written into
layer-stacked buffers directly.

Tensors are read with safetensors' numpy backend: safetensors 0.8 returns BF16 tensors as numpy
arrays of `ml_dtypes.bfloat16` (the dtype jax itself uses), so bf16 and fp32 checkpoints load
through the same path without a detour through torch or flax.

Every failure is a `CheckpointError`: one sentence naming the file or tensor, the value found and
what was expected. No raw safetensors, JSON or OS error escapes.
"""

import json
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import haiku as hk
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt
from safetensors import SafetensorError, safe_open

from pd.targets.llama import KINDS, LlamaArch

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
# Stored dtypes pd reads (safetensors dtype codes); all are cast to the load dtype.
_STORED = ("F32", "BF16", "F16")
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
_HF_PROJ = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}


class CheckpointError(ValueError):
    """A checkpoint pd cannot load; the message names the file or tensor, the value and what
    was expected, in one sentence."""


class _Tensor(NamedTuple):
    """One tensor pd needs: HF name, pd parameter name, HF shape, whether to transpose, and
    the layer it fills in a layer-stacked parameter (-1: not stacked)."""

    hf: str
    pd: str
    shape: tuple[int, ...]
    transpose: bool
    layer: int = -1


class _Stored(NamedTuple):
    """A tensor's header entry: its file, safetensors dtype code and shape."""

    file: Path
    dtype: str
    shape: tuple[int, ...]


def load_hf(path: str | Path, dtype: str | None = None) -> tuple[LlamaArch, hk.Params]:
    """The architecture and haiku parameters of a local HF Llama checkpoint.

    `dtype` is `"float32"` or `"bfloat16"`; `None` keeps an all-BF16 checkpoint in bf16 and loads
    anything else (F32, F16 or mixed) in fp32.
    """
    if dtype is not None and dtype not in _DTYPES:
        raise ValueError(f"load_hf dtype is {dtype!r}, expected None, 'float32' or 'bfloat16'")
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(
            f"checkpoint directory {root} does not exist, expected a directory with "
            f"{CONFIG} and {SINGLE} or {INDEX}"
        )
    arch = read_config(root / CONFIG)
    stored = _locate(root, _layout(arch))
    if dtype is None:
        codes = {s.dtype for s in stored.values()}
        dtype = "bfloat16" if codes == {"BF16"} else "float32"
    # Host buffers in the layer-stacked layout, filled one tensor at a time, then moved once.
    buffers: dict[str, npt.NDArray[np.generic]] = {}
    np_dtype = np.dtype(_DTYPES[dtype])
    for t in stored:
        shape = t.shape[::-1] if t.transpose else t.shape
        if t.pd not in buffers:
            lead = (arch.n_layers,) if t.layer >= 0 else ()
            buffers[t.pd] = np.empty((*lead, *shape), np_dtype)
    for file in sorted({s.file for s in stored.values()}):
        _read(file, [t for t, s in stored.items() if s.file == file], buffers)
    return arch, {"~": {name: jnp.asarray(b) for name, b in buffers.items()}}


def read_config(file: Path) -> LlamaArch:
    """The `LlamaArch` of an HF `config.json` (HF's defaults for absent optional fields)."""
    cfg = _json_object(file)
    rope = _supported_variant(file, cfg)

    def integer(key: str, default: int | None = None) -> int:
        value = cfg.get(key)
        if value is None and default is not None:
            return default
        if not isinstance(value, int) or isinstance(value, bool):
            raise CheckpointError(f"{file} field {key} is {value!r}, expected an integer")
        return value

    def number(key: str, value: object) -> float:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise CheckpointError(f"{file} field {key} is {value!r}, expected a number")
        return float(value)

    heads = integer("num_attention_heads")
    tie = cfg.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise CheckpointError(f"{file} field tie_word_embeddings is {tie!r}, expected a boolean")
    # transformers 5 moves rope_theta into rope_parameters.
    theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
    sizes = dict(
        vocab=integer("vocab_size"),
        d_model=integer("hidden_size"),
        n_layers=integer("num_hidden_layers"),
        n_heads=heads,
        n_kv_heads=integer("num_key_value_heads", heads),
        d_mlp=integer("intermediate_size"),
        head_dim=integer("head_dim", 0),
    )
    rope_base = number("rope_theta", theta)
    rms_eps = number("rms_norm_eps", cfg.get("rms_norm_eps", 1e-6))  # LlamaConfig's default
    try:
        return LlamaArch(**sizes, rope_base=rope_base, rms_eps=rms_eps, tie_embeddings=tie)
    except ValueError as e:
        raise CheckpointError(f"{file} gives an invalid architecture: {e}") from e


def _json_object(file: Path) -> dict[str, object]:
    """The JSON object a config file holds."""
    if not file.is_file():
        raise CheckpointError(f"{file} does not exist, expected a Hugging Face config file")
    try:
        raw: object = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file} cannot be parsed ({e}), expected a JSON object") from e
    if not isinstance(raw, dict):
        raise CheckpointError(f"{file} holds a {type(raw).__name__}, expected a JSON object")
    return raw


def _supported_variant(file: Path, cfg: dict[str, object]) -> dict[str, object]:
    """Refuse a model this forward does not compute (it must fail here, not give silently wrong
    logits); returns its RoPE parameters."""
    archs = cfg.get("architectures") or []
    if not (isinstance(archs, list) and "LlamaForCausalLM" in archs) and (
        cfg.get("model_type") != "llama"
    ):
        raise CheckpointError(
            f"{file} describes architectures {archs!r} with model_type "
            f"{cfg.get('model_type')!r}, expected LlamaForCausalLM or model_type 'llama'"
        )
    for key, allowed in (("hidden_act", ("silu", None)), ("attention_bias", (False, None))):
        if cfg.get(key) not in allowed:
            raise CheckpointError(f"{file} sets {key} to {cfg.get(key)!r}, expected {allowed[0]!r}")
    if cfg.get("mlp_bias") not in (False, None):
        raise CheckpointError(f"{file} sets mlp_bias to {cfg.get('mlp_bias')!r}, expected False")
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if not isinstance(rope, dict) or rope.get("rope_type", rope.get("type", "default")) != (
        "default"
    ):
        raise CheckpointError(
            f"{file} sets RoPE scaling {rope!r}, expected none (pd implements unscaled RoPE)"
        )
    return rope


def _layout(a: LlamaArch) -> list[_Tensor]:
    """Every tensor a checkpoint of architecture `a` must hold, with its pd parameter name."""
    d = a.d_model
    out = [_Tensor("model.embed_tokens.weight", "embed", (a.vocab, d), False)]
    for i in range(a.n_layers):
        pre = f"model.layers.{i}."
        out.append(_Tensor(pre + "input_layernorm.weight", "attn_norm", (d,), False, i))
        out.append(_Tensor(pre + "post_attention_layernorm.weight", "mlp_norm", (d,), False, i))
        for kind in KINDS:
            d_in, d_out = a.site_shape(kind)
            out.append(_Tensor(f"{pre}{_HF_PROJ[kind]}.weight", kind, (d_out, d_in), True, i))
    out.append(_Tensor("model.norm.weight", "final_norm", (d,), False))
    if not a.tie_embeddings:  # a tied checkpoint may still store lm_head; it is ignored
        out.append(_Tensor("lm_head.weight", "head", (a.vocab, d), True))
    return out


def _locate(root: Path, tensors: list[_Tensor]) -> dict[_Tensor, _Stored]:
    """Where each needed tensor is stored, after checking its presence, dtype and shape."""
    index = root / INDEX
    if index.is_file():
        weight_map = _read_index(index)
        for shard in sorted(set(weight_map.values())):
            if not (root / shard).is_file():
                raise CheckpointError(
                    f"{index} maps tensors to shard {shard!r}, expected {root / shard} to exist"
                )
    elif (root / SINGLE).is_file():
        weight_map = dict.fromkeys(_header(root / SINGLE), SINGLE)
    else:
        raise CheckpointError(f"{root} has neither {SINGLE} nor {INDEX}, expected one of them")
    headers: dict[str, dict[str, _Stored]] = {}
    located: dict[_Tensor, _Stored] = {}
    for t in tensors:
        if t.hf not in weight_map:
            where = index if index.is_file() else root / SINGLE
            raise CheckpointError(
                f"tensor {t.hf} is missing from {where}, expected a tensor of shape {list(t.shape)}"
            )
        shard = weight_map[t.hf]
        if shard not in headers:
            headers[shard] = _header(root / shard)
        s = headers[shard].get(t.hf)
        if s is None:
            raise CheckpointError(
                f"tensor {t.hf} is missing from shard {root / shard}, expected it there as "
                f"{index} places it"
            )
        if s.dtype not in _STORED:
            raise CheckpointError(
                f"tensor {t.hf} in {s.file} has dtype {s.dtype}, expected one of "
                f"{', '.join(_STORED)}"
            )
        if s.shape != t.shape:
            raise CheckpointError(
                f"tensor {t.hf} in {s.file} has shape {list(s.shape)}, expected {list(t.shape)}"
            )
        located[t] = s
    return located


def _read_index(index: Path) -> dict[str, str]:
    """The `weight_map` of a sharded checkpoint's index: tensor name → shard file name."""
    try:
        raw: object = json.loads(index.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{index} cannot be parsed ({e}), expected a JSON object") from e
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise CheckpointError(
            f"{index} has weight_map {weight_map!r:.80}, expected a map of tensor to file names"
        )
    return dict(weight_map)


def _header(file: Path) -> dict[str, _Stored]:
    """A safetensors file's tensor names, dtypes and shapes (the header only, no data)."""
    try:
        with safe_open(file, framework="numpy") as f:
            names: list[str] = f.keys()
            out: dict[str, _Stored] = {}
            for name in names:
                info = f.get_slice(name)
                code: str = info.get_dtype()
                shape: list[int] = info.get_shape()
                out[name] = _Stored(file, code, tuple(shape))
            return out
    except (SafetensorError, OSError) as e:
        raise CheckpointError(
            f"{file} is truncated or corrupt ({e}), expected a complete safetensors file"
        ) from e


def _read(file: Path, tensors: list[_Tensor], buffers: dict[str, npt.NDArray[np.generic]]) -> None:
    """Copy the tensors stored in one safetensors file into their buffers, converted one at a
    time (beyond the buffers, host memory holds one tensor, not a whole shard)."""
    try:
        with safe_open(file, framework="numpy") as f:
            get: Callable[[str], npt.NDArray[np.generic]] = f.get_tensor
            for t in tensors:
                value = get(t.hf)  # BF16 arrives as an ml_dtypes.bfloat16 numpy array
                dest = buffers[t.pd] if t.layer < 0 else buffers[t.pd][t.layer]
                dest[...] = value.T if t.transpose else value
    except (SafetensorError, OSError, TypeError) as e:  # TypeError: a safetensors without bf16
        raise CheckpointError(
            f"{file} cannot be read ({e}), expected a complete safetensors file"
        ) from e
