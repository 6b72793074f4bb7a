"""Logging as a library does it: the standard ``logging`` module, structured, never secrets.

The engine logs under the ``durable`` logger (``durable.worker``, ``durable.attempt``,
``durable.client``), which has a :class:`logging.NullHandler` and no level of its own: an
application that embeds a client or a worker sees nothing until it configures ``logging``, and
then sees durable's records wherever its own go.

Every record is structured. Its message is a stable event name (``step_failed``) and its
fields (the run's ``workflow_id``, ``workflow``, ``attempt``, ``epoch``, a step's ``step``...)
travel on the record as ``record.event`` and ``record.fields`` (a dict); ``getMessage()``
renders ``event key=value ...`` so a plain handler shows them. Fields, message and traceback
are redacted of credentials *before* the record is emitted, whoever handles it; an
application can put :class:`RedactingFilter` on its own handlers for other loggers' records.

:func:`configure_logging` is the command line's rendering (console or JSON lines on stderr,
with structlog's renderers): one handler on the ``durable`` logger, and one on each driver's
logger (psycopg's) that hands their warnings to it as structured records; no level is set
outside ``durable``.

A worker's loop that fails again and again (the store unreachable for an hour) logs through
:class:`Repeats`: the first failure, one line a minute while it lasts, and its end.
"""

from __future__ import annotations

import logging
import re
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import IO, Any

from ._types import UNSTORABLE

_AUTH_SCHEMES = ("bearer|basic|token|digest|negotiate|ntlm|bot|apikey|hoba|mutual"
                 "|aws4-hmac-sha256")
_SECRET_PATTERNS = [
    # a bearer token, Coolify's ``<id>|<token>`` form included
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=|-]+"), r"\1 [redacted]"),
    # ``token=``, ``api_key:``, ``xi-api-key:`` (ElevenLabs), ``x-api-key:``, ``password=``,
    # and the names that end so: ``PGPASSWORD=``, ``GITHUB_TOKEN=``, ``client_secret=``...
    (re.compile(r"(?i)\b(\w*?(?:token|api[_-]?key|secret|passw(?:or)?d|private[_-]?key))"
                r"([\"']?\s*[:=]\s*[\"']?)[^\s\"',})&]+"), r"\1\2[redacted]"),
    # ``Authorization: <scheme> <credentials>`` or ``Authorization: <credentials>``: the
    # scheme word is taken only when it is an auth scheme, so the next word of the text stays
    (re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?)"
                rf"(?:(?:{_AUTH_SCHEMES})\s+)?[^'\",}}\s)]+"),
     r"\1[redacted]"),
    # a query's credential, a signed URL's signature (S3's X-Amz-Signature, Azure's sig)
    (re.compile(r"(?i)([?&](?:token|access_token|api_key|apikey|key|password|secret"
                r"|(?:x-amz-)?signature|sig|x-amz-credential|x-amz-security-token)=)"
                r"[^&\s'\"]+"),
     r"\1[redacted]"),
    # a password already masked as *** (the stores' own URLs) is left as it is
    (re.compile(r"(?i)(://[^:/@\s]+:)(?!\*+@)[^@/\s]+@"), r"\1[redacted]@"),
]
# a field or ``extra`` key that names a credential (``authorization``, ``api_token``,
# ``client_secret``, ``db_password``...) is blanked whatever its value
_SECRET_KEY = re.compile(r"(?i)(?:.*[_-])?(?:authorization|token|password|passwd|secret|api[_-]?key"
                         r"|headers|cookie|credentials?)")
_REDACTED = "[redacted]"
ROOT = "durable"

logging.getLogger(ROOT).addHandler(logging.NullHandler())


# Every pattern above needs one of these words (or the ``@`` of a URL's credentials): a
# text without any is returned as it is after one scan instead of five (the console redacts
# every string of every page).
_MAY_HOLD_A_SECRET = re.compile(
    r"(?i)bearer|basic|token|key|secret|passw|authorization|@|[?&](?:x-amz-)?sig")


def redact(text: str) -> str:
    """Remove credentials (bearer tokens, Authorization values, API keys, URL passwords)
    from text."""
    if not _MAY_HOLD_A_SECRET.search(text):
        return text
    for pattern, replacement in _SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def storable(text: str) -> str:
    """``text`` with the characters no store can hold (:data:`durable._types.UNSTORABLE`: a
    NUL, a lone surrogate) replaced by U+FFFD. An error quoting a service's binary answer
    would otherwise fail the write that ends its run."""
    return UNSTORABLE.sub("\ufffd", text)


def redact_json(value: Any) -> Any:
    """A JSON value with every string in it redacted (keys kept): for summaries and
    results that are journaled or shown."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {k: redact_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_json(v) for v in value]
    return value


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, Mapping):
        return redact_fields(value)
    if isinstance(value, list | tuple):
        return [_redact_value(v) for v in value]
    return redact(str(value))  # anything else is rendered as text: redact that text


def redact_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``fields`` with secret-named keys blanked and every text redacted."""
    return {
        str(key): _REDACTED if _SECRET_KEY.fullmatch(str(key)) else _redact_value(value)
        for key, value in fields.items()
    }


_PLAIN = re.compile(r"[^\s\"'=]+")


def _render_value(value: Any) -> str:
    if isinstance(value, str) and _PLAIN.fullmatch(value):
        return value
    return repr(value)


def render_message(event: str, fields: Mapping[str, Any]) -> str:
    """``event key=value ...``: the message a plain ``logging`` handler shows."""
    return " ".join([event, *(f"{k}={_render_value(v)}" for k, v in fields.items())])


def _redacted_traceback(exc_info: Any) -> str:
    return redact("".join(traceback.format_exception(*exc_info)).rstrip("\n"))


class Logger:
    """A ``logging.Logger`` with bound fields: ``log.bind(step=3).info("step_completed")``.

    Each call emits one record whose message is the event, with the fields (bound, then the
    call's) redacted on ``record.fields``. A traceback (``exception()``, ``exc_info=True``)
    is formatted and redacted into ``record.exc_text``; ``record.exc_info`` stays empty, so
    no handler can render the unredacted exception.
    """

    __slots__ = ("_bound", "_logger", "_more")

    def __init__(self, logger: logging.Logger, bound: Mapping[str, Any]) -> None:
        self._logger = logger
        self._bound = dict(bound)
        self._more: dict[str, Any] | None = None
        """Fields of the last :meth:`bind`, merged only when a record is emitted (a bind
        per step costs no merge while the level is off). Neither dict is ever changed."""

    @property
    def name(self) -> str:
        return self._logger.name

    def bind(self, **fields: Any) -> Logger:
        bound = Logger.__new__(Logger)
        bound._logger = self._logger
        bound._bound = self._bound if self._more is None else {**self._bound, **self._more}
        bound._more = fields
        return bound

    def debug(self, event: str, **fields: Any) -> None:
        self._log(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, event, fields)

    def critical(self, event: str, **fields: Any) -> None:
        self._log(logging.CRITICAL, event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """``error`` with the exception being handled."""
        fields.setdefault("exc_info", True)
        self._log(logging.ERROR, event, fields)

    def _log(self, level: int, event: str, call: dict[str, Any], depth: int = 2) -> None:
        """``depth``: the frames from here to the code the record names (its line)."""
        logger = self._logger
        if not logger.isEnabledFor(level):
            return
        exc_info = call.pop("exc_info", None)
        if exc_info is True:
            exc_info = sys.exc_info()
        elif isinstance(exc_info, BaseException):
            exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
        more = self._more
        fields = redact_fields({**self._bound, **call} if more is None
                               else {**self._bound, **more, **call})
        caller = sys._getframe(depth)
        record = logger.makeRecord(
            logger.name, level, caller.f_code.co_filename, caller.f_lineno,
            render_message(redact(event), fields), (), None, caller.f_code.co_name,
            {"event": event, "fields": fields})
        if exc_info and exc_info[0] is not None:
            record.exc_text = _redacted_traceback(exc_info)
        logger.handle(record)


def get_logger(name: str = ROOT, **bound: Any) -> Logger:
    """The structured logger ``name`` (under ``durable``) with ``bound`` fields."""
    logger = _loggers.get(name)
    if logger is None:  # logging keeps every logger it made: the same object each time
        logger = _loggers[name] = logging.getLogger(name)
    return Logger(logger, bound)


_loggers: dict[str, logging.Logger] = {}
"""``logging.getLogger`` by name, without its lock (an attempt's logger is made per run)."""


REPEAT_EVERY = 60.0
"""Seconds between two lines of a failure that goes on (:class:`Repeats`)."""


class Repeats:
    """A loop's failures (``claim_failed``...) logged so that a lasting outage is a few
    lines, not one per try.

    The first failure of a streak is logged at once, with ``failures=1``. An error is
    logged again only ``every`` seconds after its last line (the same text: a server that
    refuses, then times out, then refuses again is two texts, each once a minute), with
    ``failures`` (of the streak so far), ``failing_for`` (seconds since the streak began)
    and ``unlogged`` (the failures not logged since the last line). The first success after
    failures logs ``<name>_recovered`` at info level (``claim_failed`` → ``claim_recovered``)
    with the streak's ``failures`` and ``failing_for``. ``clock`` is monotonic seconds
    (injected by tests); ``frames``, the frames between the code a line should name and
    :meth:`failed` (a helper's).
    """

    __slots__ = ("_clock", "_depth", "_every", "_level", "_log", "_said", "_shown", "event",
                 "failures", "recovered", "since")

    def __init__(self, log: Logger, event: str, *, level: int = logging.ERROR,
                 every: float = REPEAT_EVERY,
                 clock: Callable[[], float] = time.monotonic, frames: int = 0) -> None:
        if not event.endswith("_failed"):
            raise ValueError(f"a failure's event ends in _failed, not {event!r}")
        self._log = log
        self.event = event
        self.recovered = event.removesuffix("_failed") + "_recovered"
        self._level = level
        self._every = every
        self._clock = clock
        self.failures = 0
        """Failures of the streak going on (0: none)."""
        self.since = 0.0
        self._depth = 2 + frames
        self._shown: dict[str, float] = {}  # an error's text -> when its last line was
        self._said = 0  # the count at the last line

    def failed(self, error: BaseException | str, **fields: Any) -> None:
        """One more failure: logged if it begins a streak, is another error than the last
        line's, or ``every`` seconds passed since that line; counted otherwise."""
        now = self._clock()
        text = str(error)
        self.failures += 1
        if self.failures == 1:
            self.since = now
            self._shown.clear()
        else:
            shown = self._shown.get(text)
            if shown is not None and now - shown < self._every:
                return
        more: dict[str, Any] = {"failures": self.failures}
        if self.failures > 1:
            more["failing_for"] = round(now - self.since, 1)
            more["unlogged"] = self.failures - self._said - 1
        self._log._log(self._level, self.event, {"error": text, **fields, **more},
                       self._depth)
        if len(self._shown) >= 100:  # texts that name a run each: stay small
            self._shown.clear()
        self._shown[text], self._said = now, self.failures

    def succeeded(self, **fields: Any) -> tuple[int, float] | None:
        """A success: ends a streak of failures with one line, and returns its failures
        and seconds (None, and no line, if there were none)."""
        if not self.failures:
            return None
        failures, seconds = self.failures, self._clock() - self.since
        self._log._log(logging.INFO, self.recovered, {
            **fields, "failures": failures, "failing_for": round(seconds, 1)}, self._depth)
        self.failures = 0
        return failures, seconds


# standard LogRecord attributes: everything else on a record came from ``extra``
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "event", "fields"}


class RedactingFilter(logging.Filter):
    """Redact credentials from every record a handler (or logger) it is attached to sees.

    The message is rendered (``getMessage()``) and redacted, ``extra`` values and durable's
    ``record.fields`` are redacted (secret-named keys such as ``authorization`` blanked), and
    a traceback is formatted and redacted into ``record.exc_text`` (``exc_info`` is cleared).
    Records are changed in place, so handlers after this one see them redacted too::

        handler.addFilter(durable.RedactingFilter())
    """

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.getMessage())
        record.args = None
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            record.fields = redact_fields(fields)
        for key, value in list(vars(record).items()):
            if key in _RECORD_ATTRS:
                continue
            if _SECRET_KEY.fullmatch(key):
                setattr(record, key, _REDACTED)
            elif isinstance(value, str | Mapping | list | tuple):  # other objects are left
                setattr(record, key, _redact_value(value))          # as they are
        if record.exc_info and record.exc_info[0] is not None:
            record.exc_text = _redacted_traceback(record.exc_info)
            record.exc_info = None
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def event_dict(record: logging.LogRecord) -> dict[str, Any]:
    """The structured view of a record: its fields, ``event``, ``level``, ``timestamp`` (UTC,
    ISO 8601) and ``exception`` (the redacted traceback) when it has one."""
    fields = getattr(record, "fields", None)
    out: dict[str, Any] = dict(fields) if isinstance(fields, Mapping) else {}
    event = getattr(record, "event", None)
    out["event"] = event if isinstance(event, str) else record.getMessage()
    out["level"] = record.levelname.lower()
    out["timestamp"] = (datetime.fromtimestamp(record.created, tz=UTC)
                        .isoformat().replace("+00:00", "Z"))
    if record.exc_text:
        out["exception"] = record.exc_text
    return out


class StructlogFormatter(logging.Formatter):
    """Renders a record's :func:`event_dict` with structlog's JSON or console renderer."""

    def __init__(self, *, json: bool = False, colors: bool = False) -> None:
        super().__init__()
        import structlog  # only the command line's rendering needs it

        self._renderer: Any = (structlog.processors.JSONRenderer() if json
                               else structlog.dev.ConsoleRenderer(colors=colors))

    def format(self, record: logging.LogRecord) -> str:
        rendered = self._renderer(None, record.levelname.lower(), event_dict(record))
        return str(rendered)


class _CliHandler(logging.StreamHandler[IO[str]]):
    """The handler :func:`configure_logging` installs (and replaces when called again)."""


FOREIGN = {"psycopg": "driver_message", "asyncio": "python_message",
           "py.warnings": "python_message"}
"""Other loggers whose records reach the command line's stderr, and the event each is
rendered as. The drivers the stores use (``psycopg``; ``psycopg.pool`` is under it): left
alone, their warnings reached stderr through ``logging``'s last resort as plain text of
several lines (a PostgreSQL outage: ``error connecting in 'durable:...'`` a few times a
second), between the command line's JSON lines. Python's own: asyncio's (``Task exception
was never retrieved``, with the task's error and traceback, when an activity leaves a task
that failed) and the warnings of :func:`warnings.warn` (captured into logging by
:func:`configure_logging`): plain text too, and not redacted (an error quoting a token went
to stderr as it was)."""

_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]+\b")


class _DriverHandler(logging.Handler):
    """Another logger's records as the command line's own (:data:`FOREIGN`): the structured
    ``event`` (``driver_message``) with the ``logger`` and its ``message`` on one line, redacted
    by the handler it hands them to; the same message again (object addresses aside) is
    shown once per ``every`` seconds at most, with how many were not shown meanwhile
    (``unlogged``)."""

    def __init__(self, target: logging.Handler, *, event: str = "driver_message",
                 every: float = REPEAT_EVERY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._target = target
        self._event = event
        self._every = every
        self._clock = clock
        self._seen: dict[tuple[str, str], list[float]] = {}  # -> [last shown, unshown]

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < self._target.level:  # the command line's --log-level
            return
        try:
            message = " ".join(record.getMessage().split())
            key = (record.name, _ADDRESS.sub("0x", message))
            now = self._clock()
            seen = self._seen.get(key)
            if seen is not None and now - seen[0] < self._every:
                seen[1] += 1
                return
            fields: dict[str, Any] = {"logger": record.name, "message": message}
            if seen is not None and seen[1]:
                fields["unlogged"] = int(seen[1])
            if len(self._seen) >= 1000:  # a driver's every message differs: stay small
                self._seen.clear()
            self._seen[key] = [now, 0]
            out = logging.makeLogRecord({
                "name": record.name, "levelno": record.levelno,
                "levelname": record.levelname, "created": record.created,
                "msg": render_message(self._event, fields), "args": None,
                "event": self._event, "fields": fields})
            if record.exc_info and record.exc_info[0] is not None:
                out.exc_text = _redacted_traceback(record.exc_info)
            self._target.handle(out)
        except Exception:  # a handler never raises into the code that logged
            self.handleError(record)


def configure_logging(*, json: bool = False, level: str = "info",
                      stream: IO[str] | None = None) -> logging.Handler:
    """Render durable's logs on ``stream`` (stderr): console (coloured on a terminal) or JSON
    lines, from ``level`` up. The warnings of the drivers the stores use (:data:`FOREIGN`)
    are rendered the same way, as ``driver_message``, a repeated one once a minute at most;
    so are Python's own (asyncio's errors, and warnings, which it captures into logging), as
    ``python_message``.
    Replaces the handlers of an earlier call, leaves every other handler alone, and sets no
    level outside the ``durable`` logger. Returns the handler.
    """
    out = sys.stderr if stream is None else stream
    number = logging.getLevelNamesMapping()[level.upper()]
    handler = _CliHandler(out)
    handler.setLevel(number)
    handler.setFormatter(StructlogFormatter(json=json, colors=not json and out.isatty()))
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger(ROOT)
    for old in [h for h in logger.handlers if isinstance(h, _CliHandler)]:
        logger.removeHandler(old)
        old.close()
    logger.addHandler(handler)
    logger.setLevel(number)
    logging.captureWarnings(True)  # warnings.warn: a record of py.warnings, not a print
    for name, event in FOREIGN.items():
        foreign = logging.getLogger(name)
        for gone in [h for h in foreign.handlers if isinstance(h, _DriverHandler)]:
            foreign.removeHandler(gone)
            gone.close()
        foreign.addHandler(_DriverHandler(handler, event=event))
    return handler
