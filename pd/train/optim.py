"""The optimizers of the components and the CI function (SPEC §8), as optax transformations."""

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike
from jaxtyping import Array, Float

from pd.precision import DTYPES
from pd.train.config import TrainConfig
from pd.train.schedule import Schedule, schedule_value


def clip_global_norm(max_norm: float) -> optax.GradientTransformation:
    """S19: `scale = min(1, max_norm / (‖g‖ + 1e-6))` — torch's epsilon, which
    `optax.clip_by_global_norm` lacks (it matters at a clip of 0.01)."""

    def init(params: optax.Params) -> optax.OptState:
        del params
        return optax.EmptyState()

    def update(
        updates: optax.Updates, state: optax.OptState, params: optax.Params | None = None
    ) -> tuple[optax.Updates, optax.OptState]:
        del params
        scale = jnp.minimum(1.0, max_norm / (optax.tree.norm(updates) + 1e-6))
        return jax.tree.map(lambda g: g * scale, updates), state

    return optax.GradientTransformation(init, update)


def _adamw(lr: Schedule, train: TrainConfig) -> optax.GradientTransformation:
    def learning_rate(count: ArrayLike) -> Float[Array, ""]:
        return schedule_value(lr, train.steps, jnp.asarray(count))

    # weight_decay must be set: optax's default is 1e-4, not 0.
    return optax.adamw(
        learning_rate=learning_rate,
        b1=0.9,
        b2=0.999,
        eps=1e-8,
        weight_decay=0.0,
        mu_dtype=DTYPES[train.moment_dtype],
    )


def component_optimizer(train: TrainConfig) -> optax.GradientTransformation:
    """S19: the global-norm clip (when `grad_clip > 0`), then AdamW (0.9, 0.999, 1e-8), weight
    decay 0."""
    adamw = _adamw(train.lr, train)
    if train.grad_clip > 0:
        return optax.chain(clip_global_norm(train.grad_clip), adamw)
    return adamw


def ci_optimizer(train: TrainConfig) -> optax.GradientTransformation:
    """S20: AdamW with the same betas / eps, weight decay 0, no clip."""
    return _adamw(train.ci_lr, train)
