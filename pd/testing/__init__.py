"""pd.testing: test a project's code that uses pd (`pip install pd[testing]`).

- Hypothesis strategies (`pd.testing.strategies`): `site_tables()` draws valid `SiteTable`s,
  `mlp_targets()` small haiku MLPs and `tms_targets()` small TMS models as `SmallTarget`s
  (target, frozen parameters, input width and a reference forward without pd), and
  `batches(d_in)` float inputs for them.
- Small targets to build directly (`pd.testing.targets`): `mlp_target`, `tms_target`, and
  `tiny_target()`, a ready `OwnTarget` for `pd.train.run(config, out, own=...)`.
- A pytest plugin (`pd.testing.plugin`) with pd's own test setup: opt in with
  `pytest_plugins = ["pd.testing.plugin"]` in the top conftest.py.

Names are loaded on first use: the plugin is imported through this package, and its jaxtyping
import hook must come before pd's other modules are.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pd.testing.strategies import batches, mlp_targets, site_tables, tms_targets
    from pd.testing.targets import SmallTarget, mlp_target, tiny_target, tms_target

_HOME = {
    "batches": "strategies",
    "mlp_targets": "strategies",
    "site_tables": "strategies",
    "tms_targets": "strategies",
    "SmallTarget": "targets",
    "mlp_target": "targets",
    "tiny_target": "targets",
    "tms_target": "targets",
}


def __getattr__(name: str) -> object:
    if name in _HOME:
        from importlib import import_module

        return getattr(import_module(f"pd.testing.{_HOME[name]}"), name)
    raise AttributeError(f"module 'pd.testing' has no attribute {name!r}")


__all__ = [
    "SmallTarget",
    "batches",
    "mlp_target",
    "mlp_targets",
    "site_tables",
    "tiny_target",
    "tms_target",
    "tms_targets",
]
