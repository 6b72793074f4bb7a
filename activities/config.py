"""Configuration of the durable activities, read from the environment at call time.

Every activity reads what it needs when it runs (not at import), so a worker picks up the
configuration of its own process, and a test can set it per test. Nothing here is ever
journaled or logged: activities pass URLs and tokens straight to the clients, and never
take a token as an argument or return one (arguments and results are journaled).

=========================  ==============================================================
variable                   meaning
=========================  ==============================================================
``DURABLE_PAAS_URL``       base URL of the PaaS (Coolify v4 shape), e.g. ``https://paas``
``DURABLE_PAAS_TOKEN``     its API token (bearer)
``DURABLE_GITHOST_URL``    base URL of the git host (Bitbucket 2.0 shape)
``DURABLE_GITHOST_TOKEN``  its API token (bearer); also sent to ``https`` clone URLs as an
                           ``Authorization`` header through git's environment, never argv
``DURABLE_TTS_URL``        base URL of the text-to-speech API (ElevenLabs shape)
``DURABLE_TTS_TOKEN``      its API token (bearer)
``DURABLE_AUDIO_DIR``      where generated audio files are written (``<job>/<item>.mp3``)
``DURABLE_NOTIFY_URL``     base URL of the webhook notifier (``POST /hooks/<hook>``)
``DURABLE_NOTIFY_TOKEN``   its token (bearer)
``DURABLE_NOTIFY_HOOK``    hook name (default ``slots``)
``DURABLE_GIT_TIMEOUT``    seconds a git clone or push may take before git (and whatever
                           it started: receive-pack, hooks) is killed (default 300)
``DURABLE_GIT_WORKDIR``    scratch directory for clones (default: the system's temp dir)
``DURABLE_CONSOLE_URL``    read by the worker (``--console-url``), not here: base URL of the
                           console, for the links in recovery reports
=========================  ==============================================================

A missing or malformed variable (a URL with a ``?query`` or ``#fragment`` too: a base URL
carries no credential, which would be journaled) raises :class:`MissingConfigError`, a
:class:`durable.NonRetryableError`: the step fails at once, before any request is sent,
with a message naming the variable (never its value).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs

import durable

from .errors import redact_url

__all__ = [
    "SERVICES",
    "MissingConfigError",
    "Service",
    "audio_dir",
    "check",
    "git_timeout",
    "git_workdir",
    "notify_hook",
    "service",
]

SERVICES: Mapping[str, tuple[str, str]] = {
    "paas": ("DURABLE_PAAS_URL", "DURABLE_PAAS_TOKEN"),
    "githost": ("DURABLE_GITHOST_URL", "DURABLE_GITHOST_TOKEN"),
    "tts": ("DURABLE_TTS_URL", "DURABLE_TTS_TOKEN"),
    "notify": ("DURABLE_NOTIFY_URL", "DURABLE_NOTIFY_TOKEN"),
}
"""Service name -> (URL variable, token variable)."""

DEFAULT_GIT_TIMEOUT = 300.0
DEFAULT_NOTIFY_HOOK = "slots"


class MissingConfigError(durable.NonRetryableError):
    """A configuration variable is missing or malformed; nothing was sent."""


@attrs.frozen
class Service:
    """Where a service is and how to authenticate; the token never shows in a repr."""

    name: str
    url: str
    token: str = attrs.field(repr=False)


def _get(name: str, env: Mapping[str, str] | None) -> str:
    return (os.environ if env is None else env).get(name, "").strip()


def service(name: str, env: Mapping[str, str] | None = None) -> Service:
    """The configuration of service ``name`` (see :data:`SERVICES`)."""
    try:
        url_var, token_var = SERVICES[name]
    except KeyError:
        raise MissingConfigError(
            f"unknown service {name!r}; known: {', '.join(sorted(SERVICES))}") from None
    url, token = _get(url_var, env), _get(token_var, env)
    missing = [var for var, value in ((url_var, url), (token_var, token)) if not value]
    if missing:
        raise MissingConfigError(
            f"{name} is not configured: set {' and '.join(missing)} in the worker's "
            "environment; nothing was sent")
    if not url.startswith(("http://", "https://")):
        raise MissingConfigError(f"{url_var} must be an http(s) URL")
    if "?" in url or "#" in url:
        # a credential in the query would be journaled (check's result) and in every error
        raise MissingConfigError(f"{url_var} must be a base URL, without a ?query or "
                                 f"#fragment (the token goes in {token_var})")
    return Service(name, url.rstrip("/"), token)


def audio_dir(env: Mapping[str, str] | None = None) -> Path:
    value = _get("DURABLE_AUDIO_DIR", env)
    if not value:
        raise MissingConfigError(
            "set DURABLE_AUDIO_DIR (where audio files are written); nothing was sent")
    return Path(value)


def notify_hook(env: Mapping[str, str] | None = None) -> str:
    return _get("DURABLE_NOTIFY_HOOK", env) or DEFAULT_NOTIFY_HOOK


def git_timeout(env: Mapping[str, str] | None = None) -> float:
    value = _get("DURABLE_GIT_TIMEOUT", env)
    if not value:
        return DEFAULT_GIT_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise MissingConfigError("DURABLE_GIT_TIMEOUT must be a positive number of seconds")
    return seconds


def git_workdir(env: Mapping[str, str] | None = None) -> Path | None:
    value = _get("DURABLE_GIT_WORKDIR", env)
    return Path(value) if value else None


def check(services: Iterable[str], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Validate the configuration of ``services`` at once; answers their URLs.

    ``"git"`` needs nothing beyond the git host; ``"tts"`` also needs the audio directory
    and ``"git"`` a valid timeout. Every problem is reported in one message.
    """
    urls: dict[str, str] = {}
    problems: list[str] = []
    for name in services:
        try:
            if name == "git":
                git_timeout(env)
                urls[name] = "git " + str(git_workdir(env) or "(temp dir)")
                continue
            urls[name] = redact_url(service(name, env).url)
            if name == "tts":
                audio_dir(env)
        except MissingConfigError as exc:
            problems.append(str(exc))
    if problems:
        raise MissingConfigError("; ".join(problems))
    return urls
