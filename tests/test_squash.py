"""S5/S6: the leaky-hard squashings, forward values and custom gradients at the boundaries."""

import jax
import jax.numpy as jnp
import numpy as np

from pd.ci.squash import ALPHA, lower_leaky_hard, upper_leaky_hard


def _vjp_lower(x: list[float], g: list[float]) -> np.ndarray:
    _, pullback = jax.vjp(lower_leaky_hard, jnp.asarray(x))
    (grad,) = pullback(jnp.asarray(g))
    return np.asarray(grad)


def test_s6_lower_forward_is_clip() -> None:
    x = jnp.asarray([-2.0, 0.0, 0.3, 1.0, 1.7])
    np.testing.assert_allclose(
        np.asarray(lower_leaky_hard(x)), [0.0, 0.0, 0.3, 1.0, 1.0], rtol=1e-6
    )


def test_s6_lower_backward_below_and_at_zero_leaks_only_negative_gradients() -> None:
    # x <= 0 (x = 0 included): α·g where g < 0, else 0.
    grad = _vjp_lower([-1.0, 0.0, -1.0, 0.0], [-2.0, -2.0, 3.0, 3.0])
    np.testing.assert_allclose(grad, [ALPHA * -2.0, ALPHA * -2.0, 0.0, 0.0])


def test_s6_lower_backward_inside_and_at_one_passes_gradient() -> None:
    grad = _vjp_lower([0.5, 1.0, 1e-6], [2.0, -3.0, 4.0])
    np.testing.assert_allclose(grad, [2.0, -3.0, 4.0])


def test_s6_lower_backward_above_one_is_zero() -> None:
    grad = _vjp_lower([1.0001, 5.0], [-2.0, 2.0])
    np.testing.assert_array_equal(grad, [0.0, 0.0])


def test_s6_upper_forward_and_gradient() -> None:
    x = jnp.asarray([-1.0, 0.5, 0.9, 3.0])
    np.testing.assert_allclose(
        np.asarray(upper_leaky_hard(x)), [0.0, 0.5, 0.9, 1.0 + ALPHA * 2.0], rtol=1e-6
    )
    grad = jax.grad(lambda v: jnp.sum(upper_leaky_hard(v)))(x)
    np.testing.assert_allclose(np.asarray(grad), [0.0, 1.0, 1.0, ALPHA])


def test_s6_upper_gradient_is_one_at_both_kinks() -> None:
    # As torch.clamp's in the reference: 1 at x = 0 and x = 1 (jnp.clip would give 0.5).
    x = jnp.asarray([0.0, 1.0, -1e-7, 1.0 + 1e-6])
    grad = jax.grad(lambda v: jnp.sum(upper_leaky_hard(v)))(x)
    np.testing.assert_array_equal(np.asarray(grad)[:3], [1.0, 1.0, 0.0])  # exactly 1, not 0.5
    np.testing.assert_allclose(float(grad[3]), ALPHA, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(upper_leaky_hard(x))[:2], [0.0, 1.0])


def test_s5_one_place_squashes_both() -> None:
    from pd.ci import squash

    logits = (jnp.asarray([[[-0.5, 0.5, 2.0]]]),)
    ci = squash(logits)
    np.testing.assert_allclose(np.asarray(ci.lower[0]), [[[0.0, 0.5, 1.0]]])
    np.testing.assert_allclose(np.asarray(ci.upper[0]), [[[0.0, 0.5, 1.0 + ALPHA]]])
    assert ci.logits[0] is logits[0]
