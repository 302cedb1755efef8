"""The distribution version (pyproject.toml's `version`), importable without the package's API."""

__version__ = "0.1.0"
