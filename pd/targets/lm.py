"""Language-model targets from config: the Llama model, its frozen weights (a local Hugging Face
checkpoint, or trained in-process and cached) and its token data."""

import dataclasses
import logging
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import haiku as hk
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, Key

from pd.data import DataError, TokenSource, load_tokens, local_file, synthetic_corpus
from pd.decompose import FROZEN
from pd.targets.configs import LLAMA_KINDS, KindC, LlamaConfig
from pd.targets.gguf import is_gguf, load_gguf, read_gguf_arch
from pd.targets.hf import CONFIG, load_hf, read_config
from pd.targets.llama import Llama, LlamaArch

if TYPE_CHECKING:
    from tokenizers import Tokenizer
from pd.targets.train import (
    TrainedTarget,
    _cache_key,
    _load,
    _save,
    cache_dir,
    fit,
    train_with_retries,
)
from pd.validate import ConfigError

log = logging.getLogger(__name__)

# The synthetic corpus's process; its entropy rate is the best achievable next-token loss.
CORPUS_SEED = 0
# A trained model passes when its loss is within this many nats of the corpus entropy rate
# (the first positions of a window cannot see the context the next token depends on).
ENTROPY_SLACK = 0.1


def checkpoint_path(cfg: LlamaConfig) -> Path:
    return local_file(cfg.checkpoint, "target.checkpoint")


# The config's sizes of a model pd trains (the architecture's fields it has); a checkpoint has
# its own.
_ARCH_KEYS = tuple(
    f.name
    for f in dataclasses.fields(LlamaArch)
    if f.name in {g.name for g in dataclasses.fields(LlamaConfig)}
)


def llama_arch(cfg: LlamaConfig) -> LlamaArch:
    """The checkpoint's architecture, or the configured sizes for an in-process model."""
    if cfg.checkpoint:
        path = checkpoint_path(cfg)
        arch = read_gguf_arch(path) if is_gguf(cfg.checkpoint) else read_config(path / CONFIG)
        _check_sizes(cfg, arch)
        return arch
    return LlamaArch(
        cfg.vocab,
        cfg.d_model,
        cfg.n_layers,
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.d_mlp,
        rope_base=cfg.rope_base,
        rms_eps=cfg.rms_eps,
        tie_embeddings=cfg.tie_embeddings,
    )


def _check_sizes(cfg: LlamaConfig, arch: LlamaArch) -> None:
    """A size set in the config beside a checkpoint (not left at its default) must be the
    checkpoint's own: the file decides, so another value would be silently ignored."""
    defaults = {f.name: f.default for f in dataclasses.fields(LlamaConfig)}
    for key in _ARCH_KEYS:
        value, own = getattr(cfg, key), getattr(arch, key)
        if value != defaults[key] and value != own:
            raise ConfigError(
                f"config key 'target.{key}' is {value!r}, but the checkpoint {cfg.checkpoint!r} "
                f"has {own!r}: a checkpoint's sizes come from its file (leave the key out)"
            )


def build_llama(cfg: LlamaConfig, C: int) -> Llama:
    """The model of a config, decomposing `kinds` in `layers` (all if empty)."""
    arch = llama_arch(cfg)
    kind_C = dataclasses.asdict(cfg.kind_C)
    layers = cfg.layers or tuple(range(arch.n_layers))
    for k in cfg.kinds:
        if k not in LLAMA_KINDS:
            raise ValueError(
                f"config key 'target.kinds' holds {k!r}, expected one of {LLAMA_KINDS}"
            )
    return Llama(arch, tuple((k, kind_C[k] or C) for k in cfg.kinds), layers, cfg.remat)


@cache
def _corpus(vocab: int, n_tokens: int) -> tuple[TokenSource, float]:
    return synthetic_corpus(CORPUS_SEED, vocab, n_tokens)


@cache
def _tokenizer(cfg: LlamaConfig) -> tuple["Tokenizer", int]:
    from pd.text import gguf_tokenizer

    return gguf_tokenizer(checkpoint_path(cfg))


@cache  # tokenized once per config (seconds for a few MB)
def text_sources(cfg: LlamaConfig) -> tuple[TokenSource, TokenSource]:
    """`(train, held-out)` tokens of the config's text, read with the checkpoint's tokenizer."""
    if not is_gguf(cfg.checkpoint):
        raise DataError(
            f"config key 'target.text' is {cfg.text!r}, which needs a .gguf checkpoint (its "
            f"tokenizer), but 'target.checkpoint' is {cfg.checkpoint!r}"
        )
    from pd.text import tokenize_files  # the tokenizer library only for text

    tokenizer, eos = _tokenizer(cfg)
    files = [local_file(cfg.text, "target.text")]
    train, held_out = tokenize_files(tokenizer, eos, files, cfg.held_out, cfg.text_separator)
    return TokenSource(train, f"{cfg.text} (train)"), TokenSource(
        held_out, f"{cfg.text} (held out)"
    )


@cache  # the vocab check is one pass over the file: once per config
def token_source(cfg: LlamaConfig, held_out: bool = False) -> TokenSource:
    """The tokens of the config: its text (the held-out part with `held_out`), its token file,
    or the built-in synthetic corpus; ids checked against the vocab."""
    if cfg.text:
        source = text_sources(cfg)[held_out]
    elif cfg.tokens:
        source = load_tokens(local_file(cfg.tokens, "target.tokens"))
    else:
        source, _ = _corpus(cfg.vocab, cfg.corpus_tokens)
    source.check_vocab(llama_arch(cfg).vocab)
    return source


def token_ids(cfg: LlamaConfig, text: str) -> list[int]:
    """The token ids of `text` by the checkpoint's tokenizer (a `text` config), as the text
    file's documents are tokenized."""
    tokenizer, _ = _tokenizer(cfg)
    return list(tokenizer.encode(text).ids)


def token_labels(cfg: LlamaConfig, ids: list[int]) -> list[str]:
    """The text of each token of a `text` config, for figures."""
    tokenizer, _ = _tokenizer(cfg)
    return [tokenizer.decode([i]) for i in ids]


def next_token_loss(
    model: Llama, params: hk.Params, windows: Int[Array, "B Tp1"]
) -> Float[Array, ""]:
    """Mean cross-entropy of each window's tokens 1.. given the tokens before them."""
    logits = model.forward(params, windows[:, :-1], FROZEN)
    log_q = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(log_q, windows[:, 1:, None], axis=-1))


def train_lm(model: Llama, cfg: LlamaConfig) -> TrainedTarget:
    """Train on random windows of the config's tokens until the loss is within ENTROPY_SLACK of
    the synthetic corpus's entropy rate (a token file has no known entropy: its model is
    accepted as is)."""
    source = token_source(cfg)
    tokens = jnp.asarray(source.tokens, jnp.int32)
    bound = None if cfg.tokens else _corpus(cfg.vocab, cfg.corpus_tokens)[1] + ENTROPY_SLACK
    width, batch = cfg.seq_len + 1, cfg.training.batch

    def loss(params: hk.Params, tokens: Int[Array, " n"], key: Key[Array, ""]) -> Float[Array, ""]:
        starts = jax.random.randint(key, (batch,), 0, tokens.shape[0] - width + 1)
        windows = jax.vmap(lambda s: jax.lax.dynamic_slice(tokens, (s,), (width,)))(starts)
        return next_token_loss(model, params, windows)

    def check(params: hk.Params, value: float) -> str | None:
        if bound is None or value < bound:
            return None
        return f"loss {value:.4f} is not below {bound:.4f} (entropy rate + {ENTROPY_SLACK})"

    def attempt(key: Key[Array, ""]) -> tuple[hk.Params, float]:
        return fit(model.init, loss, tokens, cfg.training, key)

    return train_with_retries(attempt, check, cfg.max_attempts, cfg.seed)


def training_files(cfg: LlamaConfig) -> tuple[Path, ...]:
    """The files an in-process model is trained from: its token file, checked as `load_tokens`
    checks it (named in an error before it is hashed). `text` needs a checkpoint, so a trained
    model never reads a text file; the synthetic corpus is a function of the config."""
    if cfg.checkpoint or cfg.text or not cfg.tokens:
        return ()
    path = local_file(cfg.tokens, "target.tokens")
    load_tokens(path)  # a memory map and a header check: cheap
    return (path,)


def load_llama(cfg: LlamaConfig, target: Llama) -> TrainedTarget:
    """The frozen weights from the local checkpoint, else trained in-process on the config's
    tokens and cached by the hash of the config and the token file's contents."""
    if cfg.checkpoint:
        load = load_gguf if is_gguf(cfg.checkpoint) else load_hf
        _, params = load(checkpoint_path(cfg))
        return TrainedTarget.of(params, f"loaded from {cfg.checkpoint}")
    # Which sites are decomposed (and how the step checkpoints) does not change the model: leave
    # them out of the cache key. What the model is trained on does: the key holds the token
    # file's contents, not only its path.
    model_only = dataclasses.replace(cfg, kinds=(), layers=(), kind_C=KindC(), remat="dots")
    path = cache_dir() / "targets" / _cache_key(model_only, training_files(cfg))
    cached = _load(path)
    if cached is not None:
        return cached
    trained = train_lm(target, cfg)
    _save(path, trained, model_only)
    return trained
