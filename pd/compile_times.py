"""Compile-time attribution: trace, lowering and backend-compile seconds of every named jit."""

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import jax

STAGES = {
    "/jax/core/compile/jaxpr_trace_duration": "trace_s",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
    "/jax/core/compile/backend_compile_duration": "compile_s",
}


class CompileTimes:
    """Seconds per jitted function name (e.g. `train_step`) and stage, summed over recompiles,
    and how many backend compiles (`compiles`: more than one is a program per shape or
    placement, or a recompile)."""

    def __init__(self) -> None:
        self.by_name: dict[str, dict[str, float]] = {}

    def add(self, name: str, stage: str, seconds: float) -> None:
        # jax names the trace event `f` and the compile events `jit(f)`: one row per function.
        name = name.removeprefix("jit(").removesuffix(")")
        row = self.by_name.setdefault(
            name, {"trace_s": 0.0, "lower_s": 0.0, "compile_s": 0.0, "compiles": 0}
        )
        row[stage] += seconds
        row["compiles"] += stage == "compile_s"

    def table(self, min_total_s: float = 0.05, written: str = "compile.json") -> str:
        """A console table, slowest first; functions under `min_total_s` are only counted (and
        found in the file `written`, where one is; "" when nothing is written)."""
        rows = sorted(self.by_name.items(), key=lambda kv: -_seconds(kv[1]))
        shown = [(n, r) for n, r in rows if _seconds(r) >= min_total_s]
        width = max([len(n) for n, _ in shown] + [8])
        lines = [f"{'jit':<{width}}  {'trace s':>8} {'lower s':>8} {'compile s':>9}"]
        for name, r in shown:
            lines.append(
                f"{name:<{width}}  {r['trace_s']:8.2f} {r['lower_s']:8.2f} {r['compile_s']:9.2f}"
            )
        if len(rows) > len(shown):
            where = f" in {written}" if written else ""
            lines.append(f"({len(rows) - len(shown)} more under {min_total_s} s{where})")
        return "\n".join(lines)

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.by_name, indent=2, sort_keys=True, allow_nan=False))


def _seconds(row: dict[str, float]) -> float:
    return sum(row[stage] for stage in STAGES.values())


_active: list[CompileTimes] = []
_lock = threading.Lock()
_registered = False


def _listen(event: str, duration_secs: float, **kwargs: str | int) -> None:
    stage = STAGES.get(event)
    if stage is None:
        return
    with _lock:
        for recorder in _active:
            recorder.add(str(kwargs.get("fun_name", "?")), stage, duration_secs)


@contextmanager
def recording() -> Iterator[CompileTimes]:
    """Record every compile inside the block (jax.monitoring has one global listener list)."""
    global _registered
    with _lock:
        if not _registered:
            jax.monitoring.register_event_duration_secs_listener(_listen)
            _registered = True
        recorder = CompileTimes()
        _active.append(recorder)
    try:
        yield recorder
    finally:
        with _lock:
            _active.remove(recorder)
