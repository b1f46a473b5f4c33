"""Seed consistency: how much of one decomposition another one finds again.

For each alive subcomponent of run A, the largest |cosine| between its rank-1 matrix `V_c U_c`
and that of any alive subcomponent of run B at the same site, summarized per site by its mean
and minimum. The cosine is computed from the factors, never from the `d_in × d_out` matrices:
the Frobenius inner product of two outer products is `⟨a bᵀ, c dᵀ⟩ = (a·c)(b·d)` and the norm
of `a bᵀ` is `|a||b|`, so `cos(a bᵀ, c dᵀ) = cos(a, c) · cos(b, d)`.

    python -m pd.compare RUN_A RUN_B
"""

import argparse
import math
import sys
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from pd.train.config import ConfigError
from pd.train.decomposition import Decomposition, load


def rank_one_cosines(
    Va: Float[Array, "d_in Ca"],
    Ua: Float[Array, "Ca d_out"],
    Vb: Float[Array, "d_in Cb"],
    Ub: Float[Array, "Cb d_out"],
) -> Float[Array, "Ca Cb"]:
    """|cos| between every rank-1 matrix `V[:, c] U[c]` of one and `V[:, d] U[d]` of the other,
    from the factors (a zero factor has cosine 0 with everything)."""

    def unit(x: Float[Array, "..."], axis: int) -> Float[Array, "..."]:
        norm = jnp.linalg.norm(x, axis=axis, keepdims=True)
        return x / jnp.where(norm > 0, norm, 1.0)

    cos_v = unit(Va, 0).T @ unit(Vb, 0)
    cos_u = unit(Ua, 1) @ unit(Ub, 1).T
    return jnp.abs(cos_v * cos_u)


@dataclass(frozen=True)
class SiteMatch:
    """One site: for each alive subcomponent of A (`a`, indices into its C), its best |cosine|
    with an alive one of B (`b`, the index of that one in B's C)."""

    a: Int[np.ndarray, " n"]
    b: Int[np.ndarray, " n"]
    cosine: Float[np.ndarray, " n"]
    alive_b: int

    @property
    def mean(self) -> float:
        return float(np.mean(self.cosine)) if self.cosine.size else math.nan

    @property
    def min(self) -> float:
        return float(np.min(self.cosine)) if self.cosine.size else math.nan


@dataclass(frozen=True)
class Consistency:
    """Per site, how well B's alive subcomponents reproduce A's."""

    sites: dict[str, SiteMatch]

    def table(self) -> str:
        """One line per site: alive counts, mean and min best |cosine|."""
        width = max(len(s) for s in self.sites)
        lines = [f"{'site':<{width}}  alive A  alive B  mean |cos|  min |cos|"]
        for site, m in self.sites.items():
            counts = f"{m.a.size:>7}  {m.alive_b:>7}"
            lines.append(f"{site:<{width}}  {counts}  {m.mean:>10.4f}  {m.min:>9.4f}")
        return "\n".join(lines)


def site_match(
    Va: Float[Array, "d_in Ca"],
    Ua: Float[Array, "Ca d_out"],
    alive_a: Bool[np.ndarray, " Ca"],
    Vb: Float[Array, "d_in Cb"],
    Ub: Float[Array, "Cb d_out"],
    alive_b: Bool[np.ndarray, " Cb"],
) -> SiteMatch:
    """The best match in B of each alive subcomponent of A (cosine 0 where B has none alive)."""
    a, b = np.flatnonzero(alive_a), np.flatnonzero(alive_b)
    if not b.size:
        return SiteMatch(a, np.full(a.size, -1), np.zeros(a.size), 0)
    cos = np.asarray(rank_one_cosines(Va[:, a], Ua[a], Vb[:, b], Ub[b]))
    best = np.argmax(cos, axis=1)
    return SiteMatch(a, b[best], cos[np.arange(a.size), best], int(b.size))


def compare(a: Decomposition, b: Decomposition) -> Consistency:
    """How consistently B reproduces A's alive subcomponents, per site of A (B must have every
    site of A, with the same input and output widths)."""
    missing = [s for s in a.sites if s not in b.sites]
    if missing:
        raise ValueError(f"decomposition B has no site {missing[0]!r}, expected the sites of A")
    alive_a, alive_b = a.alive(), b.alive()
    Va, Ua, Vb, Ub = a.V, a.U, b.V, b.U
    sites = {}
    for s in a.sites:
        if (Va[s].shape[0], Ua[s].shape[1]) != (Vb[s].shape[0], Ub[s].shape[1]):
            raise ValueError(
                f"site {s!r} is {Va[s].shape[0]} → {Ua[s].shape[1]} in A but "
                f"{Vb[s].shape[0]} → {Ub[s].shape[1]} in B, expected the same matrix shape"
            )
        sites[s] = site_match(Va[s], Ua[s], alive_a[s], Vb[s], Ub[s], alive_b[s])
    return Consistency(sites)


def main(argv: list[str] | None = None) -> int:
    """`python -m pd.compare A B`: the per-site table; exit status 2 on a bad run folder."""
    parser = argparse.ArgumentParser(prog="python -m pd.compare", description=__doc__)
    parser.add_argument("run_a", help="a finished run folder")
    parser.add_argument("run_b", help="another run folder decomposing the same target")
    args = parser.parse_args(argv)
    try:
        result = compare(load(args.run_a), load(args.run_b))
    except (ConfigError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(result.table())
    return 0
