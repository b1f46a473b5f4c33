"""Residual MLP toy: `r = x W_E; r += ReLU(r W_in) W_out` per layer; output `r W_Eᵀ` (SPEC §12)."""

from dataclasses import dataclass, field
from functools import partial

import haiku as hk
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Key

from pd import loops, rng
from pd.decompose import LayerSites, Sites, apply_site
from pd.init import scaled_normal
from pd.precision import matmul
from pd.sites import SiteSpec, SiteTable, input_tap, output_tap
from pd.targets.base import LayerTaps, Taps, TargetBase, TrainParams


@dataclass(frozen=True)
class ResidMLP(TargetBase):
    """L residual ReLU blocks over a fixed random unit-norm embedding, no biases."""

    n_features: int
    d_embed: int
    d_mlp: int
    n_layers: int
    feature_prob: float
    C: int
    table: SiteTable = field(init=False)

    def __post_init__(self) -> None:
        d, h = self.d_embed, self.d_mlp
        sites: list[SiteSpec] = []
        for i in range(self.n_layers):
            sites += [SiteSpec(f"layers.{i}.mlp_in", d, h, self.C, i, "mlp_in")]
            sites += [SiteSpec(f"layers.{i}.mlp_out", h, d, self.C, i, "mlp_out")]
        object.__setattr__(self, "table", SiteTable(tuple(sites)))

    def apply(
        self, params: hk.Params, x: Float[Array, "B n"], sites: Sites
    ) -> tuple[Float[Array, "B n"], Taps]:
        """The output, and every site's input and output, the layers under one scan (not
        checkpointed: a toy's activations are small)."""
        return self._layers(params, matmul(x, params["~"]["embed"]), sites)

    def resume(
        self, params: hk.Params, x: Float[Array, "B n"], taps: Taps, sites: Sites
    ) -> Float[Array, "B n"]:
        """`forward` from the clean embedding (the first layer's input tap): every layer has
        sites, and the embedding before them is frozen in every masked pass."""
        return self._layers(params, taps[input_tap("mlp_in")][0], sites)[0]

    def _layers(
        self, params: hk.Params, r0: Float[Array, "B d"], sites: Sites
    ) -> tuple[Float[Array, "B n"], Taps]:
        p = params["~"]

        def layer(
            r: Float[Array, "B d"],
            xs: tuple[Float[Array, "d h"], Float[Array, "h d"], dict[str, LayerSites]],
        ) -> tuple[Float[Array, "B d"], LayerTaps]:
            W_in, W_out, here = xs
            pre = apply_site(sites.hook, here, "mlp_in", r, W_in)
            hidden = jax.nn.relu(pre)
            mlp = apply_site(sites.hook, here, "mlp_out", hidden, W_out)
            taps = {input_tap("mlp_in"): r, input_tap("mlp_out"): hidden}
            return r + mlp, taps | {output_tap("mlp_in"): pre, output_tap("mlp_out"): mlp}

        r, taps = loops.scan(layer, r0, (p["mlp_in"], p["mlp_out"], sites.layers))
        return matmul(r, p["embed"].T), taps

    @property
    def dense_sites(self) -> dict[str, int]:
        """The read-out of d_mlp neurons is expected as d_mlp co-active subcomponents."""
        return {f"layers.{i}.mlp_out": self.d_mlp for i in range(self.n_layers)}

    @property
    def feature_sites(self) -> tuple[str, ...]:
        return ()

    def weights(self, params: hk.Params) -> dict[str, Float[Array, "L d_in d_out"]]:
        p = params["~"]
        return {"mlp_in": p["mlp_in"], "mlp_out": p["mlp_out"]}

    def sample(self, key: Key[Array, ""], batch_size: int) -> Float[Array, "B n"]:
        """Each feature active with probability `feature_prob`, value U[−1, 1]."""
        k_on, k_val = jax.random.split(key)
        shape = (batch_size, self.n_features)
        on = rng.bernoulli(k_on, self.feature_prob, shape)
        return jnp.where(on, rng.uniform(k_val, shape, minval=-1.0, maxval=1.0), 0.0)

    def label(self, x: Float[Array, "B n"]) -> Float[Array, "B n"]:
        return x + jax.nn.relu(x)

    def init_train(self, key: Key[Array, ""]) -> TrainParams:
        k_embed, *k_layers = jax.random.split(key, 1 + 2 * self.n_layers)
        W_E = jax.random.normal(k_embed, (self.n_features, self.d_embed))
        d, h = self.d_embed, self.d_mlp
        # Layer i draws W_in from k_layers[2i] and W_out from k_layers[2i + 1], stacked.
        k_in, k_out = jnp.stack(k_layers[0::2]), jnp.stack(k_layers[1::2])
        return {
            "embed": W_E / jnp.linalg.norm(W_E, axis=1, keepdims=True),
            "mlp_in": jax.vmap(partial(scaled_normal, shape=(d, h)))(k_in),
            "mlp_out": jax.vmap(partial(scaled_normal, shape=(h, d)))(k_out),
        }

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
