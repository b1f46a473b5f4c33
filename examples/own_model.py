"""Decompose a haiku model of your own: train a small MLP on a sparse task, decompose its
`hk.Linear` layers through `pd.train.run`, load the run folder, and print which
subcomponents fire for each input feature.

    .venv/bin/python examples/own_model.py [RUN_FOLDER]

The task: 8 sparse features (each present with probability 0.1, uniform in [-1, 1]) in, their
absolute values out, through 16 hidden ReLUs. A decomposition that finds the mechanism gives
each feature its own few subcomponents in each layer.
"""

import dataclasses
import sys
from pathlib import Path

import haiku as hk
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float

import pd
from pd.targets.haiku_model import haiku_target
from pd.train import OwnTarget, RunConfig, run
from pd.train.run import summary_table

N_FEATURES = 8
C = 24  # subcomponents per decomposed layer


def mlp(x: Float[Array, "B 8"]) -> Float[Array, "B 8"]:
    return hk.nets.MLP([16, N_FEATURES], name="mlp")(x)


def sparse_batch(step: int, size: int = 1024) -> Float[Array, "B 8"]:
    """The batch of a step: a pure function of the step, as `run` needs for exact resumes."""
    key = jax.random.fold_in(jax.random.key(2026), step)
    present = jax.random.bernoulli(jax.random.fold_in(key, 0), 0.1, (size, N_FEATURES))
    values = jax.random.uniform(jax.random.fold_in(key, 1), (size, N_FEATURES), minval=-1.0)
    return jnp.where(present, values, 0.0)


def train_mlp(steps: int = 3000) -> hk.Params:
    """The model to decompose, trained the usual haiku + optax way."""
    net = hk.transform(mlp)
    params = net.init(jax.random.key(0), sparse_batch(0))
    optimizer = optax.adam(3e-3)

    def loss(params: hk.Params, x: Float[Array, "B 8"]) -> Float[Array, ""]:
        return jnp.mean((net.apply(params, None, x) - jnp.abs(x)) ** 2)

    @jax.jit
    def step(
        params: hk.Params, opt_state: optax.OptState, x: Float[Array, "B 8"]
    ) -> tuple[hk.Params, optax.OptState, Float[Array, ""]]:
        value, grads = jax.value_and_grad(loss)(params, x)
        updates, opt_state = optimizer.update(grads, opt_state)
        new: hk.Params = optax.apply_updates(params, updates)
        return new, opt_state, value

    opt_state = optimizer.init(params)
    for i in range(steps):
        params, opt_state, value = step(params, opt_state, sparse_batch(10**6 + i))
    print(f"trained the MLP: MSE {float(value):.2e} (predicting 0 gives {0.1 / 3:.2e})")
    return params


def build() -> OwnTarget:
    """The target, as `target = { factory = "examples.own_model:build" }` names it in TOML."""
    params = train_mlp()
    target = haiku_target(mlp, params, sparse_batch(0), {"mlp/~/linear_*": C})
    # `sparse_batch` is jax all through: the run draws its batches inside the step program.
    return OwnTarget(target, params, sparse_batch, jittable=True)


def main(out: Path) -> None:
    own = build()
    base = RunConfig(name="own_model")
    config = dataclasses.replace(base, train=dataclasses.replace(base.train, steps=5000))
    result = run(config, out, overwrite=True, own=own)
    print(summary_table(result.summary))

    d = pd.load(out, own=own)  # a target given in Python is given again; its weights checked
    print(f"\nsubcomponents with CI > 0.5 on one feature at ±0.75 ({result.run_dir}):")
    for sign in (1.0, -1.0):
        ci = d.ci(sign * 0.75 * jnp.eye(N_FEATURES))
        for j in range(N_FEATURES):
            fired = {site: jnp.flatnonzero(ci[site][j] > 0.5).tolist() for site in d.sites}
            cells = "  ".join(f"{site.rsplit('/', 1)[-1]}: {c}" for site, c in fired.items())
            print(f"  feature {j} at {sign * 0.75:+.2f}  {cells}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/own_model"))
