"""pd's test setup as a pytest plugin, for pd's own suite and for a project's tests of code that
uses pd. Opt in from the top `conftest.py`:

    pytest_plugins = ["pd.testing.plugin"]

(or `pytest -p pd.testing.plugin`). On import, before any other pd module is loaded, it:

- runs JAX on the CPU (`JAX_PLATFORMS=cpu`, unless set) with 4 simulated devices for sharded code
  (unless `JAX_NUM_CPU_DEVICES` or an `XLA_FLAGS` device count says otherwise); unsharded
  computations stay on device 0;
- turns on pd's runtime shape checks: jaxtyping's import hook with beartype over `pd`, so every
  annotated function of pd checks its arguments' shapes at trace time (nothing is done if a hook
  over `pd` is already installed, e.g. by `--jaxtyping-packages=pd,beartype.beartype`);
- registers the hypothesis profiles `ci` (10 examples, derandomized, no deadline) and `dev`
  (25 examples, no deadline), replacing profiles of those names, and loads `ci` when `$CI` is
  set, else `$HYPOTHESIS_PROFILE` or `dev`; `--hypothesis-profile=NAME` picks another;
- points `PD_CACHE_DIR` (targets pd trains in-process) at a fresh temporary folder, unless set;
  the process that made the folder removes it when the session ends (a folder you set is kept).

Fixtures: `tiny_target`, a small haiku MLP as a `pd.train.kinds.OwnTarget`.
"""

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

if TYPE_CHECKING:
    from pd.train.kinds import OwnTarget

DEVICES = 4
CHECKED = "pd"
TYPECHECKER = "beartype.beartype"
PROFILES = {
    "ci": settings(
        deadline=None,
        max_examples=10,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow],
    ),
    "dev": settings(deadline=None, max_examples=25),
    # `make test-fast`: every property still tried, on a few examples.
    "fast": settings(
        deadline=None,
        max_examples=3,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow],
    ),
}


def use_cpu(devices: int = DEVICES) -> None:
    """JAX on the CPU with `devices` simulated devices, unless the environment says otherwise."""
    platform_given = "JAX_PLATFORMS" in os.environ
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax  # after JAX_PLATFORMS, which jax reads on import

    set_option: Callable[[str, object], None] = jax.config.update  # unannotated upstream
    if not platform_given:  # jax may have been imported (and read the variable) before
        set_option("jax_platforms", "cpu")
    if "JAX_NUM_CPU_DEVICES" in os.environ or "device_count" in os.environ.get("XLA_FLAGS", ""):
        return
    try:
        set_option("jax_num_cpu_devices", devices)
    except RuntimeError as err:
        raise RuntimeError(
            "pd.testing.plugin: JAX already started its backends, expected the plugin to load "
            "before any JAX computation (name it in the top conftest.py's pytest_plugins, or "
            "pass -p pd.testing.plugin)"
        ) from err


def check_shapes(package: str = CHECKED, typechecker: str = TYPECHECKER) -> None:
    """Install jaxtyping's import hook with `typechecker` over `package`, unless one is there.

    The hook instruments modules imported after it, so none of `package`'s modules but this
    plugin's (and the package's own `__init__`) may be loaded yet."""
    if any(_instruments(finder, package) for finder in sys.meta_path):
        return
    own = ("pd.testing", "pd.testing.plugin")
    loaded = sorted(m for m in sys.modules if m.startswith(f"{package}.") and m not in own)
    if loaded:
        raise RuntimeError(
            f"pd.testing.plugin: {', '.join(loaded)} imported before the plugin, expected no pd "
            "module loaded yet (jaxtyping's shape checks apply to modules imported after it): "
            "import pd inside tests and fixtures, not at the top of conftest.py"
        )
    import jaxtyping

    jaxtyping.install_import_hook(package, typechecker)


def _instruments(finder: object, package: str) -> bool:
    """Whether `finder` is a jaxtyping import hook over `package` (duck-typed: its finder's
    `should_instrument`)."""
    should_instrument = getattr(finder, "should_instrument", None)
    return callable(should_instrument) and bool(should_instrument(f"{package}.sites"))


def use_profiles() -> None:
    """Register the `ci`, `dev` and `fast` hypothesis profiles; load `ci` under `$CI`, else
    `$HYPOTHESIS_PROFILE` or `dev`."""
    for name, profile in PROFILES.items():
        settings.register_profile(name, profile)
    settings.load_profile(
        "ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev")
    )


_private_cache = ""  # the folder this process made, if it made one


def use_private_cache() -> None:
    """Targets pd trains in-process go to a fresh temporary folder, unless `PD_CACHE_DIR` is set
    (xdist workers and subprocesses inherit the controller's)."""
    global _private_cache
    if "PD_CACHE_DIR" not in os.environ:
        _private_cache = tempfile.mkdtemp(prefix="pd-test-cache-")
        os.environ["PD_CACHE_DIR"] = _private_cache


def pytest_unconfigure() -> None:
    """Remove the private target cache at the end of the session that made it."""
    if _private_cache:
        shutil.rmtree(_private_cache, ignore_errors=True)


use_cpu()
check_shapes()
use_profiles()
use_private_cache()


@pytest.fixture
def tiny_target() -> "OwnTarget":
    """A small haiku MLP (8 → 16 → 8, both `hk.Linear` decomposed with C 12) as an OwnTarget:
    the target, its frozen parameters and batches of sparse features, a pure function of the
    step (`pd.testing.targets.tiny_target`)."""
    from pd.testing.targets import tiny_target

    return tiny_target()
