"""Training: config, the jitted step, `run`, evaluation and the CLI."""

from pd.train.config import RunConfig, load_config
from pd.train.run import RunResult, run

__all__ = ["RunConfig", "RunResult", "load_config", "run"]
