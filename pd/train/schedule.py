"""Schedules `{start, warmup_pct, final_frac, kind}` with one evaluator for host and step (§8)."""

import math
from dataclasses import dataclass
from typing import Literal

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from pd.validate import Validated


@dataclass(frozen=True)
class Schedule(Validated):
    """Linear warmup from 0, then `constant`, `linear` or `cosine` decay to `start·final_frac`."""

    FRACTIONS = frozenset({"warmup_pct", "final_frac"})

    start: float  # the value after the warmup, where the decay starts
    # Fraction of train.steps over which the value rises linearly from 0 to `start`.
    warmup_pct: float = 0.0
    final_frac: float = 1.0  # the last step's value as a fraction of `start` (linear, cosine)
    # The decay after the warmup: "constant", "linear" or "cosine" (to start·final_frac).
    kind: Literal["constant", "linear", "cosine"] = "constant"


def schedule_value(s: Schedule, steps: int, step: int | Int[Array, ""]) -> Float[Array, ""]:
    """The value at `step`; the final value is reached at `step = steps − 1` (not `steps`)."""
    t = jnp.asarray(step, jnp.float32)
    warmup = int(steps * s.warmup_pct)
    decay_steps = steps - warmup
    progress = jnp.clip((t - warmup) / max(decay_steps - 1, 1), 0.0, 1.0)
    if s.kind == "constant":
        frac = jnp.ones_like(progress)
    elif s.kind == "linear":
        frac = 1.0 - (1.0 - s.final_frac) * progress
    else:
        frac = s.final_frac + (1.0 - s.final_frac) * 0.5 * (1.0 + jnp.cos(math.pi * progress))
    if warmup > 0:
        frac = jnp.where(t < warmup, t / warmup, frac)
    value: Float[Array, ""] = jnp.asarray(s.start, jnp.float32) * frac
    return value
