"""Residual MLP toy: `r = x W_E; r += ReLU(r W_in) W_out` per layer; output `r W_Eᵀ` (SPEC §12)."""

from dataclasses import dataclass, field

import haiku as hk
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Key

from pd.sites import SiteSpec, SiteTable
from pd.targets.base import Divergence, SiteHook, Taps, TrainParams, site_input_taps


@dataclass(frozen=True)
class ResidMLP:
    """L residual ReLU blocks over a fixed random unit-norm embedding, no biases."""

    n_features: int
    d_embed: int
    d_mlp: int
    n_layers: int
    feature_prob: float
    C: int
    table: SiteTable = field(init=False)
    _net: hk.Transformed = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        d, h = self.d_embed, self.d_mlp
        sites: list[SiteSpec] = []
        for i in range(self.n_layers):
            sites += [SiteSpec(f"layers.{i}.mlp_in", d, h, self.C)]
            sites += [SiteSpec(f"layers.{i}.mlp_out", h, d, self.C)]
        object.__setattr__(self, "table", SiteTable(tuple(sites)))

        def forward(x: Float[Array, "B n"], site: SiteHook) -> Float[Array, "B n"]:
            W_E = hk.get_parameter("embed", (self.n_features, d), init=jnp.zeros)
            r = x @ W_E
            for i in range(self.n_layers):
                W_in = hk.get_parameter(f"layers_{i}_mlp_in", (d, h), init=jnp.zeros)
                W_out = hk.get_parameter(f"layers_{i}_mlp_out", (h, d), init=jnp.zeros)
                hidden = jax.nn.relu(site(f"layers.{i}.mlp_in", r, W_in))
                r = r + site(f"layers.{i}.mlp_out", hidden, W_out)
            return r @ W_E.T

        object.__setattr__(self, "_net", hk.without_apply_rng(hk.transform(forward)))

    @property
    def divergence(self) -> Divergence:
        return "mse"

    def taps(self, params: hk.Params, x: Float[Array, "B n"]) -> tuple[Taps, Float[Array, "B n"]]:
        """S4: each site's clean-path input, keyed by site name, and the clean output."""
        return site_input_taps(self.forward, params, x)

    @property
    def dense_sites(self) -> dict[str, int]:
        """The read-out of d_mlp neurons is expected as d_mlp co-active subcomponents."""
        return {f"layers.{i}.mlp_out": self.d_mlp for i in range(self.n_layers)}

    @property
    def feature_sites(self) -> tuple[str, ...]:
        return ()

    def forward(
        self, params: hk.Params, x: Float[Array, "B n"], site: SiteHook
    ) -> Float[Array, "B n"]:
        out: Float[Array, "B n"] = self._net.apply(params, x, site)
        return out

    def weights(self, params: hk.Params) -> dict[str, Float[Array, "d_in d_out"]]:
        p = params["~"]
        return {s: p[s.replace(".", "_")] for s in self.table.names}

    def sample(self, key: Key[Array, ""], batch_size: int) -> Float[Array, "B n"]:
        """Each feature active with probability `feature_prob`, value U[−1, 1]."""
        k_on, k_val = jax.random.split(key)
        shape = (batch_size, self.n_features)
        on = jax.random.bernoulli(k_on, self.feature_prob, shape)
        return jnp.where(on, jax.random.uniform(k_val, shape, minval=-1.0, maxval=1.0), 0.0)

    def label(self, x: Float[Array, "B n"]) -> Float[Array, "B n"]:
        return x + jax.nn.relu(x)

    def init_train(self, key: Key[Array, ""]) -> TrainParams:
        k_embed, *k_layers = jax.random.split(key, 1 + 2 * self.n_layers)
        W_E = jax.random.normal(k_embed, (self.n_features, self.d_embed))
        p = {"embed": W_E / jnp.linalg.norm(W_E, axis=1, keepdims=True)}
        for i in range(self.n_layers):
            k_in, k_out = k_layers[2 * i], k_layers[2 * i + 1]
            p[f"layers_{i}_mlp_in"] = jax.random.normal(
                k_in, (self.d_embed, self.d_mlp)
            ) / jnp.sqrt(self.d_embed)
            p[f"layers_{i}_mlp_out"] = jax.random.normal(
                k_out, (self.d_mlp, self.d_embed)
            ) / jnp.sqrt(self.d_mlp)
        return p

    def expand(self, trainable: TrainParams) -> hk.Params:
        """The embedding is fixed: it enters the forward without gradient."""
        p = dict(trainable)
        p["embed"] = jax.lax.stop_gradient(p["embed"])
        return {"~": p}

    def check(self, params: hk.Params, loss: float) -> str | None:
        """Learned when the MSE is below half of the no-MLP baseline `p · E[ReLU(u)²] = p / 6`."""
        bound = 0.5 * self.feature_prob / 6.0
        if loss < bound:
            return None
        return f"final loss {loss:.3g} is not below {bound:.3g} (half the no-MLP baseline)"
