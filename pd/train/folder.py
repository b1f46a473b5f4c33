"""The names of what a run folder holds, in one place: code that reads or writes a run's file
asks `RunFolder` for its path."""

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunFolder:
    """A run's folder (finished, or the partial one it is written in) and its files."""

    path: Path

    @property
    def config(self) -> Path:
        """The config the run used (`config.json`), as `pd.load` reads it back."""
        return self.path / "config.json"

    @property
    def summary(self) -> Path:
        """The final evaluation's flat metrics."""
        return self.path / "summary.json"

    @property
    def evaluation(self) -> Path:
        """The summary as tables: one row per mask kind, one per layer (`pd.train.report`)."""
        return self.path / "evaluation.md"

    @property
    def decomposition(self) -> Path:
        """The trained V/U and CI parameters (`pd.train.arrays`)."""
        return self.path / "decomposition.npz"

    @property
    def frozen(self) -> Path:
        """The frozen target's parameters, with the fingerprint `pd.load` compares."""
        return self.path / "frozen.npz"

    @property
    def metrics(self) -> Path:
        """One JSON row per logged step (`pd.train.sinks`)."""
        return self.path / "metrics.jsonl"

    @property
    def tensorboard(self) -> Path:
        """TensorBoard's event files: `tensorboard --logdir` this folder."""
        return self.path / "tensorboard"

    @property
    def checkpoints(self) -> Path:
        """The train state's checkpoints, for resume (`pd.train.checkpoints`)."""
        return self.path / "checkpoints"

    @property
    def compile_times(self) -> Path:
        """The compile table of the run's programs."""
        return self.path / "compile.json"
