# Hand-written stubs for the subset of optax 0.2.8 that pd uses.
# optax ships no py.typed. Checked against the runtime with:
#   python -m mypy.stubtest optax --mypy-config-file mypy.ini --ignore-missing-stub
# Types follow optax's own annotations (optax/_src/base.py), except where noted.

from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple, Protocol, TypeAlias, TypeVar

import jax
from jax.typing import ArrayLike, DTypeLike
from optax import projections as projections
from optax import tree as tree
from typing_extensions import deprecated, disjoint_base

# optax._src.base.ArrayTree (not exported at top level by optax).
_ArrayTree: TypeAlias = ArrayLike | Iterable[_ArrayTree] | Mapping[Any, _ArrayTree]

OptState: TypeAlias = _ArrayTree
Params: TypeAlias = _ArrayTree
Updates: TypeAlias = Params
Schedule: TypeAlias = Callable[[ArrayLike], ArrayLike]
ScalarOrSchedule: TypeAlias = float | jax.Array | Schedule

class TransformInitFn(Protocol):
    def __call__(self, params: Params) -> OptState: ...

class TransformUpdateFn(Protocol):
    def __call__(
        self, updates: Updates, state: OptState, params: Params | None = None
    ) -> tuple[Updates, OptState]: ...

class TransformUpdateExtraArgsFn(Protocol):
    def __call__(
        self,
        updates: Updates,
        state: OptState,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, OptState]: ...

class GradientTransformation(NamedTuple):
    init: TransformInitFn
    update: TransformUpdateFn

# No __slots__ at runtime, so instances carry a __dict__: a disjoint base (PEP 800).
@disjoint_base
class GradientTransformationExtraArgs(GradientTransformation):
    # At runtime this subclass only re-annotates the inherited `update` field
    # (same tuple slot); a read-only property is the sound way to say so here.
    @property
    def update(self) -> TransformUpdateExtraArgsFn: ...

class EmptyState(NamedTuple): ...

class ScaleByAdamState(NamedTuple):
    # The field shadows tuple.count, exactly as at runtime, hence the ignore.
    count: ArrayLike  # type: ignore[assignment]  # scalar int32 jax.Array in practice
    mu: Updates
    nu: Updates

def scale_by_adam(
    b1: ArrayLike = 0.9,
    b2: ArrayLike = 0.999,
    eps: ArrayLike = 1e-8,
    eps_root: ArrayLike = 0.0,
    mu_dtype: DTypeLike | None = None,
    *,
    nesterov: bool = False,
) -> GradientTransformation: ...

# optax annotates mu_dtype here as Optional[Any]; it is forwarded unchanged to
# scale_by_adam, whose annotation (DTypeLike | None) is the real contract.
def adam(
    learning_rate: ScalarOrSchedule,
    b1: ArrayLike = 0.9,
    b2: ArrayLike = 0.999,
    eps: ArrayLike = 1e-8,
    eps_root: ArrayLike = 0.0,
    mu_dtype: DTypeLike | None = None,
    *,
    nesterov: bool = False,
) -> GradientTransformationExtraArgs: ...
def adamw(
    learning_rate: ScalarOrSchedule,
    b1: ArrayLike = 0.9,
    b2: ArrayLike = 0.999,
    eps: ArrayLike = 1e-8,
    eps_root: ArrayLike = 0.0,
    mu_dtype: DTypeLike | None = None,
    weight_decay: ScalarOrSchedule = 1e-4,
    # A pytree of bools matching params, or a callable building one from params.
    mask: Any | Callable[[Params], Any] | None = None,
    *,
    nesterov: bool = False,
) -> GradientTransformationExtraArgs: ...
def cosine_decay_schedule(
    init_value: ArrayLike,
    decay_steps: int,
    alpha: ArrayLike = 0.0,
    exponent: ArrayLike = 1.0,
) -> Schedule: ...
def chain(*args: GradientTransformation) -> GradientTransformationExtraArgs: ...

_ParamsT = TypeVar("_ParamsT", bound=Params)

# optax annotates this Params -> Params; it tree-maps over `params`, so the
# result has the same tree structure and leaf dtypes as `params`. (Leaves come
# back as jax.Array, so this is exact for trees of jax.Array; None leaves stay None.)
def apply_updates(params: _ParamsT, updates: Updates) -> _ParamsT: ...
@deprecated("optax.global_norm is deprecated in favor of optax.tree.norm")
def global_norm(updates: Any) -> jax.Array: ...
