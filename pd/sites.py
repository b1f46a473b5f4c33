"""Site specifications and the static table that maps sites onto stacked storage."""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from jaxtyping import Array, Shaped

T = TypeVar("T")


def _slots(groups: "Sequence[ShapeGroup | CGroup]") -> dict[str, tuple[int, int]]:
    return {n: (g, j) for g, grp in enumerate(groups) for j, n in enumerate(grp.names)}


@dataclass(frozen=True)
class SiteSpec:
    """One decomposed weight matrix `W: [d_in, d_out]` with `C` rank-1 subcomponents."""

    name: str
    d_in: int
    d_out: int
    C: int

    def __post_init__(self) -> None:
        for attr in ("d_in", "d_out", "C"):
            value = getattr(self, attr)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(
                    f"site {self.name!r}: {attr} is {value!r}, expected a positive integer"
                )


@dataclass(frozen=True)
class ShapeGroup:
    """All sites with equal `(d_in, d_out, C)`, stored stacked in canonical order."""

    d_in: int
    d_out: int
    C: int
    names: tuple[str, ...]


@dataclass(frozen=True)
class CGroup:
    """All sites with equal C; persistent sources are stored stacked per C group."""

    C: int
    names: tuple[str, ...]


@dataclass(frozen=True)
class SiteTable:
    """Canonical site order, shape groups and the name → (group, slot) map (SPEC §2)."""

    sites: tuple[SiteSpec, ...]
    groups: tuple[ShapeGroup, ...] = field(init=False)
    c_groups: tuple[CGroup, ...] = field(init=False)
    _where: dict[str, tuple[int, int]] = field(init=False, repr=False, compare=False)
    _c_where: dict[str, tuple[int, int]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [s.name for s in self.sites]
        if len(set(names)) != len(names):
            raise ValueError(f"site names must be unique, got {names}")
        keys: dict[tuple[int, int, int], list[str]] = {}
        for s in self.sites:
            keys.setdefault((s.d_in, s.d_out, s.C), []).append(s.name)
        groups = tuple(ShapeGroup(d, o, c, tuple(ns)) for (d, o, c), ns in keys.items())
        by_c: dict[int, list[str]] = {}
        for s in self.sites:
            by_c.setdefault(s.C, []).append(s.name)
        c_groups = tuple(CGroup(c, tuple(ns)) for c, ns in by_c.items())
        object.__setattr__(self, "groups", groups)
        object.__setattr__(self, "c_groups", c_groups)
        object.__setattr__(self, "_where", _slots(groups))
        object.__setattr__(self, "_c_where", _slots(c_groups))

    def __hash__(self) -> int:
        return hash(self.sites)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.sites)

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

    def view(self, stacked: tuple[Shaped[Array, "_n ..."], ...], name: str) -> Shaped[Array, "..."]:
        """The slice of a per-group stacked array that belongs to one site."""
        g, j = self.where(name)
        return stacked[g][j]

    def views(
        self, stacked: tuple[Shaped[Array, "_n ..."], ...]
    ) -> dict[str, Shaped[Array, "..."]]:
        """`{site: array}` view of per-group stacked storage (canonical order)."""
        return {n: self.view(stacked, n) for n in self.names}

    def per_group(self, per_site: dict[str, T]) -> tuple[list[T], ...]:
        """Regroup a `{site: value}` dict into per-group lists in slot order."""
        return tuple([per_site[n] for n in grp.names] for grp in self.groups)
