# Stub for the part of optax.tree (optax 0.2.8) that pd uses.
# optax.tree.norm is the non-deprecated replacement for optax.global_norm.

from typing import Any

import jax

def norm(tree: Any, ord: int | str | float | None = None, squared: bool = False) -> jax.Array: ...
