"""pd: parameter decomposition (SPD / VPD) of neural networks in JAX + dm-haiku.

`import pd` is cheap: `pd.load` and `pd.Decomposition` import the training stack (targets,
losses, the step) on first use.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pd.api import Decomposition, load


def __getattr__(name: str) -> object:
    if name in __all__:
        from pd import api

        return getattr(api, name)
    raise AttributeError(f"module 'pd' has no attribute {name!r}")


__all__ = ["Decomposition", "load"]
