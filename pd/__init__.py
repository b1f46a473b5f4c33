"""pd: parameter decomposition (SPD / VPD) of neural networks in JAX + dm-haiku.

The public API is at the top: `pd.run` (decompose a target end to end), `pd.sweep` (many seeds
or settings as one program), `pd.load` (a finished run folder as a typed `pd.Decomposition`),
`pd.RunConfig` / `pd.load_config` (a config, checked when built), `pd.OwnTarget`,
`pd.haiku_target` and `pd.KnownAnswer` (a model of your own). `import pd` is cheap: each name
imports what it needs (jax, the training stack) on first use.
"""

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pd.targets.haiku_model import haiku_target
    from pd.train.config import RunConfig, load_config
    from pd.train.decomposition import Decomposition, load
    from pd.train.evaluate import KnownAnswer
    from pd.train.kinds import OwnTarget
    from pd.train.run import RunResult, run
    from pd.train.sweep import SweepSpec, sweep

# name → the module that defines it
_HOME = {
    "Decomposition": "pd.train.decomposition",
    "load": "pd.train.decomposition",
    "run": "pd.train.run",
    "RunResult": "pd.train.run",
    "RunConfig": "pd.train.config",
    "load_config": "pd.train.config",
    "OwnTarget": "pd.train.kinds",
    "KnownAnswer": "pd.train.evaluate",
    "sweep": "pd.train.sweep",
    "SweepSpec": "pd.train.sweep",
    "haiku_target": "pd.targets.haiku_model",
}


def __getattr__(name: str) -> object:
    if name in _HOME:
        return getattr(import_module(_HOME[name]), name)
    raise AttributeError(f"module 'pd' has no attribute {name!r}")


__all__ = [
    "Decomposition",
    "KnownAnswer",
    "OwnTarget",
    "RunConfig",
    "RunResult",
    "SweepSpec",
    "haiku_target",
    "load",
    "load_config",
    "run",
    "sweep",
]
