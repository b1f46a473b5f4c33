"""The XLA compile options of pd's step programs, and one program per recipe in a process.

On a CPU, XLA asks LLVM for 256-bit vectors by default. pd's step programs ask for 512: the
toy presets' steps were 3–12 % faster (tiny_llama's about 5 %) with the same steps to float32
rounding (`tests/test_step.py`), on AVX-512 and, with `xla_cpu_max_isa = "AVX2"` (where a
512-bit vector is two 256-bit ones), on AVX2 code too (`docs/performance.md`).

XLA also hands reductions to YNNPACK by default. The per-subcomponent CI networks (`mlp`,
`vector_mlp`) sum `[B, C, hidden]` arrays over the hidden units and, for their weight
gradients, over the batch, and YNNPACK's fused reductions took 3–8× longer there than XLA's own
loops, so programs with those CI functions keep YNNPACK for dots only. Other programs keep the
default, which was faster for them (`tiny_llama`: 71 against 81–86 ms a step;
`docs/performance.md`, `bench/profile_step.py`).

The initializer runs once, so on a CPU it is compiled with LLVM's O1 pipeline instead of the
default O2, which took about half of its compile and which a program run once does not repay:
the same state, made about as fast (`docs/performance.md`, "Start-up").
"""

import inspect
from collections.abc import Callable, Hashable
from functools import lru_cache, wraps
from typing import ParamSpec, TypeVar, cast

import jax
from jax.tree_util import PyTreeDef

from pd.ci import CIFunction

P = ParamSpec("P")
# jax.ShapeDtypeStruct, typed (its constructor is unannotated upstream).
shape_dtype: Callable[..., jax.ShapeDtypeStruct] = jax.ShapeDtypeStruct
R = TypeVar("R")

_WIDE_VECTORS = {"xla_cpu_prefer_vector_width": "512"}
_YNN_DOTS_ONLY = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


def compiler_options(ci_fn: CIFunction) -> dict[str, str]:
    """`jax.jit(..., compiler_options=...)` for a step program with `ci_fn`, on the default
    backend."""
    if jax.default_backend() != "cpu":
        return {}
    return _WIDE_VECTORS | (_YNN_DOTS_ONLY if ci_fn.many_small_dots else {})


def init_options() -> dict[str, str]:
    """`jax.jit(..., compiler_options=...)` for the initializer `init_train_state`."""
    return {"xla_backend_optimization_level": "1"} if jax.default_backend() == "cpu" else {}


def one_per_value(factory: Callable[P, R]) -> Callable[P, R]:
    """`factory`, returning the jitted program it made before for equal arguments, so that a
    run's evaluations and figures, the members of a sweep, and runs of one recipe in a
    process (a resumed run, seeds in a loop) share one compile. Arguments are bound to the
    factory's parameters, defaults filled in (`f(r)` is `f(r, None)`), and compared by their
    pytree leaves: recipes and targets by value, a state's placement leaf by leaf (its parameter
    dicts cannot be hashed). Leaves that cannot be hashed (arrays, a caller's own target) get a
    new program each time."""
    signature = inspect.signature(factory)
    call = cast(Callable[..., R], factory)

    @lru_cache(maxsize=8)
    def made(tree: PyTreeDef, leaves: tuple[Hashable, ...]) -> R:
        args, kwargs = jax.tree.unflatten(tree, leaves)
        return call(*args, **kwargs)

    @wraps(factory)
    def get(*args: P.args, **kwargs: P.kwargs) -> R:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        leaves, tree = jax.tree.flatten((bound.args, bound.kwargs))
        try:
            hash(tuple(leaves))
        except TypeError:
            return factory(*args, **kwargs)
        return made(tree, tuple(cast(list[Hashable], leaves)))

    return get
