"""Any haiku model as a Target: its `hk.Linear` modules (and any module whose call computes
`x @ w (+ b)` from its own parameter `w`), chosen by module-name patterns, become decomposed
sites.

    target = haiku_target(fn, params, x, {"mlp/~/linear_*": 20}, divergence="mse")

`fn` is the function a user would give `hk.transform` (its parameters `params`, an example
input `x`). Every call of a linear module is intercepted with `hk.intercept_methods`: a site's call
runs pd's site hook on the module's own `w` (its bias `b`, if any, stays frozen and is added
after), any other call runs unchanged. A module inside `hk.layer_stack` gives one site per
layer: pd's per-layer arrays (`LayerSites`) enter the model as haiku state of that module,
which the layer stack slices per layer like its parameters, and the site inputs leave it as
state, which the layer stack stacks (the taps `in.{path}`). Patterns are `fnmatch` patterns
over parameter paths (`"mlp/~/linear_0"`, `"stack/attn/query"`); a site is named by its path,
and in a layer stack by `{path}/{layer}`.
"""

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import haiku as hk
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from pd.decompose import LayerSites, Sites
from pd.sites import SiteSpec, SiteTable, input_tap
from pd.targets.base import Batch, Divergence, Output, Taps, TargetBase

_TAP = "pd_input"  # the state entry holding a module's input
_SITE = "pd_site_"  # state entries holding a module's LayerSites leaves, numbered


@dataclass(frozen=True)
class Linear:
    """A linear module the model calls: its parameter path, sizes and its layer-stack depth
    (0 outside a layer stack)."""

    path: str
    d_in: int
    d_out: int
    n_layers: int


def find_linears(fn: Callable[[Batch], Output], params: hk.Params, x: Batch) -> dict[str, Linear]:
    """The linear modules `fn` calls, by parameter path, in call order: every `hk.Linear`, and
    any other module called on one array whose output on `x` is `x @ w (+ b)` of its own
    parameters (checked on `x`; a module that is not linear in its `w` is not a site)."""

    def record(
        next_f: Callable[..., object],
        args: tuple[object, ...],
        kwargs: Mapping[str, object],
        ctx: hk.MethodContext,
    ) -> object:
        out = next_f(*args, **kwargs)
        if _linear_call(ctx, args, kwargs):
            calls.append(ctx.module.module_name)  # a name, at trace time
            (inputs,) = args
            assert isinstance(inputs, jax.Array) and isinstance(out, jax.Array)
            expected = _linear(ctx.module, inputs)
            error = jnp.max(jnp.abs(out - expected)) / (jnp.max(jnp.abs(expected)) + 1e-6)
            hk.set_state(_TAP, error)
        return out

    def traced(x: Batch) -> Output:
        with hk.intercept_methods(record):
            return fn(x)

    calls: list[str] = []
    _, state = jax.jit(hk.transform_with_state(traced).apply)(params, {}, None, x)
    # hk.Linear computes exactly x @ w + b; another module counts when it agrees to rounding.
    paths = [path for path, entries in state.items() if _TAP in entries]
    paths = [p for p in paths if float(jnp.max(state[p][_TAP])) < 1e-4]
    order = {p: next(i for i, n in enumerate(calls) if _called_as(p, n)) for p in paths}
    found = {}
    for path in sorted(paths, key=order.__getitem__):
        w = params[path]["w"]
        found[path] = Linear(path, w.shape[-2], w.shape[-1], w.shape[0] if w.ndim == 3 else 0)
    for path in paths:
        clash = [p for p in paths if p != path and _called_as(p, path.rsplit("/", 1)[-1])]
        if found[path].n_layers and clash:
            raise ValueError(
                f"linear modules {path!r} and {clash[0]!r} run under one module name, "
                "expected distinct names"
            )
    return found


@dataclass(frozen=True)
class HaikuTarget(TargetBase):
    """A user's haiku model with the linear modules of `linears` decomposed."""

    fn: Callable[[Batch], Output]
    linears: tuple[tuple[Linear, int], ...]  # decomposed modules and their C
    output_divergence: Divergence = "mse"
    table: SiteTable = field(init=False)
    _net: hk.TransformedWithState = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sites = []
        for lin, C in self.linears:
            layers = range(lin.n_layers) if lin.n_layers else [None]
            for i in layers:
                name = lin.path if i is None else f"{lin.path}/{i}"
                sites.append(SiteSpec(name, lin.d_in, lin.d_out, C, i or 0, lin.path))
        # Canonical order (SPEC §2): layer ascending, then the modules in call order.
        sites.sort(key=lambda s: s.layer)
        depth = max([lin.n_layers for lin, _ in self.linears] + [1])
        object.__setattr__(self, "table", SiteTable(tuple(sites), depth))
        object.__setattr__(self, "_net", hk.transform_with_state(self._intercepted))

    @property
    def divergence(self) -> Divergence:
        return self.output_divergence

    def weights(self, params: hk.Params) -> dict[str, Float[Array, "L d_in d_out"]]:
        """Each decomposed module's `w`, `[n_layers, d_in, d_out]` (`[1, ...]` outside a stack)."""
        return {
            lin.path: params[lin.path]["w"] if lin.n_layers else params[lin.path]["w"][None]
            for lin, _ in self.linears
        }

    def apply(self, params: hk.Params, x: Batch, sites: Sites) -> tuple[Output, Taps]:
        """The model's output with `sites`, and every decomposed module's input per layer."""
        state = {}
        for lin, _ in self.linears:
            if lin.path not in sites.layers:
                continue
            here = sites.layers[lin.path]
            # A layer stack slices its state per layer; a module outside one reads layer 0.
            here = jax.tree.map(lambda a, n=lin.n_layers: a[:n] if n else a[0], here)
            leaves = jax.tree.leaves(here)
            state[lin.path] = {f"{_SITE}{j}": leaf for j, leaf in enumerate(leaves)}
        out: Output
        state_out: hk.State
        out, state_out = self._net.apply(params, state, None, x, sites)
        taps = {}
        for lin, _ in self.linears:
            tap = state_out[lin.path][_TAP]
            taps[input_tap(lin.path)] = tap if lin.n_layers else tap[None]
        return out, taps

    def _intercepted(self, x: Batch, sites: Sites) -> Output:
        decomposed = {lin.path for lin, _ in self.linears}
        # Each kind's LayerSites without the layer axis: its tree and how many leaves it has.
        per_layer = {k: jax.tree.map(lambda a: a[0], s) for k, s in sites.layers.items()}
        treedef = {k: jax.tree.structure(s) for k, s in per_layer.items()}
        n_leaves = {k: len(jax.tree.leaves(s)) for k, s in per_layer.items()}

        def site_call(
            next_f: Callable[..., object],
            args: tuple[object, ...],
            kwargs: Mapping[str, object],
            ctx: hk.MethodContext,
        ) -> object:
            if not _linear_call(ctx, args, kwargs):
                return next_f(*args, **kwargs)
            path = _param_path(ctx.module, decomposed)
            if path is None:
                return next_f(*args, **kwargs)
            (inputs,) = args
            assert isinstance(inputs, jax.Array)
            hk.set_state(_TAP, inputs)
            if path not in sites.layers:
                return next_f(*args, **kwargs)
            params = ctx.module.params_dict()
            name = ctx.module.module_name
            leaves = [hk.get_state(f"{_SITE}{j}") for j in range(n_leaves[path])]
            here: LayerSites = jax.tree.unflatten(treedef[path], leaves)
            y = sites.hook(path, here, inputs, params[f"{name}/w"])
            if f"{name}/b" in params:
                y = y + jnp.broadcast_to(params[f"{name}/b"], y.shape)
            return y

        with hk.intercept_methods(site_call):
            return self.fn(x)


def _linear_call(
    ctx: hk.MethodContext, args: tuple[object, ...], kwargs: Mapping[str, object]
) -> bool:
    """A call that may be a linear site: `__call__` on one array, of an `hk.Linear` or of a
    module with a parameter `w` of its own."""
    if ctx.method_name != "__call__" or kwargs or len(args) != 1:
        return False
    if isinstance(ctx.module, hk.Linear):
        return True
    w = ctx.module.params_dict().get(f"{ctx.module.module_name}/w")
    return isinstance(args[0], jax.Array) and w is not None and w.ndim == 2


def _linear(module: hk.Module, inputs: jax.Array) -> jax.Array:
    """`inputs @ w (+ b)` with the module's own parameters."""
    params = module.params_dict()
    y = inputs @ params[f"{module.module_name}/w"]
    b = params.get(f"{module.module_name}/b")
    return y if b is None else y + b


def _called_as(path: str, name: str) -> bool:
    """Whether the module at parameter `path` runs under the module name `name`: the same, or
    inside a layer stack the path's last part (`stack/inner` runs as `inner`)."""
    return path == name or path.endswith(f"/{name}")


def _param_path(module: hk.Module, paths: set[str]) -> str | None:
    """The parameter path among `paths` of a module being called, if any."""
    inside = [p for p in paths if _called_as(p, module.module_name)]
    return inside[0] if len(inside) == 1 else None


def haiku_target(
    fn: Callable[[Batch], Output],
    params: hk.Params,
    x: Batch,
    sites: Mapping[str, int],
    divergence: Divergence = "mse",
) -> HaikuTarget:
    """A Target decomposing the linear modules of `fn` (`find_linears`) whose parameter paths
    match a pattern of `sites` (pattern → C; the first matching pattern gives C).

    `fn` is the model's forward as a plain function of one batch, as written for
    `hk.transform` (untransformed); `params` are its trained parameters (`hk.transform(fn)
    .init`'s tree); `x` is one example batch of its inputs, an array `[B, ...]` of the dtype
    the run's batches have: `fn` is traced on it to find the linear modules, and each is checked
    on it for being linear in its own weight. `divergence` compares the decomposed and the
    original outputs: "mse" or "kl" (the outputs are logits)."""
    found = find_linears(fn, params, x)
    chosen = []
    for path, lin in found.items():
        C = next((c for pattern, c in sites.items() if fnmatch.fnmatchcase(path, pattern)), 0)
        if C:
            chosen.append((lin, C))
    unmatched = [p for p in sites if not any(fnmatch.fnmatchcase(q, p) for q in found)]
    if unmatched:
        raise ValueError(
            f"site pattern {unmatched[0]!r} matches no linear module, expected one of "
            f"{', '.join(found)}"
        )
    return HaikuTarget(fn, tuple(chosen), divergence)
