"""The Target protocol: a frozen network whose chosen matmuls are decomposed sites."""

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import haiku as hk
from jaxtyping import Array, Float, Key

from pd.sites import SiteTable

# A target calls `site(name, x, W)` for every decomposed matmul `x @ W`; pd decides what runs.
SiteHook = Callable[
    [str, Float[Array, "*L d_in"], Float[Array, "d_in d_out"]], Float[Array, "*L d_out"]
]
TrainParams = dict[str, Array]


def frozen_site(
    name: str, x: Float[Array, "*L d_in"], W: Float[Array, "d_in d_out"]
) -> Float[Array, "*L d_out"]:
    """The frozen path `x @ W` (S2, S3)."""
    del name
    return x @ W


@runtime_checkable
class Target(Protocol):
    """A toy target: its sites, its haiku forward with a site hook, its data and its task."""

    @property
    def table(self) -> SiteTable: ...

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

    def forward(
        self, params: hk.Params, x: Float[Array, "B n_features"], site: SiteHook
    ) -> Float[Array, "B n_out"]: ...

    def weights(self, params: hk.Params) -> dict[str, Float[Array, "d_in d_out"]]: ...

    def sample(self, key: Key[Array, ""], batch_size: int) -> Float[Array, "B n_features"]: ...

    def label(self, x: Float[Array, "B n_features"]) -> Float[Array, "B n_out"]: ...

    def init_train(self, key: Key[Array, ""]) -> TrainParams: ...

    def expand(self, trainable: TrainParams) -> hk.Params: ...

    def check(self, params: hk.Params, loss: float) -> str | None: ...


def taps(
    target: Target, params: hk.Params, x: Float[Array, "B n_features"]
) -> tuple[dict[str, Float[Array, "B d_in"]], Float[Array, "B n_out"]]:
    """S4 (toys): each site's clean-path input keyed by site name, and the clean output (S3)."""
    seen: dict[str, Float[Array, "B d_in"]] = {}

    def record(
        name: str, h: Float[Array, "*L d_in"], W: Float[Array, "d_in d_out"]
    ) -> Float[Array, "*L d_out"]:
        seen[name] = h
        return h @ W

    clean = target.forward(params, x, record)
    return seen, clean
