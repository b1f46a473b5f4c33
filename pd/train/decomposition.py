"""A trained decomposition as a typed object (`Decomposition`), from a run (`RunResult`) or a
run folder (`load`, exported as `pd.load`)."""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import haiku as hk
import jax
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import Array, Float, jaxtyped

from pd.ci import GroupParams
from pd.decompose import FROZEN, Constant, Sites, decomposed_hook, layer_sites
from pd.init import init_vu, key_tree
from pd.state import Components
from pd.targets.base import Batch, Output, Target
from pd.targets.configs import FactoryConfig
from pd.train import checkpoint
from pd.train.config import ConfigError, RunConfig, from_dict
from pd.train.evaluate import KnownAnswer
from pd.train.kinds import OwnTarget, TargetKind, kind_of
from pd.train.recipe import make_batches, make_recipe
from pd.train.step import Recipe

typechecked = jaxtyped(typechecker=beartype)  # the shapes of public signatures, at call time


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
    def V(self) -> dict[str, Float[Array, "d_in C"]]:
        """Per-site views of the stacked V storage."""
        return self.recipe.table.views(self.components.V)

    @property
    def U(self) -> dict[str, Float[Array, "C d_out"]]:
        return self.recipe.table.views(self.components.U)

    def batch(self, step: int, evaluation: bool = False) -> Batch:
        """The run's training batch of `step` (S18), or with `evaluation` its evaluation batch
        (held-out data where the target has it; evaluation read steps below 2³¹ − 1)."""
        run_key = key_tree(self.config.seed)[2]
        return make_batches(self.config, self.recipe, run_key, None, evaluation, self.kind)(step)

    @cached_property
    def _input(self) -> jax.ShapeDtypeStruct:
        shape: jax.ShapeDtypeStruct = jax.eval_shape(lambda: self.batch(0))
        return shape

    def _check(self, x: Batch) -> None:
        """One sentence when `x` is not shaped like the run's batches (any batch size; any
        sequence length for tokens)."""
        ref = self._input
        tokens = jnp.issubdtype(ref.dtype, jnp.integer)
        same_kind = jnp.issubdtype(x.dtype, jnp.integer) == tokens
        same_shape = x.ndim == ref.ndim and (tokens or x.shape[1:] == ref.shape[1:])
        if not (same_kind and same_shape):
            want = (
                "[B, T] integer token ids"
                if tokens
                else f"[B, {', '.join(map(str, ref.shape[1:]))}] floats"
            )
            raise ValueError(
                f"input x has shape {list(x.shape)} of {x.dtype}, expected {want} like the "
                "run's batches"
            )

    @typechecked
    def ci(self, x: Batch) -> dict[str, Float[Array, "B *T C"]]:
        """`{site: ci_lower [*L, C]}`: the causal importance of every subcomponent on `x`
        (`[B, n_features]` inputs of a toy, `[B, T]` tokens of a language model)."""
        self._check(x)
        ci, _ = self.recipe.ci(self.ci_params, self.components, self.frozen, x)
        return self.recipe.table.views(ci.lower)

    @typechecked
    def clean(self, x: Batch) -> Output:
        """The frozen target's output."""
        self._check(x)
        return self.target.forward(self.frozen, x, FROZEN)

    @typechecked
    def masked_forward(
        self,
        x: Batch,
        masks: Mapping[str, Float[Array, "B *T C"]],
        delta: float = 0.0,
    ) -> Output:
        """The output with each site in `masks` live under its mask (others frozen, S2).

        `delta` scales the delta channel `x @ (W − V U)`: 0 drops it, 1 keeps it.
        """
        self._check(x)
        unknown = set(masks) - set(self.sites)
        if unknown:
            raise KeyError(f"unknown sites {sorted(unknown)}; known sites: {', '.join(self.sites)}")
        table = self.recipe.table
        shape = next(iter(masks.values())).shape[:-1]
        # The masks enter as CI under a source of 0 (S1: mask = CI), the delta channel at `delta`.
        lower = tuple(
            jnp.stack([masks.get(n, jnp.zeros((*shape, grp.C))) for n in grp.names])
            for grp in table.groups
        )
        live = {
            kind: jnp.asarray([i >= 0 and table.sites[i].name in masks for i in lay.indices])
            for kind, lay in ((k, table.layout(k)) for k in table.kinds)
        }
        comps = self.components
        sites = layer_sites(table, comps.V, comps.U, lower, live=live)
        hook = decomposed_hook(Constant(0.0, delta))
        return self.target.forward(self.frozen, x, Sites(hook, sites))

    @typechecked
    def ablate(self, x: Batch, site: str, subcomponents: Sequence[int]) -> Output:
        """The target's output with the rank-1 pieces `V[:, c] U[c, :]` of `subcomponents`
        taken out of `site`'s weight (`W − Σ_c V[:, c] U[c, :]`); every other site frozen."""
        self._check(x)
        C = self.recipe.table.spec(site).C if site in self.sites else 0
        bad = [c for c in subcomponents if not 0 <= c < C]
        if site not in self.sites or bad:
            what = f"site {site!r}" if site not in self.sites else f"subcomponent {bad[0]}"
            raise KeyError(
                f"{what} is not in the decomposition, expected one of its sites "
                f"({', '.join(self.sites)}) and indices in [0, C)"
            )
        lead = self.ci(x)[site].shape[:-1]
        keep = jnp.ones((*lead, C)).at[..., jnp.asarray(subcomponents, jnp.int32)].set(0.0)
        return self.masked_forward(x, {site: keep}, delta=1.0)


def load(run_dir: str | Path, own: OwnTarget | None = None) -> Decomposition:
    """The decomposition saved in a run folder. Its frozen target comes from the folder's copy
    (small targets) or is rebuilt from the config (from the target cache, retrained, or loaded
    from its checkpoint file), and must match the fingerprint the run recorded. A target given
    to `run(own=...)` in Python must be given again as `own`."""
    run_dir = Path(run_dir)
    config_path = run_dir / "config.json"
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
    recorded, frozen = checkpoint.load_frozen(run_dir / "frozen.npz")
    if frozen is None or isinstance(config.target, FactoryConfig):  # a caller's target: compare
        frozen = kind.load_frozen(recipe.target).params
    found = checkpoint.fingerprint(frozen)
    if found != recorded:
        raise ValueError(
            f"the target's frozen weights (sha256 {found[:12]}) are not the ones run folder "
            f"'{run_dir}' was decomposed against (sha256 {recorded[:12]}), expected the same "
            "target"
        )
    like = jax.eval_shape(
        lambda: (init_vu(jax.random.key(0), recipe.table), recipe.ci_fn.init(jax.random.key(0)))
    )
    components, ci_params = checkpoint.load(run_dir / "decomposition.npz", like)
    return Decomposition(config, recipe, kind, frozen, components, ci_params)
