"""GGUF files (llama.cpp's format): metadata → architecture, dequantized tensors in the
layer-stacked layout, q/k rows restored from llama.cpp's rotary permutation, one-sentence
errors. The files are written here with the `gguf` package's own writer, the llama.cpp way
(rows of q/k permuted, some tensors Q8_0), and checked against the float64 Hugging Face
reference forward of `test_hf_loader`."""

import dataclasses
from pathlib import Path

import gguf
import numpy as np
import pytest
from test_hf_loader import (
    D_MLP,
    HEADS,
    KV_HEADS,
    LAYERS,
    TOKENS,
    VOCAB,
    D,
    NDArray,
    assert_one_sentence,
    hf_config,
    hf_weights,
    pd_logits,
    reference_logits,
)

from pd.targets import gguf as gguf_module
from pd.targets.gguf import load_gguf, read_gguf_arch, unpermute_rotary
from pd.targets.hf import CheckpointError
from pd.targets.llama import Llama, LlamaArch
from pd.train import load_config
from pd.train.config import ConfigError
from pd.train.kinds import kind_of
from pd.train.run import make_recipe

_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
Q8 = gguf.GGMLQuantizationType.Q8_0


def llama_cpp_permute(w: NDArray, n_heads: int) -> NDArray:
    """llama.cpp's converter: per head, the two rotary halves interleaved row by row."""
    out: NDArray = (
        w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )
    return out


def write_gguf(
    path: Path, weights: dict[str, NDArray], tied: bool, quantize: tuple[str, ...] = ()
) -> dict[str, NDArray]:
    """Write `weights` (HF names and layout) as llama.cpp would; returns the weights as they
    will read back (Q8_0 tensors rounded), in HF order, for the reference forward."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(LAYERS)
    w.add_embedding_length(D)
    w.add_feed_forward_length(D_MLP)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(5000.0)
    w.add_layer_norm_rms_eps(1e-5)
    read_back = dict(weights)
    for name, value in weights.items():
        if name == "lm_head.weight" and tied:
            continue
        stored = value
        if ".self_attn.q_proj." in name:
            stored = llama_cpp_permute(value, HEADS)
        if ".self_attn.k_proj." in name:
            stored = llama_cpp_permute(value, KV_HEADS)
        short = _gguf_name(name)
        if any(q in name for q in quantize):
            packed = gguf.quants.quantize(stored, Q8)
            w.add_tensor(short, packed, raw_shape=packed.shape, raw_dtype=Q8)
            back = np.asarray(gguf.quants.dequantize(packed, Q8), np.float32)
            heads = HEADS if "q_proj" in name else KV_HEADS
            rotary = "q_proj" in name or "k_proj" in name
            read_back[name] = unpermute_rotary(back, heads) if rotary else back
        else:
            w.add_tensor(short, stored)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return read_back


def _gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    layer, rest = hf.removeprefix("model.layers.").split(".", 1)
    return f"blk.{layer}.{_NAMES[rest.removesuffix('.weight')]}.weight"


def test_unpermute_inverts_llama_cpps_permutation() -> None:
    w = np.arange(4 * 8 * 3, dtype=np.float32).reshape(4 * 8, 3)
    np.testing.assert_array_equal(unpermute_rotary(llama_cpp_permute(w, 4), 4), w)
    assert not np.array_equal(llama_cpp_permute(w, 4), w)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_fp32_gguf_matches_the_hf_reference(tmp_path: Path, tied: bool) -> None:
    cfg = hf_config(tied)
    weights = hf_weights(cfg)
    write_gguf(tmp_path / "m.gguf", weights, tied)
    arch, params = load_gguf(tmp_path / "m.gguf")
    want = LlamaArch(VOCAB, D, LAYERS, HEADS, KV_HEADS, D_MLP, D // HEADS, 5000.0, 1e-5, tied)
    assert arch.rms_eps == pytest.approx(1e-5)  # stored as float32
    assert dataclasses.replace(arch, rms_eps=1e-5) == want
    assert read_gguf_arch(tmp_path / "m.gguf") == arch
    assert params["~"]["q"].shape == (LAYERS, D, D)  # layer-stacked, [d_in, d_out]
    np.testing.assert_allclose(
        pd_logits(arch, params), reference_logits(weights, cfg, TOKENS), rtol=0, atol=1e-4
    )


def test_q8_0_tensors_dequantize_and_rows_are_restored(tmp_path: Path) -> None:
    """Quantized q/k/gate: the logits equal the reference on the dequantized weights; with
    the q/k rows left permuted they would not."""
    cfg = hf_config(False)
    weights = hf_weights(cfg)
    read_back = write_gguf(tmp_path / "q.gguf", weights, False, ("q_proj", "k_proj", "gate"))
    arch, params = load_gguf(tmp_path / "q.gguf")
    ref = reference_logits(read_back, cfg, TOKENS)
    np.testing.assert_allclose(pd_logits(arch, params), ref, rtol=0, atol=1e-4)
    assert np.abs(reference_logits(weights, cfg, TOKENS) - ref).max() > 1e-4  # Q8_0 rounds
    scrambled = dict(read_back)
    for i in range(LAYERS):
        name = f"model.layers.{i}.self_attn.q_proj.weight"
        scrambled[name] = llama_cpp_permute(read_back[name], HEADS)
    assert np.abs(reference_logits(scrambled, cfg, TOKENS) - ref).max() > 1e-2


def test_an_unchanged_file_is_parsed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = hf_config(False)
    path = tmp_path / "m.gguf"
    write_gguf(path, hf_weights(cfg), False)
    reads: list[Path] = []
    real = gguf.GGUFReader

    def counted(p: Path) -> gguf.GGUFReader:
        reads.append(p)
        return real(p)

    monkeypatch.setattr(gguf_module, "GGUFReader", counted)
    first = read_gguf_arch(path)
    assert read_gguf_arch(str(path)) == first and len(reads) == 1
    write_gguf(path, hf_weights(cfg), True)  # a changed file (tied head) is read again
    assert read_gguf_arch(path).tie_embeddings and len(reads) == 2


def test_gguf_errors_are_one_sentence(tmp_path: Path) -> None:
    cfg = hf_config(False)
    weights = hf_weights(cfg)
    good = tmp_path / "m.gguf"
    write_gguf(good, weights, False)
    with pytest.raises(CheckpointError) as e:
        load_gguf(tmp_path / "absent.gguf")
    assert_one_sentence(str(e.value), "absent.gguf", "does not exist")
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError) as e:
        load_gguf(truncated)
    assert_one_sentence(str(e.value), "cut.gguf")
    missing = dict(weights)
    del missing["model.layers.1.mlp.up_proj.weight"]
    write_gguf(tmp_path / "missing.gguf", missing, False)
    with pytest.raises(CheckpointError) as e:
        load_gguf(tmp_path / "missing.gguf")
    assert_one_sentence(str(e.value), "blk.1.ffn_up.weight", "missing.gguf")
    other = gguf.GGUFWriter(tmp_path / "gpt2.gguf", "gpt2")
    other.add_tensor("token_embd.weight", np.zeros((VOCAB, D), np.float32))
    other.write_header_to_file()
    other.write_kv_data_to_file()
    other.write_tensors_to_file()
    other.close()
    with pytest.raises(CheckpointError) as e:
        load_gguf(tmp_path / "gpt2.gguf")
    assert_one_sentence(str(e.value), "gpt2.gguf", "'gpt2'", "'llama'")


def test_a_run_config_takes_a_gguf_checkpoint(tmp_path: Path) -> None:
    cfg = hf_config(True)
    weights = hf_weights(cfg)
    write_gguf(tmp_path / "m.gguf", weights, True)
    config = load_config("tiny_llama", [f'target.checkpoint="{tmp_path / "m.gguf"}"'])
    recipe = make_recipe(config)
    assert isinstance(recipe.target, Llama)
    assert recipe.target.arch == read_gguf_arch(tmp_path / "m.gguf")
    assert len(recipe.table.sites) == 7 * LAYERS
    frozen = kind_of(config.target).load_frozen(recipe.target).params
    _, params = load_gguf(tmp_path / "m.gguf")
    for name, value in params["~"].items():
        np.testing.assert_array_equal(np.asarray(frozen["~"][name]), np.asarray(value))
    with pytest.raises(ConfigError, match=r"absent\.gguf"):
        make_recipe(load_config("tiny_llama", [f'target.checkpoint="{tmp_path / "absent.gguf"}"']))
