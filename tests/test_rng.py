"""§9 R1: pd's written-out draws (`pd.rng`) are JAX's draws bit for bit, so the SPEC's key tree
names the same numbers as before; under jit and under a sweep's vmap over keys too."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd import rng

SHAPES = [(), (7,), (1024, 21), (3, 5, 4)]


@pytest.mark.parametrize("shape", SHAPES)
def test_r1_draws_equal_jax_random_bit_for_bit(shape: tuple[int, ...]) -> None:
    for seed in (0, 1, 2**31 - 1):
        key = jax.random.fold_in(jax.random.key(seed), 5)
        np.testing.assert_array_equal(rng.bits(key, shape), jax.random.bits(key, shape))
        np.testing.assert_array_equal(rng.uniform(key, shape), jax.random.uniform(key, shape))
        np.testing.assert_array_equal(
            rng.uniform(key, shape, minval=-1.0, maxval=1.0),
            jax.random.uniform(key, shape, minval=-1.0, maxval=1.0),
        )
        np.testing.assert_array_equal(
            rng.bernoulli(key, 0.3, shape), jax.random.bernoulli(key, 0.3, shape)
        )


def test_r1_draws_equal_jax_random_under_jit_and_vmap_over_keys() -> None:
    keys = jax.random.split(jax.random.key(3), 4)
    shape = (64, 9)
    ours = jax.jit(jax.vmap(lambda k: rng.uniform(k, shape)))(keys)
    theirs = jax.vmap(lambda k: jax.random.uniform(k, shape))(keys)
    np.testing.assert_array_equal(ours, theirs)
    # Different keys draw different numbers (the keys reach the hash).
    assert not np.array_equal(ours[0], ours[1])


def test_other_prng_implementations_go_to_jax() -> None:
    key = jax.random.key(4, impl="rbg")
    np.testing.assert_array_equal(rng.uniform(key, (16, 3)), jax.random.uniform(key, (16, 3)))


def test_uniform_is_in_the_unit_interval_with_the_expected_mean() -> None:
    u = rng.uniform(jax.random.key(0), (100_000,))
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert abs(float(jnp.mean(u)) - 0.5) < 0.005
