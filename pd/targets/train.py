"""Train a toy target in-process, check that it learned its task, and cache it on disk.

The cache (`$PD_CACHE_DIR/targets`) holds one file per entry, `KEY.npz`: the parameters and
their metadata followed by a sha256 of both, renamed into place whole, so that runs sharing a
cache may write and read one entry at once. KEY hashes the config and the contents of the files
the target is trained from."""

import dataclasses
import hashlib
import io
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Float, Key, PyTree

from pd.decompose import FROZEN
from pd.files import file_sha256, write_atomic
from pd.targets.base import ToyTarget, TrainParams
from pd.targets.configs import PdTrainedConfig, TargetTraining

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainedTarget:
    """Frozen parameters plus how they were obtained."""

    params: hk.Params
    attempt: int  # which derived seed was kept: key = fold_in(key(seed), attempt)
    loss: float
    from_cache: bool
    given: str = ""  # where parameters pd did not train came from; "" when pd trained them

    @classmethod
    def of(cls, params: hk.Params, given: str) -> "TrainedTarget":
        """Parameters pd did not train (a checkpoint file, the caller's own)."""
        return cls(params, 0, float("nan"), from_cache=False, given=given)

    def describe(self) -> str:
        if self.given:
            return self.given
        return f"attempt {self.attempt}, loss {self.loss:.3g}, cached {self.from_cache}"


# A target's parameters: haiku's, or a toy's trainable ones.
P = TypeVar("P", hk.Params, TrainParams)
D = TypeVar("D")


def fit(
    init: Callable[[Key[Array, ""]], P],
    loss: Callable[[P, D, Key[Array, ""]], Float[Array, ""]],
    data: D,
    training: TargetTraining,
    key: Key[Array, ""],
) -> tuple[P, float]:
    """AdamW (wd 0) on `loss(params, data, key of the step)` in one jitted `lax.scan`; the
    trained parameters and the mean loss of the last tenth of the steps. `data` is a traced
    argument (a token corpus is not baked into the program)."""
    steps = training.steps
    lr: optax.ScalarOrSchedule = (
        optax.cosine_decay_schedule(training.lr, steps) if training.cosine else training.lr
    )
    tx = optax.adamw(learning_rate=lr, weight_decay=0.0)

    def run(data: D, key: Key[Array, ""]) -> tuple[P, Float[Array, ""]]:
        params = init(jax.random.fold_in(key, 0))

        def body(
            carry: tuple[P, optax.OptState], step: Array
        ) -> tuple[tuple[P, optax.OptState], Float[Array, ""]]:
            params, opt = carry
            value, grads = jax.value_and_grad(loss)(params, data, jax.random.fold_in(key, step + 1))
            updates, opt = tx.update(grads, opt, params)
            return (optax.apply_updates(params, updates), opt), value

        (params, _), losses = jax.lax.scan(body, (params, tx.init(params)), jnp.arange(steps))
        return params, jnp.mean(losses[-max(1, steps // 10) :])

    params, value = jax.jit(run)(data, key)
    return params, float(value)


def train_with_retries(
    attempt: Callable[[Key[Array, ""]], tuple[hk.Params, float]],
    check: Callable[[hk.Params, float], str | None],
    max_attempts: int,
    seed: int,
) -> TrainedTarget:
    """Train from `fold_in(key(seed), a)` for a = 0, 1, … until `check` accepts the model."""
    root = jax.random.key(seed)
    reasons = []
    for a in range(max_attempts):
        params, loss = attempt(jax.random.fold_in(root, a))
        reason = check(params, loss)
        if reason is None:
            log.info("target learned its task on attempt %d (loss %.4g)", a, loss)
            return TrainedTarget(params, a, loss, from_cache=False)
        log.info("target attempt %d rejected: %s", a, reason)
        reasons.append(f"attempt {a}: {reason}")
    raise RuntimeError(
        f"target did not learn its task in {max_attempts} attempts ({'; '.join(reasons)})"
    )


def train_target(target: ToyTarget, training: TargetTraining, seed: int) -> TrainedTarget:
    """A toy target trained on its own data (MSE to its label) until `target.check` passes."""

    def loss(trainable: TrainParams, data: None, key: Key[Array, ""]) -> Float[Array, ""]:
        x = target.sample(key, training.batch)
        y = target.forward(target.expand(trainable), x, FROZEN)
        return jnp.mean((y - target.label(x)) ** 2)

    def attempt(key: Key[Array, ""]) -> tuple[hk.Params, float]:
        trainable, value = fit(target.init_train, loss, None, training, key)
        return target.expand(trainable), value

    return train_with_retries(attempt, target.check, training.max_attempts, seed)


def trained_shapes(target: ToyTarget) -> PyTree[jax.ShapeDtypeStruct]:
    """The shapes and dtypes of the parameters `train_target` (or the cache) gives, without
    training: what a run compiles its step for while the target trains."""
    return jax.eval_shape(lambda key: target.expand(target.init_train(key)), jax.random.key(0))


def cache_dir() -> Path:
    """`$PD_CACHE_DIR`, else `~/.cache/pd`."""
    return Path(os.environ.get("PD_CACHE_DIR", Path.home() / ".cache" / "pd"))


# Bumped when a target's parameter layout or the entry's format changes (2: layer-stacked
# weights; 3: one file per entry, the data files' digests in the key), so that no cache entry of
# an older one is read.
LAYOUT = 3
META = "__meta__"  # the entry's metadata: a uint8 array of JSON, beside the parameters
SHA256_BYTES = 32  # an entry ends with the sha256 of the bytes before it


def _cache_key(cfg: PdTrainedConfig, data: Sequence[Path] = ()) -> str:
    """The hash of the config and of the contents of the `data` files the target is trained
    from (a token file rewritten in place is a new target)."""
    fields: dict[str, object] = {"layout": LAYOUT, **dataclasses.asdict(cfg)}
    if data:
        fields["data_sha256"] = [file_sha256(p) for p in data]
    blob = json.dumps(fields, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _save(path: Path, trained: TrainedTarget, cfg: PdTrainedConfig) -> None:
    """`path.npz`: the parameters and their metadata (attempt, loss, config) in one `.npz`,
    followed by the sha256 of those bytes, written to a unique temporary name and renamed into
    place. An entry being one file renamed whole, concurrent writers and readers of one entry
    never mix two saves or see part of one. A cache that cannot be written is logged, and the
    target is used uncached."""
    arrays: dict[str, np.ndarray] = {k: np.asarray(v) for k, v in trained.params["~"].items()}
    meta = {"attempt": trained.attempt, "loss": trained.loss, "config": dataclasses.asdict(cfg)}
    buf = io.BytesIO()
    meta_bytes = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    np.savez(buf, allow_pickle=False, **arrays, **{META: meta_bytes})
    body = buf.getvalue()
    npz = path.with_suffix(".npz")
    try:
        npz.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(npz, body + hashlib.sha256(body).digest())
    except OSError as err:
        log.warning("target cache %s could not be written (%s); the target is not cached", npz, err)


def _load(path: Path) -> TrainedTarget | None:
    """The cached target, or None when absent or corrupt (a corrupt cache is never trusted)."""
    npz = path.with_suffix(".npz")
    try:
        data = npz.read_bytes()  # at once: a rename during the read does not change what is read
    except FileNotFoundError:
        return None
    except OSError as err:
        log.warning("target cache %s is unreadable (%s); retraining", npz, err)
        return None
    try:
        body, digest = data[:-SHA256_BYTES], data[-SHA256_BYTES:]
        if len(data) <= SHA256_BYTES or hashlib.sha256(body).digest() != digest:
            raise ValueError("checksum mismatch")
        with np.load(io.BytesIO(body), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(arrays.pop(META).tobytes())
        attempt, loss = int(meta["attempt"]), float(meta["loss"])
    except Exception as err:  # whatever fails to parse (zip, npy, JSON) is corruption
        log.warning("target cache %s is corrupt (%s); retraining", npz, err)
        return None
    params = {"~": {k: jnp.asarray(v) for k, v in arrays.items()}}
    return TrainedTarget(params, attempt, loss, from_cache=True)


def load_or_train(cfg: PdTrainedConfig, target: ToyTarget) -> TrainedTarget:
    """The trained target for `cfg`, from the cache when a valid entry exists."""
    path = cache_dir() / "targets" / _cache_key(cfg)
    cached = _load(path)
    if cached is not None and target.check(cached.params, cached.loss) is None:
        return cached
    trained = train_target(target, cfg.training, cfg.seed)
    _save(path, trained, cfg)
    return trained
