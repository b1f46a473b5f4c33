"""pd: parameter decomposition (SPD / VPD) of neural networks in JAX + dm-haiku."""

from pd.api import Decomposition, load

__all__ = ["Decomposition", "load"]
