"""The version of durable (the distribution durable-fenced); pyproject.toml reads it."""

__version__ = "0.1.0"
