"""Toy Model of Superposition `x̂ = ReLU(x W1 [I…] W2 + b)` (SPEC §12)."""

from dataclasses import dataclass, field

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Key

from pd import rng
from pd.decompose import Sites, apply_site, layer_of
from pd.sites import SiteSpec, SiteTable, input_tap, output_tap
from pd.targets.base import Taps, TargetBase, TrainParams


def _param(site: str) -> str:
    """A site's parameter: `linear1`, `hidden_{i}`, `linear2`."""
    return site.replace(".", "_")


@dataclass(frozen=True)
class TMS(TargetBase):
    """TMS n-m with `n_identity` frozen m×m identity layers between `linear1` and `linear2`."""

    n_features: int
    n_hidden: int
    n_identity: int
    feature_prob: float
    C: int
    table: SiteTable = field(init=False)

    def __post_init__(self) -> None:
        n, m = self.n_features, self.n_hidden
        sites = [SiteSpec("linear1", n, m, self.C)]
        sites += [SiteSpec(f"hidden.{i}", m, m, self.C) for i in range(self.n_identity)]
        sites.append(SiteSpec("linear2", m, n, self.C))
        # Every site is a kind of its own in the one layer (SPEC §12's layout needs no scan).
        object.__setattr__(self, "table", SiteTable(tuple(sites)))

    def apply(
        self, params: hk.Params, x: Float[Array, "B n"], sites: Sites
    ) -> tuple[Float[Array, "B n"], Taps]:
        """The output, and every site's input and output (`in.{site}`, `out.{site}`, one layer)."""
        p, layer = params["~"], layer_of(sites, 0)
        taps: Taps = {}

        def site(name: str, h: Float[Array, "B d"]) -> Float[Array, "B e"]:
            y = apply_site(sites.hook, layer, name, h, p[_param(name)])
            taps[input_tap(name)], taps[output_tap(name)] = h[None], y[None]
            return y

        h = site("linear1", x)
        for i in range(self.n_identity):
            h = site(f"hidden.{i}", h)
        out = jax.nn.relu(site("linear2", h) + p["b"])
        return out, taps

    @property
    def dense_sites(self) -> dict[str, int]:
        """An m×m identity is solved by m subcomponents that are all always on."""
        return {f"hidden.{i}": self.n_hidden for i in range(self.n_identity)}

    @property
    def feature_sites(self) -> tuple[str, ...]:
        """Row j of W1 is feature j's direction; linear2's read-out direction is not identified
        (any read direction with the right projection reconstructs), so it is not scored."""
        return ("linear1",)

    def weights(self, params: hk.Params) -> dict[str, Float[Array, "1 d_in d_out"]]:
        return {name: params["~"][_param(name)][None] for name in self.table.names}

    def sample(self, key: Key[Array, ""], batch_size: int) -> Float[Array, "B n"]:
        """Each feature active with probability `feature_prob`, value U[0, 1]."""
        k_on, k_val = jax.random.split(key)
        shape = (batch_size, self.n_features)
        on = rng.bernoulli(k_on, self.feature_prob, shape)
        return jnp.where(on, rng.uniform(k_val, shape), 0.0)

    def label(self, x: Float[Array, "B n"]) -> Float[Array, "B n"]:
        return x

    def init_train(self, key: Key[Array, ""]) -> TrainParams:
        n, m = self.n_features, self.n_hidden
        W1 = jax.random.normal(key, (n, m)) * jnp.sqrt(2.0 / (n + m))
        return {"W1": W1, "b": jnp.zeros((n,))}

    def expand(self, trainable: TrainParams) -> hk.Params:
        """Tied frozen form: `linear2 = linear1ᵀ` (decomposed as two sites)."""
        W1 = trainable["W1"]
        p = {"linear1": W1, "linear2": W1.T, "b": trainable["b"]}
        eye = jnp.eye(self.n_hidden, dtype=W1.dtype)
        p.update({f"hidden_{i}": eye for i in range(self.n_identity)})
        return {"~": p}

    def check(self, params: hk.Params, loss: float) -> str | None:
        """Learned when every feature has a direction of norm ≈ 1 (a broken seed drops some) and
        the MSE is below half of the all-zero model's `p · E[u²] = p / 3`."""
        norms = np.linalg.norm(np.asarray(params["~"]["linear1"]), axis=1)
        if not np.all(np.abs(norms - 1.0) < 0.25):
            return f"feature norms {np.round(norms, 3).tolist()} are not all within 0.25 of 1"
        bound = 0.5 * self.feature_prob / 3.0
        if loss >= bound:
            return f"final loss {loss:.3g} is not below {bound:.3g}"
        return None
