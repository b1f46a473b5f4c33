"""§8: schedules reach their final value at step = steps − 1; warmup is linear from 0."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd.train.schedule import Schedule, schedule_value


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_final_value_at_last_step(kind: str) -> None:
    s = Schedule(2.0, warmup_pct=0.1, final_frac=0.1, kind=kind)  # type: ignore[arg-type]  # a Literal
    assert float(schedule_value(s, 100, 99)) == pytest.approx(0.2, rel=1e-6)
    assert float(schedule_value(s, 100, 10)) == pytest.approx(2.0, rel=1e-6)  # decay starts at 1.0


def test_warmup_is_linear_from_zero() -> None:
    s = Schedule(1.0, warmup_pct=0.2, kind="constant")
    values = [float(schedule_value(s, 50, t)) for t in range(12)]
    np.testing.assert_allclose(values[:10], np.arange(10) / 10, rtol=1e-6)
    assert values[10] == values[11] == 1.0


def test_cosine_midpoint_and_no_warmup_starts_at_start() -> None:
    s = Schedule(1.0, final_frac=0.0, kind="cosine")
    assert float(schedule_value(s, 11, 0)) == 1.0  # warmup_pct 0 never zeroes step 0
    assert float(schedule_value(s, 11, 5)) == pytest.approx(
        0.5 * (1 + math.cos(math.pi / 2)), abs=1e-6
    )


def test_host_and_traced_agree_pointwise() -> None:
    s = Schedule(3e-3, warmup_pct=0.05, final_frac=0.1, kind="cosine")
    traced = jax.jit(lambda t: schedule_value(s, 200, t))
    for t in (0, 3, 10, 57, 150, 199):
        assert float(traced(jnp.int32(t))) == float(schedule_value(s, 200, t))
