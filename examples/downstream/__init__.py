"""A downstream project's tests: a package, so that its conftest.py and pd's
tests/conftest.py are two modules to mypy and pytest."""
