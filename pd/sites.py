"""Site specifications and the static table that maps sites onto stacked storage."""

from collections.abc import Collection, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Shaped

K = TypeVar("K", bound=Hashable)
# Storage on the device or, fetched once (`jax.device_get`), on the host: slicing host arrays
# runs no device op (each eager op on a new shape is a compile).
HostOrDevice = TypeVar("HostOrDevice", Array, np.ndarray)


def take(arr: Shaped[Array, "n ..."], index: tuple[int, ...]) -> Shaped[Array, "m ..."]:
    """`arr[index]` along the leading axis: the array itself, a strided slice when the index
    steps evenly (no gather), else a gather."""
    if index == tuple(range(arr.shape[0])):
        return arr
    step = index[1] - index[0] if len(index) > 1 else 1
    if step > 0 and index == tuple(range(index[0], index[0] + step * len(index), step)):
        return arr[index[0] : index[-1] + 1 : step]
    return arr[jnp.asarray(index)]


def input_tap(kind: str) -> str:
    """The tap (SPEC §4) holding the clean-path inputs of a kind's sites, stacked over the
    layers: written by targets, read by the per-site CI functions."""
    return f"in.{kind}"


def output_tap(kind: str) -> str:
    """The tap holding the clean-path outputs `x @ W` of a kind's sites, stacked over the layers:
    a target may write it (the toys do), and the step's passes then reuse it where a site's
    input is clean (`pd.decompose.CleanProducts`)."""
    return f"out.{kind}"


def _slots(groups: "Sequence[ShapeGroup | CGroup]") -> dict[str, tuple[int, int]]:
    return {n: (g, j) for g, grp in enumerate(groups) for j, n in enumerate(grp.names)}


@dataclass(frozen=True)
class SiteSpec:
    """One decomposed weight matrix `W: [d_in, d_out]` with `C` rank-1 subcomponents.

    `layer` and `kind` place the site in its target: the target runs one body per layer (under
    a scan) and calls its site hook once per kind. A kind left empty is the site's name (a site
    of its own kind, in layer 0).
    """

    name: str
    d_in: int
    d_out: int
    C: int
    layer: int = 0
    kind: str = ""

    def __post_init__(self) -> None:
        for attr in ("d_in", "d_out", "C"):
            value = getattr(self, attr)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(
                    f"site {self.name!r}: {attr} is {value!r}, expected a positive integer"
                )
        if not isinstance(self.layer, int) or self.layer < 0:
            raise ValueError(
                f"site {self.name!r}: layer is {self.layer!r}, expected a non-negative integer"
            )
        if not self.kind:
            object.__setattr__(self, "kind", self.name)


@dataclass(frozen=True)
class KindLayout:
    """Where the sites of one kind live, layer by layer: shape group `group`, and per layer the
    slot in that group, the slot in the kind's C group and the canonical index (-1: the layer
    has no site of this kind)."""

    group: int
    c_group: int
    slots: tuple[int, ...]
    c_slots: tuple[int, ...]
    indices: tuple[int, ...]

    @property
    def present(self) -> tuple[bool, ...]:
        return tuple(i >= 0 for i in self.indices)


@dataclass(frozen=True)
class ShapeGroup:
    """All sites of one kind with equal `(d_in, d_out, C)`, stored stacked in canonical order.
    (Two kinds never share a group, even of one shape: a layer scan then reads each kind's
    stack as it is stored, where a shared group would be sliced into per-kind copies of the
    parameters, the CI, the sources and their gradients in every pass.)"""

    d_in: int
    d_out: int
    C: int
    names: tuple[str, ...]


@dataclass(frozen=True)
class CGroup:
    """All sites of one kind with equal C; persistent sources are stored stacked per C group."""

    C: int
    names: tuple[str, ...]


@dataclass(frozen=True)
class SiteTable:
    """Canonical site order, shape groups and the name → (group, slot) map (SPEC §2)."""

    sites: tuple[SiteSpec, ...]
    depth: int = 0  # the target's number of layers; 0: 1 + the deepest site's layer
    groups: tuple[ShapeGroup, ...] = field(init=False)
    c_groups: tuple[CGroup, ...] = field(init=False)
    _where: dict[str, tuple[int, int]] = field(init=False, repr=False, compare=False)
    _c_where: dict[str, tuple[int, int]] = field(init=False, repr=False, compare=False)
    _layouts: dict[str, KindLayout] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [s.name for s in self.sites]
        if len(set(names)) != len(names):
            raise ValueError(f"site names must be unique, got {names}")
        keys: dict[tuple[str, int, int, int], list[str]] = {}
        for s in self.sites:
            keys.setdefault((s.kind, s.d_in, s.d_out, s.C), []).append(s.name)
        groups = tuple(ShapeGroup(d, o, c, tuple(ns)) for (_, d, o, c), ns in keys.items())
        by_c: dict[tuple[str, int], list[str]] = {}
        for s in self.sites:
            by_c.setdefault((s.kind, s.C), []).append(s.name)
        c_groups = tuple(CGroup(c, tuple(ns)) for (_, c), ns in by_c.items())
        object.__setattr__(self, "groups", groups)
        object.__setattr__(self, "c_groups", c_groups)
        object.__setattr__(self, "_where", _slots(groups))
        object.__setattr__(self, "_c_where", _slots(c_groups))
        object.__setattr__(self, "_layouts", self._kind_layouts())

    def _kind_layouts(self) -> dict[str, KindLayout]:
        """Every kind's layout; a kind spans one shape group and has one site per layer."""
        n_layers = self.n_layers
        if any(s.layer >= n_layers for s in self.sites):
            raise ValueError(f"site layers must be below the depth {self.depth}")
        layouts: dict[str, KindLayout] = {}
        for kind in dict.fromkeys(s.kind for s in self.sites):
            members = [(i, s) for i, s in enumerate(self.sites) if s.kind == kind]
            groups = {self._where[s.name][0] for _, s in members}
            if len(groups) != 1:
                raise ValueError(
                    f"sites of kind {kind!r} have different (d_in, d_out, C), expected one shape"
                )
            layers = [s.layer for _, s in members]
            if len(set(layers)) != len(layers):
                raise ValueError(f"kind {kind!r} has two sites in one layer, expected one")
            slots, c_slots, indices = [-1] * n_layers, [-1] * n_layers, [-1] * n_layers
            for i, s in members:
                slots[s.layer] = self._where[s.name][1]
                c_slots[s.layer] = self._c_where[s.name][1]
                indices[s.layer] = i
            c_group = self._c_where[members[0][1].name][0]
            layouts[kind] = KindLayout(
                groups.pop(), c_group, tuple(slots), tuple(c_slots), tuple(indices)
            )
        return layouts

    def __hash__(self) -> int:
        return hash((self.sites, self.depth))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.sites)

    @property
    def group_order(self) -> tuple[str, ...]:
        """Site names in storage order: shape group by group, slot by slot."""
        return tuple(n for grp in self.groups for n in grp.names)

    @property
    def n_layers(self) -> int:
        """The layers a target's scan runs over (`depth`, or 1 + the deepest site's layer)."""
        return self.depth or 1 + max(s.layer for s in self.sites)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The decomposed kinds, in canonical order of first appearance."""
        return tuple(self._layouts)

    def layout(self, kind: str) -> KindLayout:
        return self._layouts[kind]

    def by_kind(
        self, stacked: tuple[Shaped[Array, "_n ..."], ...], kind: str, c_groups: bool = False
    ) -> Shaped[Array, "n_layers ..."]:
        """One kind's sites of per-group stacked storage, stacked per layer `[n_layers, ...]`.

        A layer without a site of this kind gets slot 0's value (the caller marks it not live).
        When the kind's slots step evenly through every layer (a model decomposed in all its
        layers) this is a slice, not a gather. The layers before the kind's first site hold
        that value without a gradient (a layer that is never live gets none): a pass that
        starts at the first decomposed layer (`Target.resume`) slices them off, and its
        backward then never forms their zero cotangent, a copy of the kind's whole stack.
        """
        lay = self._layouts[kind]
        g, slots = (lay.c_group, lay.c_slots) if c_groups else (lay.group, lay.slots)
        first = lay.present.index(True)
        rows = take(stacked[g], tuple(max(s, 0) for s in slots[first:]))
        if first == 0:
            return rows
        before = jax.lax.stop_gradient(stacked[g][:1])
        return jnp.concatenate([jnp.broadcast_to(before, (first, *rows.shape[1:])), rows])

    def present_layers(self, kind: str) -> tuple[int, ...]:
        """The layers that hold a site of `kind`, ascending."""
        return tuple(i for i, p in enumerate(self._layouts[kind].present) if p)

    def of_kind(
        self, stacked: tuple[Shaped[Array, "_n ..."], ...], kind: str
    ) -> Shaped[Array, "n_kind ..."]:
        """One kind's sites of per-group stacked storage, in layer order (present layers only)."""
        lay = self._layouts[kind]
        return take(stacked[lay.group], tuple(lay.slots[i] for i in self.present_layers(kind)))

    def live(self, names: Collection[str]) -> dict[str, Bool[Array, " n_layers"]]:
        """Per kind and layer, whether the site there is one of `names` (`layer_sites`'
        `live`)."""
        return {
            kind: jnp.asarray([i >= 0 and self.sites[i].name in names for i in lay.indices])
            for kind, lay in self._layouts.items()
        }

    def spec(self, name: str) -> SiteSpec:
        return self.sites[self.index(name)]

    def index(self, name: str) -> int:
        """Canonical position of a site (the `i` of the key tree, SPEC §9)."""
        for i, s in enumerate(self.sites):
            if s.name == name:
                return i
        raise KeyError(f"unknown site {name!r}; known sites: {', '.join(self.names)}")

    def where(self, name: str) -> tuple[int, int]:
        """(group, slot) of a site in the stacked storage."""
        if name not in self._where:
            raise KeyError(f"unknown site {name!r}; known sites: {', '.join(self.names)}")
        return self._where[name]

    def c_where(self, name: str) -> tuple[int, int]:
        """(C group, slot) of a site in the stacked source storage."""
        self.where(name)  # the same error for an unknown name
        return self._c_where[name]

    def group_indices(self, g: int) -> tuple[int, ...]:
        """Canonical indices of the sites of shape group `g`, in slot order."""
        return tuple(self.index(n) for n in self.groups[g].names)

    def c_group_indices(self, g: int) -> tuple[int, ...]:
        """Canonical indices of the sites of C group `g`, in slot order."""
        return tuple(self.index(n) for n in self.c_groups[g].names)

    def view(
        self, stacked: tuple[Shaped[HostOrDevice, "_n ..."], ...], name: str
    ) -> Shaped[HostOrDevice, "..."]:
        """The slice of a per-group stacked array that belongs to one site."""
        g, j = self.where(name)
        view: HostOrDevice = stacked[g][j]
        return view

    def views(
        self, stacked: tuple[Shaped[HostOrDevice, "_n ..."], ...]
    ) -> dict[str, Shaped[HostOrDevice, "..."]]:
        """`{site: array}` view of per-group stacked storage (canonical order): every site
        sliced now, a pytree for jitted code (`SiteViews` slices a site when it is read)."""
        return {n: self.view(stacked, n) for n in self.names}

    def gather_groups(
        self, stacks: Mapping[K, Shaped[Array, "_m ..."]], where: Mapping[str, tuple[K, int]]
    ) -> tuple[Shaped[Array, "_n ..."], ...]:
        """Per-group stacked storage from arrays stacked under other keys: site s is
        `stacks[k][i]` for `(k, i) = where[s]`. A group that is one whole stack in order is that
        array itself; otherwise one gather per group (never a per-site op)."""
        out = []
        for grp in self.groups:
            keys = list(dict.fromkeys(where[n][0] for n in grp.names))
            sizes = [stacks[k].shape[0] for k in keys]
            offset = dict(zip(keys, np.cumsum([0, *sizes]).tolist(), strict=False))
            index = tuple(offset[where[n][0]] + where[n][1] for n in grp.names)
            whole = (
                stacks[keys[0]] if len(keys) == 1 else jnp.concatenate([stacks[k] for k in keys])
            )
            out.append(take(whole, index))
        return tuple(out)

    def from_kinds(
        self, per_kind: Mapping[str, Shaped[Array, "_L ..."]]
    ) -> tuple[Shaped[Array, "_n ..."], ...]:
        """Per-group storage from per-kind arrays stacked over the layers (`by_kind`'s inverse)."""
        return self.gather_groups(per_kind, {s.name: (s.kind, s.layer) for s in self.sites})


class SiteViews(Mapping[str, Array]):
    """`{site: array}` over per-group stacked storage, a site's slice taken when it is read: a
    `SiteTable.views` dict slices (copies) every site to read one."""

    def __init__(self, table: SiteTable, stacked: tuple[Array, ...]) -> None:
        self._table, self._stacked = table, stacked

    def __getitem__(self, name: str) -> Array:
        view: Array = self._table.view(self._stacked, name)
        return view

    def __contains__(self, name: object) -> bool:
        return name in self._table.names

    def __iter__(self) -> Iterator[str]:
        return iter(self._table.names)

    def __len__(self) -> int:
        return len(self._table.names)
