"""The operator's console: ``python -m durable console`` or ``worker --console HOST:PORT``.

Needs the ``console`` extra (``pip install 'durable-fenced[console]'``: Starlette and
Hypercorn).
"""

from __future__ import annotations

from ._app import create_app
from ._serve import DEFAULT_BIND, bind_socket, parse_bind, serve, url_of

__all__ = ["DEFAULT_BIND", "bind_socket", "create_app", "parse_bind", "serve", "url_of"]
