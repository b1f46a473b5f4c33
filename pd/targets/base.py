"""The Target protocols: a frozen network whose chosen matmuls are decomposed sites."""

from collections.abc import Callable
from typing import Literal, Protocol, runtime_checkable

import haiku as hk
from jaxtyping import Array, Float, Key, Shaped

from pd.sites import SiteTable

# A target calls `site(name, x, W)` for every decomposed matmul `x @ W`; pd decides what runs.
SiteHook = Callable[
    [str, Float[Array, "*L d_in"], Float[Array, "d_in d_out"]], Float[Array, "*L d_out"]
]
TrainParams = dict[str, Array]
# A batch: `[B, n_features]` floats for toys, `[B, T]` token ids for language models.
Batch = Shaped[Array, "B ..."]
# The output the divergence compares: `[B, n_out]` for toys, `[B, T, vocab]` logits for LMs.
Output = Float[Array, "B ..."]
Taps = dict[str, Float[Array, "B ..."]]
Divergence = Literal["mse", "kl"]


def frozen_site(
    name: str, x: Float[Array, "*L d_in"], W: Float[Array, "d_in d_out"]
) -> Float[Array, "*L d_out"]:
    """The frozen path `x @ W` (S2, S3)."""
    del name
    return x @ W


@runtime_checkable
class Target(Protocol):
    """What a decomposition needs of any target: sites, forward with a site hook, taps."""

    @property
    def table(self) -> SiteTable: ...

    @property
    def divergence(self) -> Divergence:
        """The output divergence D(masked, clean) of SPEC §5."""
        ...

    def forward(self, params: hk.Params, x: Batch, site: SiteHook) -> Output: ...

    def weights(self, params: hk.Params) -> dict[str, Float[Array, "d_in d_out"]]: ...

    def taps(self, params: hk.Params, x: Batch) -> tuple[Taps, Output]:
        """S4: every clean-path activation a CI function may read, by name, and the clean output.

        Site inputs are keyed by site name; other taps are target-specific (`resid.{i}`).
        """
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


def as_toy(target: Target) -> ToyTarget:
    """`target` as a toy target, or a TypeError naming what it is."""
    if not isinstance(target, ToyTarget):
        raise TypeError(f"{type(target).__name__} is not a toy target with a known answer")
    return target


def site_input_taps(
    forward: Callable[[hk.Params, Batch, SiteHook], Output], params: hk.Params, x: Batch
) -> tuple[Taps, Output]:
    """Each site's clean-path input keyed by site name, and the clean output (S3, S4)."""
    seen: Taps = {}

    def record(
        name: str, h: Float[Array, "*L d_in"], W: Float[Array, "d_in d_out"]
    ) -> Float[Array, "*L d_out"]:
        seen[name] = h
        return h @ W

    clean = forward(params, x, record)
    return seen, clean
