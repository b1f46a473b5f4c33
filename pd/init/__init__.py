"""Pure `key → pytree` initializers producing the stacked layout (SPEC §9, §10)."""

from functools import partial

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Key

from pd.ci import CIFunction, GroupParams
from pd.sites import SiteTable
from pd.state import Components


def scaled_normal(key: Key[Array, ""], shape: tuple[int, int]) -> Float[Array, "a b"]:
    """One site's draw: `N(0, 1)[shape] / sqrt(shape[0])` (V: / sqrt(d_in), U: / sqrt(C))."""
    return jax.random.normal(key, shape) / jnp.sqrt(jnp.float32(shape[0]))


def init_vu(init_key: Key[Array, ""], table: SiteTable) -> Components:
    """V ~ N(0,1)/sqrt(d_in), U ~ N(0,1)/sqrt(C); site i draws V from keys[2i], U from keys[2i+1].

    One RNG body per shape group (I2), with `keys = split(init_key, 2 · n_sites)`: a `lax.map`
    over the group's keys, so no single draw spans more than one site (a vmapped draw over a
    whole Llama-8B group exceeds 2³¹ elements, and its compile time then grows with the group).
    """
    keys = jax.random.split(init_key, 2 * len(table.sites))
    V, U = [], []
    for g, grp in enumerate(table.groups):
        idx = jnp.asarray(table.group_indices(g))
        V.append(jax.lax.map(partial(scaled_normal, shape=(grp.d_in, grp.C)), keys[2 * idx]))
        U.append(jax.lax.map(partial(scaled_normal, shape=(grp.C, grp.d_out)), keys[2 * idx + 1]))
    return Components(tuple(V), tuple(U))


def init_ci_fn(init_key: Key[Array, ""], ci_fn: CIFunction) -> GroupParams:
    """CI-function parameters from `ci_key = fold_in(init_key, 1)`."""
    return ci_fn.init(jax.random.fold_in(init_key, 1))


def key_tree(seed: int) -> tuple[Key[Array, ""], Key[Array, ""], Key[Array, ""]]:
    """`(init_key, src_key, run_key) = split(key(seed), 3)` — the root of SPEC §9."""
    init_key, src_key, run_key = jax.random.split(jax.random.key(seed), 3)
    return init_key, src_key, run_key
