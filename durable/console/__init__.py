"""The operator's console: ``python -m durable console`` or ``worker --console HOST:PORT``.

Needs the ``console`` extra (``pip install 'durable-fenced[console]'``: Starlette and
Hypercorn). Importing this package imports neither: they load with the names below.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._app import create_app
    from ._serve import bind_socket, parse_bind, serve, url_of

from ._command import DEFAULT_BIND

__all__ = ["DEFAULT_BIND", "bind_socket", "create_app", "parse_bind", "serve", "url_of"]

_WHERE = {"create_app": "._app", "bind_socket": "._serve", "parse_bind": "._serve",
          "serve": "._serve", "url_of": "._serve"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
