"""A trained decomposition as a typed object (`Decomposition`), from a run (`RunResult`) or a
run folder (`load`, exported as `pd.load`)."""

import json
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
from beartype import beartype
from jaxtyping import Array, Bool, Float, Shaped, jaxtyped

from pd.ci import GroupParams
from pd.decompose import FROZEN, Constant, Sites, decomposed_hook, layer_sites
from pd.init import init_vu, key_tree
from pd.sites import SiteViews
from pd.state import Components
from pd.targets.base import Batch, Output, Target
from pd.train import arrays
from pd.train.config import ConfigError, RunConfig, from_dict
from pd.train.evaluate import ALIVE_THRESHOLD, EVAL_FOLD, KnownAnswer
from pd.train.folder import RunFolder
from pd.train.kinds import OwnTarget, TargetKind, kind_of
from pd.train.objective import Recipe
from pd.train.recipe import make_batches, make_recipe
from pd.train.rundir import checkpoint_steps, partial_dir

typechecked = jaxtyped(typechecker=beartype)  # the shapes of public signatures, at call time
# Inputs and masks may be jax or numpy arrays (converted with jnp.asarray). A mask's axes are
# checked against `ci(x)` by `masked_forward` itself, for one sentence on a wrong shape.
BatchIn = Shaped[Array | np.ndarray, "B ..."]
MaskIn = Float[Array | np.ndarray, "*_B _C"]
PARTIAL = ".partial"  # the suffix of a run's folder until it finishes (pd.train.rundir)


def _require(ok: bool, message: str, error: type[Exception] = ValueError) -> None:
    """Raise `error(message)` unless `ok`; `message` is one sentence naming the argument, its
    value and what was expected."""
    if not ok:
        raise error(message)


@dataclass(frozen=True)
class Active:
    """One position of an input: its token, and per site its most important subcomponents as
    `(index, CI)`, highest CI first."""

    token: int
    text: str
    top: dict[str, list[tuple[int, float]]]


@dataclass(frozen=True)
class Decomposition:
    """The trained V/U and CI function of a run, with its frozen target."""

    config: RunConfig
    recipe: Recipe
    kind: TargetKind
    frozen: hk.Params
    components: Components
    ci_params: GroupParams

    @property
    def sites(self) -> tuple[str, ...]:
        return self.recipe.table.names

    @property
    def target(self) -> Target:
        return self.recipe.target

    @property
    def known(self) -> KnownAnswer | None:
        """The answer the target declares (toys), which the known-answer metrics score."""
        return self.kind.known(self.target)

    @property
    def V(self) -> Mapping[str, Float[Array, "d_in C"]]:
        """Per-site views of the stacked V storage."""
        return SiteViews(self.recipe.table, self.components.V)

    @property
    def U(self) -> Mapping[str, Float[Array, "C d_out"]]:
        return SiteViews(self.recipe.table, self.components.U)

    def batch(self, step: int, evaluation: bool = False) -> Batch:
        """The run's training batch of `step` (S18), or with `evaluation` its evaluation batch
        (held-out data where the target has it); steps in [0, 2³¹ − 1)."""
        expected = f"expected an int in [0, {EVAL_FOLD})"
        is_int = isinstance(step, int | np.integer) and not isinstance(step, bool)
        _require(is_int, f"step {step!r} is a {type(step).__name__}, {expected}", TypeError)
        _require(0 <= step < EVAL_FOLD, f"step is {step}, {expected}")
        run_key = key_tree(self.config.seed)[2]
        return make_batches(
            self.config, self.recipe, run_key, evaluation=evaluation, kind=self.kind
        )(int(step))

    def alive(self) -> dict[str, Bool[np.ndarray, " C"]]:
        """Per site, which subcomponents are alive: CI above `ALIVE_THRESHOLD` (0.1) on some of
        the run's `eval.n_samples` evaluation examples, the batches the evaluation of a
        language model or a caller's target reads (held-out data where the target has it)."""
        cfg = self.config.eval
        run_key = key_tree(self.config.seed)[2]
        batches = make_batches(self.config, self.recipe, run_key, evaluation=True, kind=self.kind)
        ci = self._ci_jit
        most: dict[str, np.ndarray] = {}
        for b in range(max(1, -(-cfg.n_samples // cfg.batch))):
            for site, c in ci(batches(EVAL_FOLD - b)).items():
                m = np.asarray(jnp.max(c.reshape(-1, c.shape[-1]), axis=0))
                most[site] = np.maximum(most.get(site, m), m)
        return {site: m > ALIVE_THRESHOLD for site, m in most.items()}

    def active(self, text_or_tokens: str | Sequence[int], top: int = 5) -> list[Active]:
        """Per token of `text_or_tokens` (text, for a target that reads text, or token ids), the
        `top` subcomponents with the highest CI at each site (those with CI above 0)."""
        if isinstance(text_or_tokens, str):
            encode = self.kind.encoder
            _require(
                encode is not None,
                "text_or_tokens is text, but this run's target reads no text (target.text is "
                "empty), expected token ids",
            )
            assert encode is not None
            ids = encode(text_or_tokens)
        else:
            ids = [int(i) for i in text_or_tokens]
        _require(bool(ids), "text_or_tokens has no tokens, expected at least one")
        ci = {site: np.asarray(c[0]) for site, c in self.ci(np.asarray([ids], np.int32)).items()}
        labels = self.kind.labels
        texts = labels(ids) if labels is not None else [str(i) for i in ids]
        out = []
        for t, (token, text) in enumerate(zip(ids, texts, strict=True)):
            best = {site: np.argsort(-c[t], kind="stable")[:top] for site, c in ci.items()}
            per_site = {
                site: [(int(j), float(ci[site][t, j])) for j in order if ci[site][t, j] > 0]
                for site, order in best.items()
            }
            out.append(Active(token, text, per_site))
        return out

    @cached_property
    def _input(self) -> jax.ShapeDtypeStruct:
        shape: jax.ShapeDtypeStruct = jax.eval_shape(lambda: self.batch(0))
        return shape

    def _checked(self, x: BatchIn) -> Batch:
        """`x` as a jax array, or one sentence when it is not shaped like the run's batches
        (any batch size from 1; any sequence length from 1 for tokens)."""
        x = jnp.asarray(x)
        ref = self._input
        tokens = jnp.issubdtype(ref.dtype, jnp.integer)
        same_kind = jnp.issubdtype(x.dtype, jnp.integer) == tokens
        same_shape = x.ndim == ref.ndim and (tokens or x.shape[1:] == ref.shape[1:])
        want = (
            "[B, T] integer token ids (B, T ≥ 1)"
            if tokens
            else f"[B, {', '.join(map(str, ref.shape[1:]))}] floats (B ≥ 1)"
        )
        _require(
            same_kind and same_shape and x.size > 0,
            f"input x has shape {list(x.shape)} of {x.dtype}, expected {want} like the run's "
            "batches",
        )
        return x

    def _ci(self, x: Batch) -> dict[str, Float[Array, "B *T C"]]:
        return _ci_lower(self.recipe, self.ci_params, self.components, self.frozen, x)

    @cached_property
    def _ci_jit(self) -> Callable[[Batch], dict[str, Float[Array, "B *T C"]]]:
        """`_ci` compiled once, its weights passed in as arguments: `jax.jit(self._ci)` would
        capture them, the whole frozen target, as constants of the program (another copy of
        them for as long as the program is cached, more while it compiles)."""
        jitted = jax.jit(partial(_ci_lower, self.recipe))
        weights = self.ci_params, self.components, self.frozen  # not `self`: no cycle to collect
        return lambda x: jitted(*weights, x)

    def _masks(self, x: Batch, masks: Mapping[str, MaskIn]) -> dict[str, Float[Array, "B *T C"]]:
        """`masks` as jax arrays, or one sentence on an empty, unknown or wrong-shaped one: each
        is shaped like the site's `ci(x)` (found from the shapes alone, nothing computed)."""
        sites = ", ".join(self.sites)
        _require(bool(masks), f"masks is empty, expected at least one site's mask (sites: {sites})")
        unknown = sorted(set(masks) - set(self.sites))
        _require(
            not unknown,
            f"masks has unknown sites {unknown}, expected sites of the decomposition ({sites})",
            KeyError,
        )
        shapes = jax.eval_shape(self._ci, x)
        out = {name: jnp.asarray(mask) for name, mask in masks.items()}
        for name, mask in out.items():
            want = shapes[name].shape
            _require(
                mask.shape == want,
                f"mask of site {name!r} has shape {list(mask.shape)}, expected {list(want)} "
                f"like ci(x)[{name!r}] (x's batch axes, then C = {want[-1]} for that site)",
            )
        return out

    @typechecked
    def ci(self, x: BatchIn) -> dict[str, Float[Array, "B *T C"]]:
        """`{site: ci_lower [*L, C]}`: the causal importance of every subcomponent on `x`
        (`[B, n_features]` inputs of a toy, `[B, T]` tokens of a language model; jax or numpy
        arrays)."""
        return self._ci(self._checked(x))

    @typechecked
    def clean(self, x: BatchIn) -> Output:
        """The frozen target's output."""
        return self.target.forward(self.frozen, self._checked(x), FROZEN)

    @typechecked
    def masked_forward(self, x: BatchIn, masks: Mapping[str, MaskIn], delta: float = 0.0) -> Output:
        """The output with each site in `masks` live under its mask (others frozen, S2); each
        mask is shaped like the site's `ci(x)`, `[*L, C]`.

        `delta` scales the delta channel `x @ (W − V U)`: 0 drops it, 1 keeps it.
        """
        x = self._checked(x)
        masks = self._masks(x, masks)
        table = self.recipe.table
        shape = next(iter(masks.values())).shape[:-1]
        # The masks enter as CI under a source of 0 (S1: mask = CI), the delta channel at `delta`.
        lower = tuple(
            jnp.stack([masks.get(n, jnp.zeros((*shape, grp.C))) for n in grp.names])
            for grp in table.groups
        )
        comps = self.components
        sites = layer_sites(table, comps.V, comps.U, lower, live=table.live(masks.keys()))
        hook = decomposed_hook(Constant(0.0, delta))
        return self.target.forward(self.frozen, x, Sites(hook, sites))

    @typechecked
    def ablate(self, x: BatchIn, site: str, subcomponents: Sequence[int]) -> Output:
        """The target's output with the rank-1 pieces `V[:, c] U[c, :]` of `subcomponents`
        taken out of `site`'s weight (`W − Σ_c V[:, c] U[c, :]`); every other site frozen."""
        x = self._checked(x)
        _require(
            site in self.sites,
            f"site {site!r} is not in the decomposition, expected one of its sites "
            f"({', '.join(self.sites)})",
            KeyError,
        )
        C = self.recipe.table.spec(site).C
        for c in subcomponents:
            _require(
                0 <= c < C,
                f"subcomponent {c} is not in the decomposition, expected indices in [0, {C}) for "
                f"site {site!r}",
                KeyError,
            )
        lead = jax.eval_shape(self._ci, x)[site].shape[:-1]
        keep = jnp.ones((*lead, C)).at[..., jnp.asarray(subcomponents, jnp.int32)].set(0.0)
        return self.masked_forward(x, {site: keep}, delta=1.0)


def _ci_lower(
    recipe: Recipe, ci_params: GroupParams, comps: Components, frozen: hk.Params, x: Batch
) -> dict[str, Float[Array, "B *T C"]]:
    """`{site: ci_lower}` of `x`."""
    ci, _ = recipe.ci(ci_params, comps, frozen, x)
    return recipe.table.views(ci.lower)


def load(run_dir: str | Path, own: OwnTarget | None = None) -> Decomposition:
    """The decomposition saved in a run folder. Its frozen target comes from the folder's copy
    (small targets) or is rebuilt from the config (from the target cache, retrained, or loaded
    from its checkpoint file), and must match the fingerprint the run recorded. A target given
    to `run(own=...)` in Python must be given again as `own`."""
    run_dir = Path(run_dir)
    _check_finished(run_dir)
    folder = RunFolder(run_dir)
    config_path = folder.config
    if not config_path.exists():
        raise FileNotFoundError(
            f"run folder '{run_dir}' has no config.json, expected a pd run folder"
        )
    try:
        config = from_dict(json.loads(config_path.read_text()))
    except json.JSONDecodeError as err:
        raise ConfigError(f"config file '{config_path}' is not valid JSON ({err})") from None
    kind = kind_of(config.target, own)
    recipe = make_recipe(config, kind)
    recorded, frozen = arrays.load_frozen(folder.frozen)
    if frozen is None or kind.given_frozen:  # a caller's target: compare
        frozen = kind.load_frozen(recipe.target).params
    found = arrays.fingerprint(frozen)
    if found != recorded:
        raise ValueError(
            f"the target's frozen weights (sha256 {found[:12]}) are not the ones run folder "
            f"'{run_dir}' was decomposed against (sha256 {recorded[:12]}), expected the same "
            "target"
        )
    like = jax.eval_shape(
        lambda: (init_vu(jax.random.key(0), recipe.table), recipe.ci_fn.init(jax.random.key(0)))
    )
    components, ci_params = arrays.load(folder.decomposition, like)
    return Decomposition(config, recipe, kind, frozen, components, ci_params)


def _check_finished(run_dir: Path) -> None:
    """One sentence, with the command that continues it, when `run_dir` is an unfinished run:
    a partial folder (named `.NAME.partial`, or with checkpoints but no decomposition.npz), or
    a run folder whose run has only its partial folder so far."""
    if run_dir.name.startswith(".") and run_dir.name.endswith(PARTIAL):
        partial, finished = run_dir, run_dir.with_name(run_dir.name[1 : -len(PARTIAL)])
    elif RunFolder(run_dir).checkpoints.is_dir() and not RunFolder(run_dir).decomposition.exists():
        partial, finished = run_dir, run_dir
    elif not run_dir.exists() and partial_dir(run_dir).is_dir():
        partial, finished = partial_dir(run_dir), run_dir
    else:
        return
    steps = checkpoint_steps(partial)
    where = "" if partial == run_dir else f"its run is in '{partial}', "
    kept = f"checkpoint at step {steps[-1]}" if steps else "no checkpoint yet"
    how = (
        f"continue it with `{shlex.quote(sys.executable)} -m pd.train CONFIG --out {finished} "
        "--resume` (the config "
        "and --set overrides it was started with)"
        if steps
        else "run it again, or wait for it if it is still running"
    )
    raise FileNotFoundError(
        f"run folder '{run_dir}' has not finished ({where}{kept}, no decomposition.npz), "
        f"expected a finished run folder: {how}"
    )
