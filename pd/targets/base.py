"""The Target protocols: a frozen network whose chosen matmuls are decomposed sites."""

from collections.abc import Mapping
from typing import Literal, Protocol, runtime_checkable

import haiku as hk
import jax
from jaxtyping import Array, Float, Key, Shaped

from pd.decompose import FROZEN, Sites
from pd.sites import SiteTable

TrainParams = dict[str, Array]
# A batch: `[B, n_features]` floats for toys, `[B, T]` token ids for language models.
Batch = Shaped[Array, "B ..."]
# The output the divergence compares: `[B, n_out]` for toys, `[B, T, vocab]` logits for LMs.
Output = Float[Array, "B ..."]
# Clean-path activations by name, stacked over the layers: `in.{kind}` is `[n_layers, *L, d_in]`
# (each site's input), language models add `resid`, `[n_layers + 1, B, T, d_model]`.
Taps = dict[str, Float[Array, "_n B ..."]]
LayerTaps = dict[str, Float[Array, "B ..."]]  # one layer's taps, inside a target's layer scan
Divergence = Literal["mse", "kl"]
# The logical axes (pd.shard's rules) of every frozen parameter, shaped like the params; and
# the params or their shapes, which is all the axes are computed from.
FrozenAxes = dict[str, dict[str, tuple[str | None, ...]]]
FrozenShapes = Mapping[str, Mapping[str, Array | jax.ShapeDtypeStruct]]


class TargetBase:
    """What pd's targets share: `forward` and `taps` from one `apply` (output and taps
    together), and the MSE divergence unless a target says otherwise."""

    @property
    def divergence(self) -> Divergence:
        return "mse"

    @property
    def adds_into(self) -> bool:
        """Whether `resume` takes `sites.into` (see `Target.adds_into`)."""
        return False

    def apply(self, params: hk.Params, x: Batch, sites: Sites) -> tuple[Output, Taps]:
        raise NotImplementedError

    def logit_directions(
        self, params: hk.Params, site: str, write: Float[Array, "A d_out"]
    ) -> Float[Array, "A vocab"] | None:
        """Rows written into the residual stream at `site`, read out as logits (see
        `Target.logit_directions`): None, a target without a vocabulary."""
        return None

    def frozen_axes(self, params: FrozenShapes) -> FrozenAxes:
        """The logical axes of the frozen parameters: none (replicated), unless a target says
        how its matrices are stored over a mesh."""
        return {m: {n: (None,) * leaf.ndim for n, leaf in p.items()} for m, p in params.items()}

    def forward(self, params: hk.Params, x: Batch, sites: Sites) -> Output:
        return self.apply(params, x, sites)[0]

    def taps(self, params: hk.Params, x: Batch) -> tuple[Taps, Output]:
        """S4: the clean-path activations (every site on its frozen path), and the output."""
        output, taps = self.apply(params, x, FROZEN)
        return taps, output

    def resume(self, params: hk.Params, x: Batch, taps: Taps, sites: Sites) -> Output:
        """`forward`; a target may start it from the clean pass's `taps` instead (Target)."""
        del taps
        return self.forward(params, x, sites)


@runtime_checkable
class Target(Protocol):
    """What a decomposition needs of any target: sites, a forward that runs its layers as one
    body (a scan over layer-stacked weights) calling `sites.hook` per decomposed kind, taps."""

    @property
    def table(self) -> SiteTable: ...

    @property
    def divergence(self) -> Divergence:
        """The output divergence D(masked, clean) of SPEC §5."""
        ...

    @property
    def adds_into(self) -> bool:
        """Whether `resume`'s backward adds its sites' gradients into `sites.into`, a running
        gradient, in place (`pd.loops.scan_adding`); a target that says no is never given one."""
        ...

    def forward(self, params: hk.Params, x: Batch, sites: Sites) -> Output: ...

    def logit_directions(
        self, params: hk.Params, site: str, write: Float[Array, "A d_out"]
    ) -> Float[Array, "A vocab"] | None:
        """Each row of `write`, added to the residual stream by `site`, read out directly
        through the final norm's scale and the unembedding (the logit weights of sparse-
        autoencoder dashboards); None where the site does not write the residual stream."""
        ...

    def weights(self, params: hk.Params) -> dict[str, Float[Array, "_L _d_in _d_out"]]:
        """The frozen W of every decomposed kind, stacked over the target's layers."""
        ...

    def frozen_axes(self, params: FrozenShapes) -> FrozenAxes:
        """The logical axes of every frozen parameter (how a mesh stores it, SPEC §11)."""
        ...

    def taps(self, params: hk.Params, x: Batch) -> tuple[Taps, Output]:
        """S4: the clean-path activations a CI function may read, and the clean output."""
        ...

    def resume(self, params: hk.Params, x: Batch, taps: Taps, sites: Sites) -> Output:
        """`forward(params, x, sites)`, given the clean pass's `taps` of `x`: a target may start
        from them at its first layer with a decomposed site, skipping the frozen layers before
        it (equal up to float rounding)."""
        ...


@runtime_checkable
class ToyTarget(Target, Protocol):
    """A toy target with a known answer, trained in-process from its own data."""

    @property
    def n_features(self) -> int: ...

    @property
    def dense_sites(self) -> dict[str, int]:
        """Sites whose answer is k dense subcomponents (SPEC §13 dense CI error), by name."""
        ...

    @property
    def feature_sites(self) -> tuple[str, ...]:
        """Sites whose row j is feature j's known direction (MMCS / ML2R, SPEC §13)."""
        ...

    def sample(self, key: Key[Array, ""], batch_size: int) -> Float[Array, "B n_features"]: ...

    def label(self, x: Float[Array, "B n_features"]) -> Float[Array, "B n_out"]: ...

    def init_train(self, key: Key[Array, ""]) -> TrainParams: ...

    def expand(self, trainable: TrainParams) -> hk.Params: ...

    def check(self, params: hk.Params, loss: float) -> str | None: ...
