"""§12: Hugging Face Llama checkpoints load into pd's Llama target and give HF's logits.

The checkpoints are small random models written here in the HF layout; the logits are checked
against an independent NumPy forward transcribed from HF's `modeling_llama.py`.
"""

import json
from pathlib import Path

import haiku as hk
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest
from safetensors.numpy import save_file

from pd.decompose import FROZEN
from pd.targets.hf import CheckpointError, load_hf
from pd.targets.llama import Llama, LlamaArch

NDArray = npt.NDArray[np.float32]
D, HEADS, KV_HEADS, D_MLP, VOCAB, LAYERS = 32, 4, 2, 48, 50, 2
TOKENS = np.random.default_rng(7).integers(0, VOCAB, size=(2, 9))


def hf_config(tied: bool, head_dim: int | None = None) -> dict[str, object]:
    cfg: dict[str, object] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": D,
        "intermediate_size": D_MLP,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": LAYERS,
        "vocab_size": VOCAB,
        "rms_norm_eps": 1e-5,
        "rope_theta": 5000.0,
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
        "rope_scaling": None,
    }
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    return cfg


def head_dim(cfg: dict[str, object]) -> int:
    return int(str(cfg.get("head_dim") or D // HEADS))


def kv_heads(cfg: dict[str, object]) -> int:
    return int(str(cfg.get("num_key_value_heads") or HEADS))


def hf_weights(cfg: dict[str, object], seed: int = 0) -> dict[str, NDArray]:
    """Random HF-layout weights (`[out, in]`) scaled so activations and logits are O(1)."""
    rng = np.random.default_rng(seed)
    hd, kv = head_dim(cfg), kv_heads(cfg)

    def linear(n_out: int, n_in: int) -> NDArray:
        w: npt.NDArray[np.float64] = rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)
        return w.astype(np.float32)

    def norm() -> NDArray:
        return (1.0 + 0.2 * rng.standard_normal(D)).astype(np.float32)

    w = {"model.embed_tokens.weight": rng.standard_normal((VOCAB, D)).astype(np.float32)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm()
        w[p + "self_attn.q_proj.weight"] = linear(HEADS * hd, D)
        w[p + "self_attn.k_proj.weight"] = linear(kv * hd, D)
        w[p + "self_attn.v_proj.weight"] = linear(kv * hd, D)
        w[p + "self_attn.o_proj.weight"] = linear(D, HEADS * hd)
        w[p + "post_attention_layernorm.weight"] = norm()
        w[p + "mlp.gate_proj.weight"] = linear(D_MLP, D)
        w[p + "mlp.up_proj.weight"] = linear(D_MLP, D)
        w[p + "mlp.down_proj.weight"] = linear(D, D_MLP)
    w["model.norm.weight"] = norm()
    if not cfg.get("tie_word_embeddings"):
        w["lm_head.weight"] = linear(VOCAB, D)
    return w


def write_checkpoint(
    root: Path,
    cfg: dict[str, object],
    weights: dict[str, npt.NDArray[np.generic]],
    shards: int = 1,
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(cfg))
    if shards == 1:
        save_file(weights, root / "model.safetensors")
        return root
    names = list(weights)
    weight_map = {}
    for j in range(shards):
        file = f"model-{j + 1:05d}-of-{shards:05d}.safetensors"
        part = names[j::shards]
        save_file({n: weights[n] for n in part}, root / file)
        weight_map.update(dict.fromkeys(part, file))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    return root


def reference_logits(
    weights: dict[str, NDArray], cfg: dict[str, object], tokens: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]:
    """HF `LlamaForCausalLM.forward`, eager attention, in float64 NumPy."""
    W = {k: v.astype(np.float64) for k, v in weights.items()}
    hd, kv = head_dim(cfg), kv_heads(cfg)
    eps = float(str(cfg.get("rms_norm_eps", 1e-6)))
    theta = float(str(cfg.get("rope_theta", 10000.0)))
    B, T = tokens.shape

    def rms_norm(x: npt.NDArray[np.float64], w: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        out: npt.NDArray[np.float64] = w * x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + eps)
        return out

    def rotate_half(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return np.concatenate([-x2, x1], axis=-1)

    inv_freq = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    freqs = np.outer(np.arange(T), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)  # [T, hd]
    cos, sin = np.cos(emb), np.sin(emb)
    causal = np.tril(np.ones((T, T), dtype=bool))

    h = W["model.embed_tokens.weight"][tokens]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        x = rms_norm(h, W[p + "input_layernorm.weight"])
        # [B, heads, T, hd], as HF's view(...).transpose(1, 2)
        q = (x @ W[p + "self_attn.q_proj.weight"].T).reshape(B, T, HEADS, hd).transpose(0, 2, 1, 3)
        k = (x @ W[p + "self_attn.k_proj.weight"].T).reshape(B, T, kv, hd)
        v = (x @ W[p + "self_attn.v_proj.weight"].T).reshape(B, T, kv, hd)
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        # repeat_kv: each KV head serves HEADS // KV_HEADS consecutive query heads
        k, v = np.repeat(k, HEADS // kv, axis=1), np.repeat(v, HEADS // kv, axis=1)
        scores = np.where(causal, q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd), -np.inf)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        attn = (probs @ v).transpose(0, 2, 1, 3).reshape(B, T, HEADS * hd)
        h = h + attn @ W[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, W[p + "post_attention_layernorm.weight"])
        gate, up = x @ W[p + "mlp.gate_proj.weight"].T, x @ W[p + "mlp.up_proj.weight"].T
        h = h + (gate / (1.0 + np.exp(-gate)) * up) @ W[p + "mlp.down_proj.weight"].T
    h = rms_norm(h, W["model.norm.weight"])
    head = W["model.embed_tokens.weight" if cfg.get("tie_word_embeddings") else "lm_head.weight"]
    out: npt.NDArray[np.float64] = h @ head.T
    return out


def pd_logits(arch: LlamaArch, params: hk.Params) -> NDArray:
    target = Llama(arch, kind_C=(("q", 2),), layers=(0,))
    return np.asarray(target.forward(params, jnp.asarray(TOKENS), FROZEN))


def assert_one_sentence(message: str, *names: str) -> None:
    assert "\n" not in message and ". " not in message, message
    for name in names:
        assert name in message, f"{name!r} not in {message!r}"


@pytest.mark.parametrize(
    ("tied", "head_dim"), [(False, None), (True, None), (False, 16)], ids=["untied", "tied", "hd16"]
)
def test_fp32_checkpoint_matches_the_hf_reference(
    tmp_path: Path, tied: bool, head_dim: int | None
) -> None:
    cfg = hf_config(tied, head_dim)
    weights = hf_weights(cfg)
    arch, params = load_hf(write_checkpoint(tmp_path, cfg, dict(weights)))
    hd = head_dim or D // HEADS
    assert arch == LlamaArch(
        VOCAB, D, LAYERS, HEADS, KV_HEADS, D_MLP, hd, 5000.0, 1e-5, tie_embeddings=tied
    )
    assert ("head" in params["~"]) is not tied
    assert params["~"]["o"].shape == (2, HEADS * hd, D)  # layer-stacked [d_in, d_out]: transposed
    assert all(v.dtype == jnp.float32 for v in params["~"].values())
    logits = pd_logits(arch, params)
    assert logits.dtype == np.float32
    np.testing.assert_allclose(logits, reference_logits(weights, cfg, TOKENS), rtol=0, atol=1e-4)


def test_sharded_checkpoint_with_an_index(tmp_path: Path) -> None:
    cfg = hf_config(tied=False)
    weights = hf_weights(cfg, seed=1)
    root = write_checkpoint(tmp_path, cfg, dict(weights), shards=2)
    assert len(list(root.glob("*.safetensors"))) == 2
    arch, params = load_hf(root)
    ref = reference_logits(weights, cfg, TOKENS)
    np.testing.assert_allclose(pd_logits(arch, params), ref, rtol=0, atol=1e-4)


def test_bf16_checkpoint_loads_in_bf16_or_fp32(tmp_path: Path) -> None:
    cfg = hf_config(tied=False)
    weights = hf_weights(cfg, seed=2)
    bf16 = {k: v.astype(ml_dtypes.bfloat16) for k, v in weights.items()}
    root = write_checkpoint(tmp_path, cfg, dict(bf16))
    rounded = {k: v.astype(np.float32) for k, v in bf16.items()}
    ref = reference_logits(rounded, cfg, TOKENS)

    arch, params32 = load_hf(root, dtype="float32")
    assert all(v.dtype == jnp.float32 for v in params32["~"].values())
    np.testing.assert_allclose(pd_logits(arch, params32), ref, rtol=0, atol=1e-4)

    arch, params16 = load_hf(root)  # an all-BF16 checkpoint stays bf16
    assert all(v.dtype == jnp.bfloat16 for v in params16["~"].values())
    logits16 = pd_logits(arch, params16)
    assert logits16.dtype == np.float32  # computed in bf16, returned as fp32
    assert np.max(np.abs(logits16 - ref)) < 0.05 * np.max(np.abs(ref))


def test_fp32_checkpoint_loads_in_bf16_on_request(tmp_path: Path) -> None:
    cfg = hf_config(tied=True)
    _, params = load_hf(write_checkpoint(tmp_path, cfg, dict(hf_weights(cfg))), dtype="bfloat16")
    assert all(v.dtype == jnp.bfloat16 for v in params["~"].values())
    with pytest.raises(ValueError, match="float16"):
        load_hf(tmp_path, dtype="float16")


def test_optional_config_fields_take_hf_defaults(tmp_path: Path) -> None:
    cfg = hf_config(tied=False)
    for key in ("num_key_value_heads", "rms_norm_eps", "rope_theta", "tie_word_embeddings"):
        del cfg[key]
    weights = hf_weights(cfg)
    arch, params = load_hf(write_checkpoint(tmp_path, cfg, dict(weights)))
    assert (arch.n_kv_heads, arch.rms_eps, arch.rope_base) == (HEADS, 1e-6, 10000.0)
    assert not arch.tie_embeddings
    ref = reference_logits(weights, cfg, TOKENS)  # plain multi-head attention
    np.testing.assert_allclose(pd_logits(arch, params), ref, rtol=0, atol=1e-4)


# --- errors: one sentence naming the file or tensor, the value and what was expected ---


@pytest.fixture
def good(tmp_path: Path) -> Path:
    cfg = hf_config(tied=False)
    return write_checkpoint(tmp_path / "ckpt", cfg, dict(hf_weights(cfg)))


def test_missing_directory_and_config(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError) as e:
        load_hf(tmp_path / "nowhere")
    assert_one_sentence(str(e.value), "nowhere", "config.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError) as e:
        load_hf(tmp_path / "empty")
    assert_one_sentence(str(e.value), "config.json", "does not exist")


def test_unparsable_config(good: Path) -> None:
    (good / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError) as e:
        load_hf(good)
    assert_one_sentence(str(e.value), "config.json", "JSON")


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, ["GPT2LMHeadModel"]),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, ["llama3", "RoPE"]),
        ({"hidden_act": "gelu"}, ["hidden_act", "gelu"]),
        ({"num_attention_heads": 3}, ["n_heads", "3"]),
        ({"hidden_size": "32"}, ["hidden_size", "'32'"]),
    ],
    ids=["architecture", "rope_scaling", "activation", "heads", "type"],
)
def test_unsupported_config(good: Path, change: dict[str, object], names: list[str]) -> None:
    cfg = {**hf_config(tied=False), **change}
    (good / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError) as e:
        load_hf(good)
    assert_one_sentence(str(e.value), "config.json", *names)


def test_missing_tensor(tmp_path: Path) -> None:
    cfg = hf_config(tied=False)
    weights = hf_weights(cfg)
    del weights["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(CheckpointError) as e:
        load_hf(write_checkpoint(tmp_path, cfg, dict(weights)))
    assert_one_sentence(str(e.value), "model.layers.1.mlp.up_proj.weight", "model.safetensors")


def test_wrong_shape(tmp_path: Path) -> None:
    cfg = hf_config(tied=False)
    weights = hf_weights(cfg)
    name = "model.layers.0.self_attn.k_proj.weight"
    weights[name] = np.ascontiguousarray(weights[name].T)  # [in, out] instead of [out, in]
    with pytest.raises(CheckpointError) as e:
        load_hf(write_checkpoint(tmp_path, cfg, dict(weights)))
    assert_one_sentence(str(e.value), name, "[32, 16]", "[16, 32]")


def test_unsupported_dtype(tmp_path: Path) -> None:
    cfg = hf_config(tied=False)
    weights: dict[str, npt.NDArray[np.generic]] = dict(hf_weights(cfg))
    weights["model.norm.weight"] = np.ones(D, dtype=np.int32)
    with pytest.raises(CheckpointError) as e:
        load_hf(write_checkpoint(tmp_path, cfg, weights))
    assert_one_sentence(str(e.value), "model.norm.weight", "I32", "BF16")


def test_no_weights_file(good: Path) -> None:
    (good / "model.safetensors").unlink()
    with pytest.raises(CheckpointError) as e:
        load_hf(good)
    assert_one_sentence(str(e.value), "model.safetensors", "model.safetensors.index.json")


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_truncated_or_corrupt_file(good: Path, damage: str) -> None:
    file = good / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[:-100] if damage == "truncate" else b"\x10" + data[1:50])
    with pytest.raises(CheckpointError) as e:
        load_hf(good)
    assert_one_sentence(str(e.value), "model.safetensors", "safetensors file")


def test_index_pointing_to_a_missing_shard(tmp_path: Path) -> None:
    cfg = hf_config(tied=True)
    root = write_checkpoint(tmp_path, cfg, dict(hf_weights(cfg)), shards=2)
    (root / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError) as e:
        load_hf(root)
    assert_one_sentence(str(e.value), "model.safetensors.index.json", "model-00002-of-00002")


def test_index_placing_a_tensor_in_the_wrong_shard(tmp_path: Path) -> None:
    cfg = hf_config(tied=True)
    root = write_checkpoint(tmp_path, cfg, dict(hf_weights(cfg)), shards=2)
    index = json.loads((root / "model.safetensors.index.json").read_text())
    name = "model.norm.weight"
    shard = index["weight_map"][name]
    other = next(f for f in index["weight_map"].values() if f != shard)
    index["weight_map"][name] = other
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError) as e:
        load_hf(root)
    assert_one_sentence(str(e.value), name, other)
