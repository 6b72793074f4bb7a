"""Structured logging: stable event names, bound run context, never secrets."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

_SECRET_PATTERNS = [
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+"), r"\1 [redacted]"),
    (re.compile(r"(?i)\b((?:access_|api_|auth_)?token|api_?key|secret|password)"
                r"([\"']?\s*[:=]\s*[\"']?)[^\s\"',}&]+"), r"\1\2[redacted]"),
    (re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?)[^'\",}\s]+(\s+[^'\",}\s]+)?"),
     r"\1[redacted]"),
    (re.compile(r"(?i)([?&](?:token|access_token|api_key|apikey|key|password|secret)=)[^&\s'\"]+"),
     r"\1[redacted]"),
    (re.compile(r"(?i)(://[^:/@\s]+:)[^@/\s]+@"), r"\1[redacted]@"),
]
_SECRET_KEYS = {"authorization", "token", "password", "secret", "api_key", "headers", "cookie"}


def redact(text: str) -> str:
    """Remove credentials (bearer tokens, Authorization values, URL passwords) from text."""
    for pattern, replacement in _SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def _redact_processor(
    _logger: Any, _name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    for key in list(event_dict):
        if key.lower() in _SECRET_KEYS:
            event_dict[key] = "[redacted]"
        elif isinstance(event_dict[key], str):
            event_dict[key] = redact(event_dict[key])
    return event_dict


def configure_logging(*, json: bool = False, level: str = "info") -> None:
    """Set up structlog for the worker and CLI: console (default) or JSON lines on stderr."""
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact_processor,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger(**bound: Any) -> Any:
    return structlog.get_logger("durable").bind(**bound)
