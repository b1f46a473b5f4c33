"""Language-model targets from config: the Llama model, its frozen weights (a local Hugging Face
checkpoint, or trained in-process and cached) and its token data."""

import dataclasses
import logging
from functools import cache
from pathlib import Path

import haiku as hk
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float, Int, Key

from pd.data import TokenSource, load_tokens, synthetic_corpus
from pd.decompose import FROZEN
from pd.targets.base import Target, as_toy
from pd.targets.configs import LLAMA_KINDS, KindC, LlamaConfig, TargetConfig
from pd.targets.hf import CONFIG, load_hf, read_config
from pd.targets.llama import Llama, LlamaArch
from pd.targets.train import TrainedTarget, _cache_key, _load, _save, cache_dir, load_or_train

log = logging.getLogger(__name__)

# The synthetic corpus's process; its entropy rate is the best achievable next-token loss.
CORPUS_SEED = 0
# A trained model passes when its loss is within this many nats of the corpus entropy rate
# (the first positions of a window cannot see the context the next token depends on).
ENTROPY_SLACK = 0.1


def llama_arch(cfg: LlamaConfig) -> LlamaArch:
    """The checkpoint's architecture, or the configured sizes for an in-process model."""
    if cfg.checkpoint:
        return read_config(Path(cfg.checkpoint) / CONFIG)
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


def build_target(cfg: TargetConfig, C: int) -> Target:
    """The target of a config; a language model decomposes `kinds` in `layers` (all if empty)."""
    if not isinstance(cfg, LlamaConfig):
        return cfg.build(C)
    arch = llama_arch(cfg)
    kind_C = dataclasses.asdict(cfg.kind_C)
    layers = cfg.layers or tuple(range(arch.n_layers))
    for k in cfg.kinds:
        if k not in LLAMA_KINDS:
            raise ValueError(
                f"config key 'target.kinds' holds {k!r}, expected one of {LLAMA_KINDS}"
            )
    return Llama(arch, tuple((k, kind_C[k] or C) for k in cfg.kinds), layers)


@cache
def _corpus(vocab: int, n_tokens: int) -> tuple[TokenSource, float]:
    return synthetic_corpus(CORPUS_SEED, vocab, n_tokens)


@cache  # the vocab check is one pass over the file: once per config
def token_source(cfg: LlamaConfig) -> TokenSource:
    """The token file of the config, or the built-in synthetic corpus; ids checked against vocab."""
    if cfg.tokens:
        source = load_tokens(cfg.tokens)
    else:
        source, _ = _corpus(cfg.vocab, cfg.corpus_tokens)
    source.check_vocab(llama_arch(cfg).vocab)
    return source


def next_token_loss(
    model: Llama, params: hk.Params, windows: Int[Array, "B Tp1"]
) -> Float[Array, ""]:
    """Mean cross-entropy of each window's tokens 1.. given the tokens before them."""
    logits = model.forward(params, windows[:, :-1], FROZEN)
    log_q = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(log_q, windows[:, 1:, None], axis=-1))


def _fit_lm(
    model: Llama, cfg: LlamaConfig, tokens: Int[Array, " n"], key: Key[Array, ""]
) -> tuple[hk.Params, float]:
    """AdamW (wd 0) on next-token loss over random windows of the corpus, in one `lax.scan`."""
    t = cfg.training
    lr: optax.ScalarOrSchedule = optax.cosine_decay_schedule(t.lr, t.steps) if t.cosine else t.lr
    tx = optax.adamw(learning_rate=lr, weight_decay=0.0)
    width = cfg.seq_len + 1

    def fit(tokens: Int[Array, " n"], key: Key[Array, ""]) -> tuple[hk.Params, Float[Array, ""]]:
        params = model.init(jax.random.fold_in(key, 0))

        def body(
            carry: tuple[hk.Params, optax.OptState], step: Array
        ) -> tuple[tuple[hk.Params, optax.OptState], Float[Array, ""]]:
            params, opt = carry
            starts = jax.random.randint(
                jax.random.fold_in(key, step + 1), (t.batch,), 0, tokens.shape[0] - width + 1
            )
            windows = jax.vmap(lambda s: jax.lax.dynamic_slice(tokens, (s,), (width,)))(starts)
            loss, grads = jax.value_and_grad(lambda p: next_token_loss(model, p, windows))(params)
            updates, opt = tx.update(grads, opt, params)
            return (optax.apply_updates(params, updates), opt), loss

        (params, _), losses = jax.lax.scan(body, (params, tx.init(params)), jnp.arange(t.steps))
        return params, jnp.mean(losses[-max(1, t.steps // 10) :])

    params, loss = jax.jit(fit)(tokens, key)
    return params, float(loss)


def train_lm(model: Llama, cfg: LlamaConfig) -> TrainedTarget:
    """Train on the config's tokens until the loss is within ENTROPY_SLACK of the synthetic
    corpus's entropy rate (a token file has no known entropy: its model is accepted as is)."""
    source = token_source(cfg)
    tokens = jnp.asarray(source.tokens, jnp.int32)
    bound = None if cfg.tokens else _corpus(cfg.vocab, cfg.corpus_tokens)[1] + ENTROPY_SLACK
    root = jax.random.key(cfg.seed)
    for attempt in range(cfg.max_attempts):
        params, loss = _fit_lm(model, cfg, tokens, jax.random.fold_in(root, attempt))
        if bound is None or loss < bound:
            log.info("language model trained on attempt %d (loss %.4f)", attempt, loss)
            return TrainedTarget(params, attempt, loss, from_cache=False)
        log.info("attempt %d: loss %.4f is not below %.4f", attempt, loss, bound)
    raise RuntimeError(
        f"the language model did not reach loss {bound:.4f} (entropy rate + {ENTROPY_SLACK}) "
        f"in {cfg.max_attempts} attempts; raise target.train_steps"
    )


def load_frozen(cfg: TargetConfig, target: Target) -> TrainedTarget:
    """The frozen weights: toys trained (or cached) in-process; a language model from its local
    checkpoint, else trained in-process on its tokens and cached by the config's hash."""
    if not isinstance(cfg, LlamaConfig):
        return load_or_train(cfg, as_toy(target))
    assert isinstance(target, Llama)
    if cfg.checkpoint:
        _, params = load_hf(cfg.checkpoint)
        return TrainedTarget(params, 0, float("nan"), from_cache=True)
    # Which sites are decomposed does not change the model: leave them out of the cache key.
    model_only = dataclasses.replace(cfg, kinds=(), layers=(), kind_C=KindC())
    path = cache_dir() / "targets" / _cache_key(model_only)
    cached = _load(path)
    if cached is not None:
        return cached
    trained = train_lm(target, cfg)
    _save(path, trained, model_only)
    return trained
