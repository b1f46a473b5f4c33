"""`pd.load(run_dir)`: a trained decomposition as a typed object for downstream research code."""

from pd.train.decomposition import Decomposition, load

__all__ = ["Decomposition", "load"]
