"""Test setup: CPU only, a private target cache, hypothesis profiles.

pd is imported lazily by the tests themselves: jaxtyping's pytest plugin (enabled in
pyproject's addopts) must install its import hook before pd is first imported.
"""

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("PD_CACHE_DIR", tempfile.mkdtemp(prefix="pd-test-cache-"))

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=10,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=25)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# Four simulated CPU devices for the sharding tests; unsharded computations stay on device 0.
from collections.abc import Callable  # noqa: E402

import jax  # noqa: E402

set_option: Callable[[str, object], None] = jax.config.update  # unannotated upstream
set_option("jax_num_cpu_devices", 4)
