"""Test setup: pd's pytest plugin, the one downstream projects use (`pd/testing/plugin.py`):
CPU only with 4 simulated devices, jaxtyping + beartype checks of pd at trace time, the `ci`
and `dev` hypothesis profiles and a private target cache.

pd is imported lazily by the tests themselves: the plugin's jaxtyping import hook instruments
only the pd modules imported after it.
"""

pytest_plugins = ["pd.testing.plugin"]
