"""Hypothesis strategies for pd's structures: site tables, small targets and their batches.

    @given(site_tables())
    def test_a_property_of_tables(table: SiteTable) -> None: ...

    @given(st.data())
    def test_a_property_of_targets(data: st.DataObject) -> None:
        small = data.draw(mlp_targets() | tms_targets())
        x = data.draw(batches(small.d_in))

Sizes are drawn from a few fixed buckets: each new shape is a new compile of jitted code, so a
test compiles a handful of programs over all its examples.
"""

import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol, TypeVar, runtime_checkable

import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from jaxtyping import Array, Float

from pd.sites import SiteSpec, SiteTable
from pd.testing.targets import SmallTarget, mlp_target, tms_target

DIMS = (2, 4, 8)
WIDTHS = (4, 8)
CS = (1, 2, 3)
SIZES = (1, 4, 8)
SEEDS = st.integers(0, 2**31 - 1)
T = TypeVar("T")


@runtime_checkable
class Draw(Protocol):
    """`hypothesis.strategies.DrawFn`, runtime-checkable: under pd's test setup beartype checks
    every annotation of pd's modules, and it cannot check a protocol that is not."""

    def __call__(self, strategy: st.SearchStrategy[T], label: object = None) -> T: ...


def site_tables(
    *,
    max_kinds: int = 3,
    max_layers: int = 3,
    dims: Sequence[int] = DIMS,
    Cs: Sequence[int] = CS,
) -> st.SearchStrategy[SiteTable]:
    """Valid `SiteTable`s: 1 to `max_kinds` kinds `k0, k1, …`, each of one shape
    `(d_in, d_out, C)` from `dims` and `Cs` (kinds may share a shape, not a shape group) with
    a site `{kind}.{layer}` in each of a non-empty set of layers below 1 to `max_layers`; sites
    in canonical order (layer ascending, then kind); `depth` explicit or 0 (implied)."""

    @st.composite
    def table(draw: Draw) -> SiteTable:
        n_layers = draw(st.integers(1, max_layers))
        kinds = []
        for k in range(draw(st.integers(1, max_kinds))):
            d_in, d_out = draw(st.sampled_from(dims)), draw(st.sampled_from(dims))
            C = draw(st.sampled_from(Cs))
            layers = draw(st.sets(st.integers(0, n_layers - 1), min_size=1))
            kinds.append((f"k{k}", d_in, d_out, C, layers))
        depth = draw(st.sampled_from((0, n_layers)))
        with _random_kept():
            sites = tuple(
                SiteSpec(f"{kind}.{layer}", d_in, d_out, C, layer, kind)
                for layer in range(n_layers)
                for kind, d_in, d_out, C, layers in kinds
                if layer in layers
            )
            return SiteTable(sites, depth)

    return table()


def mlp_targets(
    *, max_hidden: int = 2, widths: Sequence[int] = WIDTHS, Cs: Sequence[int] = CS
) -> st.SearchStrategy[SmallTarget]:
    """Haiku MLPs (`mlp_target`): input width, 0 to `max_hidden` hidden widths and the output
    width from `widths`, a non-empty set of the `hk.Linear` modules decomposed with C from
    `Cs`, parameters from a drawn seed."""

    @st.composite
    def target(draw: Draw) -> SmallTarget:
        d_in = draw(st.sampled_from(widths))
        layers = [*draw(st.lists(st.sampled_from(widths), max_size=max_hidden))]
        layers.append(draw(st.sampled_from(widths)))
        decomposed = draw(st.sets(st.integers(0, len(layers) - 1), min_size=1))
        C = {i: draw(st.sampled_from(Cs)) for i in sorted(decomposed)}
        seed = draw(SEEDS)
        with _random_kept():
            return mlp_target(d_in, layers, C, seed)

    return target()


def tms_targets(
    *,
    features: Sequence[int] = (3, 5, 8),
    hidden: Sequence[int] = (2, 3),
    max_identity: int = 1,
    Cs: Sequence[int] = CS,
) -> st.SearchStrategy[SmallTarget]:
    """TMS models (`tms_target`): feature and hidden sizes from `features` and `hidden`, 0 to
    `max_identity` identity layers, one C from `Cs`, untrained parameters from a drawn seed."""

    @st.composite
    def target(draw: Draw) -> SmallTarget:
        n_features = draw(st.sampled_from(features))
        n_hidden = draw(st.sampled_from(hidden))
        n_identity = draw(st.integers(0, max_identity))
        C, seed = draw(st.sampled_from(Cs)), draw(SEEDS)
        with _random_kept():
            return tms_target(n_features, n_hidden, n_identity, C, seed)

    return target()


@contextmanager
def _random_kept() -> Iterator[None]:
    """The global `random` state as it was: beartype (pd's checks under pd's test setup) picks
    the container item it checks with it, and hypothesis refuses strategies that change it."""
    state = random.getstate()
    try:
        yield
    finally:
        random.setstate(state)


def batches(
    d_in: int, *, sizes: Sequence[int] = SIZES, bound: float = 4.0
) -> st.SearchStrategy[Float[Array, "B d_in"]]:
    """Float32 inputs `[B, d_in]`, `B` from `sizes`, every entry a finite float in
    `[-bound, bound]` (hypothesis favours edge values: zeros, the bounds, repeated rows)."""
    entries = st.floats(-bound, bound, width=32, allow_subnormal=False)

    def of_size(batch: int) -> st.SearchStrategy[np.ndarray]:
        return arrays(np.float32, (batch, d_in), elements=entries)

    return st.sampled_from(sizes).flatmap(of_size).map(jnp.asarray)
