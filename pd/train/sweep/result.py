"""What a sweep leaves behind: each member's result, the table, `sweep.json`."""

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import haiku as hk
import numpy as np

from pd.compile_times import CompileTimes
from pd.state import TrainState
from pd.train.compare import compare
from pd.train.config import ConfigError
from pd.train.decomposition import load
from pd.train.folder import RunFolder
from pd.train.results import WIDEST
from pd.train.sweep.spec import Member

# The TMS verdict of tests/test_convergence.py, generalised: every site's CI error is 0.
VERDICT_KEYS = ("identity_ci_error_0.1/", "dense_ci_error_0.1/")


def recovered(summary: dict[str, float]) -> bool | None:
    """Every site's identity (or dense) CI error at tol 0.1 is 0 in a run's `summary`; None
    without a known answer."""
    errors = [v for k, v in summary.items() if k.startswith(VERDICT_KEYS)]
    return all(e == 0.0 for e in errors) if errors else None


# The table's metric families, in its order, and their short heads.
_FAMILIES = (
    "identity_ci_error_0.1/",
    "dense_ci_error_0.1/",
    "mmcs/",
    "mse/ci_masked",
    "kl/ci_masked",
    "ce/ci_masked",
    "layer_ci_l0_over_alive/",
    "ci_l0/",
)
_SHORT = {
    "identity_ci_error_0.1": "id_err",
    "dense_ci_error_0.1": "dense_err",
    "layer_ci_l0_over_alive": "layer_l0/alive",
}


@dataclass(frozen=True)
class _Column:
    """A column of the sweep's table: one summary key, or the `reduce` of several."""

    head: str
    keys: tuple[str, ...]
    reduce: Callable[[list[float]], float] = max

    def value(self, summary: dict[str, float]) -> float | None:
        values = [summary[k] for k in self.keys if k in summary]
        return self.reduce(values) if values else None


def _columns(family: str, summaries: list[dict[str, float]]) -> list[_Column]:
    """The columns of `family`: one per key of any member's summary, or its minimum and maximum
    where it has more than `WIDEST` keys (a whole model's 210 sites)."""
    keys = sorted({k for s in summaries for k in s if k.startswith(family)})
    name, _, _ = family.partition("/")
    short = _SHORT.get(name, name)
    if len(keys) > WIDEST:
        return [_Column(f"{short} {r.__name__}", tuple(keys), r) for r in (min, max)]
    return [_Column(k.replace(name, short, 1), (k,)) for k in keys]


@dataclass(frozen=True)
class MemberResult:
    """What one member leaves behind: its folder (None when it diverged), summary and state."""

    member: Member
    run_dir: Path | None
    summary: dict[str, float]
    state: TrainState
    frozen: hk.Params
    diverged: str = ""  # the sentence a single run would have stopped with
    # Seed consistency with the sweep's first finished member of the same target: the mean
    # over sites of the mean best |cosine| (`pd.train.compare`); None for that member itself,
    # a diverged one, or one of another target.
    consistency: float | None = None

    @property
    def recovered(self) -> bool | None:
        """`recovered(summary)`; False when the member diverged."""
        return False if self.diverged else recovered(self.summary)


@dataclass(frozen=True)
class SweepResult:
    """A finished sweep: its folder, every member's result, the compile times and wall time."""

    sweep_dir: Path
    members: tuple[MemberResult, ...]
    compile_times: CompileTimes
    wall_s: float

    @property
    def n_recovered(self) -> int:
        return sum(m.recovered is True for m in self.members)

    def table(self) -> str:
        """One row per member: recovered, seed consistency with the first member (`vs first`), CI
        errors, MMCS, the divergence under CI masks (targets evaluated by
        `pd.train.evaluate_masks`: a caller's own, language models), for language models the
        CE under CI masks and CI-L0 per alive subcomponent of each layer, CI-L0; then the count
        recovered. A family of more than `WIDEST` sites or layers is its minimum and maximum."""
        summaries = [m.summary for m in self.members]
        columns = [c for family in _FAMILIES for c in _columns(family, summaries)]
        widths = [max(len(c.head), 7) for c in columns]
        width = max(len(m.member.name) for m in self.members)
        head = f"{'member':<{width}}  {'recovered':<9}  {'vs first':>8}  " + "  ".join(
            f"{c.head:>{w}}" for c, w in zip(columns, widths, strict=True)
        )
        lines = [head]
        verdicts = {True: "yes", False: "no", None: "-"}
        for m in self.members:
            values = [c.value(m.summary) for c in columns]
            cells = [
                f"{'-' if v is None else format(v, '.4g'):>{w}}"
                for v, w in zip(values, widths, strict=True)
            ]
            text = "  ".join(cells) if not m.diverged else m.diverged
            vs = "-" if m.consistency is None else f"{m.consistency:.4f}"
            lines.append(f"{m.member.name:<{width}}  {verdicts[m.recovered]:<9}  {vs:>8}  {text}")
        judged = [m for m in self.members if m.recovered is not None]
        if judged:
            lines.append(
                f"recovered: {self.n_recovered} of {len(self.members)} members (CI error 0 on "
                "every site at tol 0.1)"
            )
        lines.append(f"wall time {self.wall_s:.1f} s for {len(self.members)} members")
        return "\n".join(lines)


def with_consistency(result: SweepResult, tmp_dir: Path) -> SweepResult:
    """`result` with each finished member's seed consistency with the first finished member of
    the same target, read back from the members' folders in `tmp_dir` (unchanged where they
    cannot be loaded without the caller: a target given in Python)."""
    done = [m for m in result.members if m.run_dir is not None]
    if len(done) < 2:
        return result
    try:
        first = load(tmp_dir / done[0].member.name)
    except ConfigError:
        return result
    scores = {}
    for m in done[1:]:
        if m.member.config.target == done[0].member.config.target:
            sites = compare(first, load(tmp_dir / m.member.name)).sites.values()
            scores[m.member.name] = float(np.nanmean([s.mean for s in sites]))
    members = tuple(replace(m, consistency=scores.get(m.member.name)) for m in result.members)
    return replace(result, members=members)


def write_summary(result: SweepResult, tmp_dir: Path) -> None:
    """`sweep.json` (per member: seeds, verdict, summary) and every `compile.json`."""
    members = []
    for m in result.members:
        c = m.member.config
        target_seed = getattr(c.target, "seed", None)
        members.append(
            {
                "name": m.member.name,
                "seed": c.seed,
                "target_seed": target_seed,
                "recovered": m.recovered,
                "diverged": m.diverged,
                "consistency_with_first": m.consistency,
                "summary": m.summary,
            }
        )
    judged = [m for m in result.members if m.recovered is not None]
    record = {
        "members": members,
        "n_members": len(members),
        "n_recovered": result.n_recovered if judged else None,
        "wall_s": result.wall_s,
    }
    (tmp_dir / "sweep.json").write_text(json.dumps(record, indent=2, allow_nan=False))
    (tmp_dir / "sweep.txt").write_text(result.table() + "\n")
    result.compile_times.write(tmp_dir / "compile.json")
    for m in result.members:
        if m.run_dir is not None:  # the program the member was compiled into, shared
            result.compile_times.write(RunFolder(tmp_dir / m.member.name).compile_times)
