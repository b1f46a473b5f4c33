"""`pd.load(run_dir)`: a trained decomposition as a typed object for downstream research code."""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import haiku as hk
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from pd.ci import GroupParams
from pd.decompose import FROZEN, Constant, Sites, decomposed_hook, layer_sites
from pd.init import init_vu
from pd.state import Components
from pd.targets.base import Batch, Output
from pd.train import checkpoint
from pd.train.config import ConfigError, RunConfig, from_dict
from pd.train.kinds import kind_of
from pd.train.run import make_recipe
from pd.train.step import Recipe


@dataclass(frozen=True)
class Decomposition:
    """The trained V/U and CI function of a run, with its frozen target."""

    config: RunConfig
    recipe: Recipe
    frozen: hk.Params
    components: Components
    ci_params: GroupParams

    @property
    def sites(self) -> tuple[str, ...]:
        return self.recipe.table.names

    @property
    def V(self) -> dict[str, Float[Array, "d_in C"]]:
        """Per-site views of the stacked V storage."""
        return self.recipe.table.views(self.components.V)

    @property
    def U(self) -> dict[str, Float[Array, "C d_out"]]:
        return self.recipe.table.views(self.components.U)

    def ci(self, x: Batch) -> dict[str, Float[Array, "B *T C"]]:
        """`{site: ci_lower [*L, C]}`: the causal importance of every subcomponent on `x`
        (`[B, n_features]` inputs of a toy, `[B, T]` tokens of a language model)."""
        ci, _ = self.recipe.ci(self.ci_params, self.components, self.frozen, x)
        return self.recipe.table.views(ci.lower)

    def clean(self, x: Batch) -> Output:
        """The frozen target's output."""
        return self.recipe.target.forward(self.frozen, x, FROZEN)

    def masked_forward(
        self,
        x: Batch,
        masks: Mapping[str, Float[Array, "B *T C"]],
        delta: float = 0.0,
    ) -> Output:
        """The output with each site in `masks` live under its mask (others frozen, S2).

        `delta` scales the delta channel `x @ (W − V U)`: 0 drops it, 1 keeps it.
        """
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
        return self.recipe.target.forward(self.frozen, x, Sites(hook, sites))


def load(run_dir: str | Path) -> Decomposition:
    """The decomposition saved in a run folder (the target comes from the cache or is retrained)."""
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
    recipe = make_recipe(config)
    frozen = kind_of(config.target).load_frozen(recipe.target).params
    like = jax.eval_shape(
        lambda: (init_vu(jax.random.key(0), recipe.table), recipe.ci_fn.init(jax.random.key(0)))
    )
    components, ci_params = checkpoint.load(run_dir / "decomposition.npz", like)
    return Decomposition(config, recipe, frozen, components, ci_params)
