"""Client for a git host shaped after the Bitbucket Cloud 2.0 API.

``lookup`` has three outcomes, because "could not look" is not "absent": a lookup that
hit 401, 403, 5xx or no answer at all once let a create go ahead on an auth error.
``create`` says whether it created the repository or found it already there; its result
refuses to be used as a bool, so it cannot be dropped into an ``if`` unread.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, NoReturn

import attrs
import httpx

from ._http import ApiTransport, delete, raise_for_status, segment, status_error
from .errors import ServiceError, StaleFencingTokenError
from .outcomes import DeleteOutcome

__all__ = [
    "CreateOutcome",
    "CreateResult",
    "GitHostClient",
    "Lookup",
    "LookupResult",
    "Repository",
]


class Lookup(enum.StrEnum):
    FOUND = "found"
    ABSENT = "absent"
    """404, and only 404."""
    UNKNOWN = "unknown"
    """Any other failure: 401, 403, 429, 5xx, timeout, connection error."""


class CreateOutcome(enum.StrEnum):
    CREATED = "created"
    ALREADY_EXISTED = "already_existed"


def _no_bool(self: object) -> NoReturn:
    raise TypeError(f"{type(self).__name__} has no truth value: compare its .outcome")


@attrs.frozen
class Repository:
    workspace: str
    slug: str
    full_name: str
    uuid: str | None
    mainbranch: str | None
    clone_links: Mapping[str, str] = attrs.field(eq=False, repr=False)
    """Clone URLs by name ("https", "ssh"; the fake host gives "file", a local path)."""
    description: str = attrs.field(default="", eq=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Repository:
        full_name = str(data["full_name"])
        workspace, _, slug = full_name.partition("/")
        links = data.get("links", {}).get("clone", [])
        mainbranch = data.get("mainbranch") or {}
        return cls(
            workspace=str(data.get("workspace", {}).get("slug", workspace)),
            slug=str(data.get("slug", slug)),
            full_name=full_name,
            uuid=data.get("uuid"),
            mainbranch=mainbranch.get("name"),
            clone_links={str(link["name"]): str(link["href"]) for link in links},
            description=str(data.get("description") or ""),
        )

    def clone_url(self, name: str | None = None) -> str:
        """The clone URL called ``name``, or the first one; ``KeyError`` if none."""
        if name is not None:
            return self.clone_links[name]
        for url in self.clone_links.values():
            return url
        raise KeyError("repository has no clone links")


@attrs.frozen
class LookupResult:
    outcome: Lookup
    repository: Repository | None = None
    """Set when FOUND."""
    error: ServiceError | None = attrs.field(default=None, eq=False)
    """Set when UNKNOWN: why we could not tell (``RetryLaterError`` has ``retry_after``)."""

    __bool__ = _no_bool

    @property
    def detail(self) -> str:
        if self.error is not None:
            return str(self.error)
        return self.outcome.value


@attrs.frozen
class CreateResult:
    outcome: CreateOutcome
    repository: Repository | None = None
    """The new repository when CREATED; None when it ALREADY_EXISTED (409)."""

    __bool__ = _no_bool


class GitHostClient:
    """Repositories on a Bitbucket-like host. ``http`` is injected and not closed here."""

    def __init__(self, http: httpx.AsyncClient, base_url: str, token: str) -> None:
        self._api = ApiTransport(http, base_url, token)

    def __repr__(self) -> str:
        return f"GitHostClient(base_url={self._api.base_url!r})"

    @staticmethod
    def _path(workspace: str, slug: str) -> str:
        return f"/2.0/repositories/{segment(workspace)}/{segment(slug)}"

    async def lookup(self, workspace: str, slug: str) -> LookupResult:
        """FOUND, ABSENT (404 only) or UNKNOWN (with the error).

        Raises only ``StaleFencingTokenError``: being fenced out says nothing about the
        repository, and this attempt must stop.
        """
        try:
            response = await self._api.request("GET", self._path(workspace, slug))
        except ServiceError as exc:
            return LookupResult(Lookup.UNKNOWN, error=exc)
        if response.status_code == 404:
            return LookupResult(Lookup.ABSENT)
        if not response.is_success:
            error = status_error(response)
            if isinstance(error, StaleFencingTokenError):
                raise error
            return LookupResult(Lookup.UNKNOWN, error=error)
        try:
            repository = Repository.from_json(response.json())
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            error = ServiceError(
                response.status_code,
                "GET",
                str(response.request.url),
                f"unreadable repository JSON: {exc!r}",
            )
            return LookupResult(Lookup.UNKNOWN, error=error)
        return LookupResult(Lookup.FOUND, repository)

    async def create(
        self,
        workspace: str,
        slug: str,
        *,
        is_private: bool = True,
        description: str | None = None,
        project_key: str | None = None,
    ) -> CreateResult:
        """CREATED, or ALREADY_EXISTED on 409; any other failure raises ``ServiceError``."""
        body: dict[str, Any] = {"scm": "git", "is_private": is_private}
        if description is not None:
            body["description"] = description
        if project_key is not None:
            body["project"] = {"key": project_key}
        response = await self._api.request("POST", self._path(workspace, slug), json_body=body)
        if response.status_code == 409:
            error = status_error(response)
            if isinstance(error, StaleFencingTokenError):
                raise error
            return CreateResult(CreateOutcome.ALREADY_EXISTED)
        raise_for_status(response)
        return CreateResult(CreateOutcome.CREATED, Repository.from_json(response.json()))

    async def delete(self, workspace: str, slug: str) -> DeleteOutcome:
        """Delete by ``slug``, or by the repository's uuid in braces (``{...}``), which
        Bitbucket accepts in its place and which names one repository for good."""
        return await delete(self._api, self._path(workspace, slug))
