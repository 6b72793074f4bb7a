"""The engine's storage boundary and its implementations."""

from ._base import SCHEMA_VERSION as SCHEMA_VERSION
from ._base import Store as Store
from ._url import store_from_url as store_from_url

__all__ = ["SCHEMA_VERSION", "Store", "store_from_url"]
