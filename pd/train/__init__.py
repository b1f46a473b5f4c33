"""Training: config, the jitted step, `run`, evaluation and the CLI."""

from pd.train.config import RunConfig, load_config
from pd.train.decomposition import Decomposition
from pd.train.evaluate import KnownAnswer
from pd.train.kinds import OwnTarget
from pd.train.run import RunResult, run

__all__ = [
    "Decomposition",
    "KnownAnswer",
    "OwnTarget",
    "RunConfig",
    "RunResult",
    "load_config",
    "run",
]
