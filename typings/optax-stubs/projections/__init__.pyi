# Hand-written stub for the part of optax.projections (0.2.8) that pd uses.
from typing import TypeVar

from jax.typing import ArrayLike

_T = TypeVar("_T")

def projection_box(tree: _T, lower: ArrayLike, upper: ArrayLike) -> _T: ...
def projection_hypercube(tree: _T, scale: ArrayLike = 1) -> _T: ...
