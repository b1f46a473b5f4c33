"""Small decomposable targets for tests: a haiku MLP (through `pd.targets.haiku_model`) and
TMS, each with its frozen parameters and a reference forward written without pd, and
`tiny_target()`, a ready `OwnTarget` for `pd.train.run`."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import haiku as hk
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from pd.targets.base import Target
from pd.targets.configs import TMSConfig
from pd.targets.haiku_model import haiku_target
from pd.train.kinds import OwnTarget

Reference = Callable[[hk.Params, Float[Array, "B d_in"]], Float[Array, "B d_out"]]


@dataclass(frozen=True)
class SmallTarget:
    """A small target for a test: the target, its frozen parameters, its input width, and
    `reference(params, x)`, the same model written without pd (what the target's forward with
    every site frozen, `pd.decompose.FROZEN`, must compute)."""

    target: Target
    params: hk.Params
    d_in: int
    reference: Reference


def mlp_target(d_in: int, widths: Sequence[int], C: Mapping[int, int], seed: int) -> SmallTarget:
    """`hk.nets.MLP(widths)` on `d_in` inputs, parameters drawn from `seed`; its `hk.Linear` `i`
    (`mlp/~/linear_{i}`) is a site with `C[i]` subcomponents for each `i` in `C`."""

    def mlp(x: Float[Array, "B d_in"]) -> Float[Array, "B d_out"]:
        return hk.nets.MLP(list(widths), name="mlp")(x)

    x = jnp.zeros((1, d_in))
    net: hk.Transformed = hk.without_apply_rng(hk.transform(mlp))
    params = net.init(jax.random.key(seed), x)
    target = haiku_target(mlp, params, x, {f"mlp/~/linear_{i}": c for i, c in C.items()})
    return SmallTarget(target, params, d_in, net.apply)


def tms_target(n_features: int, n_hidden: int, n_identity: int, C: int, seed: int) -> SmallTarget:
    """TMS `n_features`-`n_hidden` with `n_identity` hidden identity layers (SPEC §12), its
    parameters an untrained draw from `seed` (`init_train`, tied `linear2 = linear1ᵀ`)."""
    cfg = TMSConfig(n_features=n_features, n_hidden=n_hidden, n_identity=n_identity)
    target = cfg.build(C)
    params = target.expand(target.init_train(jax.random.key(seed)))
    return SmallTarget(target, params, n_features, partial(_tms, n_identity))


def _tms(n_identity: int, params: hk.Params, x: Float[Array, "B n"]) -> Float[Array, "B n"]:
    """`ReLU(x W1 [I…] W2 + b)`, written out."""
    p = params["~"]
    h = x @ p["linear1"]
    for i in range(n_identity):
        h = h @ p[f"hidden_{i}"]
    return jax.nn.relu(h @ p["linear2"] + p["b"])


TINY_FEATURES = 8


def sparse_features(
    step: int | Int[Array, ""], batch: int = 64, n: int = TINY_FEATURES, p: float = 0.1
) -> Float[Array, "B n"]:
    """`batch` examples of `n` features, each present with probability `p` and then uniform in
    [0, 1]: a pure function of `step`, a Python int or a traced one (`OwnTarget.jittable`)."""
    key = jax.random.fold_in(jax.random.key(7), step)
    on = jax.random.bernoulli(jax.random.fold_in(key, 0), p, (batch, n))
    return jnp.where(on, jax.random.uniform(jax.random.fold_in(key, 1), (batch, n)), 0.0)


def tiny_target(C: int = 12, batch: int = 64) -> OwnTarget:
    """A haiku MLP 8 → 16 → 8 with both `hk.Linear` decomposed (`C` each), its parameters drawn
    from seed 0, on batches of `batch` sparse features (`sparse_features`): for
    `pd.train.run(config, out, own=tiny_target())`."""
    small = mlp_target(TINY_FEATURES, (16, TINY_FEATURES), {0: C, 1: C}, seed=0)
    return OwnTarget(small.target, small.params, partial(sparse_features, batch=batch))
