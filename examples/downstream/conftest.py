"""A downstream project's top conftest.py: pd's test setup (CPU with 4 simulated devices,
jaxtyping + beartype checks of pd, the `ci` and `dev` hypothesis profiles, the `tiny_target`
fixture) from pd's pytest plugin. Import pd inside tests, not here: the plugin's shape checks
cover the pd modules imported after it."""

pytest_plugins = ["pd.testing.plugin"]
