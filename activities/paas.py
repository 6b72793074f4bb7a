"""Client for a PaaS shaped after the Coolify v4 REST API (``/api/v1``).

Deletes answer :class:`~activities.outcomes.DeleteOutcome`: a 404 means the resource is
already gone, which is what the caller wanted. Reads answer ``None`` for 404 *only*; every
other failure raises a :class:`~activities.errors.ServiceError`, so "could not look" is
never mistaken for "absent".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import httpx

from ._http import ApiTransport, delete, raise_for_status, segment
from .outcomes import DeleteOutcome

__all__ = ["Application", "Database", "EnvVar", "PaasClient", "Storage"]


@attrs.frozen
class Application:
    uuid: str
    name: str
    status: str | None
    raw: Mapping[str, Any] = attrs.field(eq=False, repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Application:
        return cls(str(data["uuid"]), str(data.get("name", "")), data.get("status"), data)


@attrs.frozen
class Database:
    uuid: str
    name: str
    status: str | None
    raw: Mapping[str, Any] = attrs.field(eq=False, repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Database:
        return cls(str(data["uuid"]), str(data.get("name", "")), data.get("status"), data)


@attrs.frozen
class EnvVar:
    uuid: str
    key: str
    is_preview: bool = False
    value: str | None = attrs.field(default=None, repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EnvVar:
        return cls(
            str(data["uuid"]), str(data["key"]), bool(data.get("is_preview")), data.get("value")
        )


@attrs.frozen
class Storage:
    """A persistent volume (``kind="persistent"``) or a file mount (``kind="file"``)."""

    uuid: str
    kind: str
    mount_path: str
    name: str | None = None

    @classmethod
    def from_json(cls, kind: str, data: Mapping[str, Any]) -> Storage:
        return cls(str(data["uuid"]), kind, str(data.get("mount_path", "")), data.get("name"))


def _delete_flags(
    delete_configurations: bool,
    delete_volumes: bool,
    docker_cleanup: bool,
    delete_connected_networks: bool,
) -> dict[str, str]:
    flags = {
        "delete_configurations": delete_configurations,
        "delete_volumes": delete_volumes,
        "docker_cleanup": docker_cleanup,
        "delete_connected_networks": delete_connected_networks,
    }
    return {name: "true" if value else "false" for name, value in flags.items()}


class PaasClient:
    """Applications, their env vars and storages, and databases.

    ``http`` is not owned (not closed here); give it a timeout, and bound whole calls
    with a cancel scope: httpx timeouts are per operation, not per request.
    """

    def __init__(self, http: httpx.AsyncClient, base_url: str, token: str) -> None:
        self._api = ApiTransport(http, base_url, token)

    def __repr__(self) -> str:
        return f"PaasClient(base_url={self._api.base_url!r})"

    async def _get(self, path: str) -> Any:
        response = await self._api.request("GET", path)
        raise_for_status(response)
        return response.json()

    async def _get_or_none(self, path: str) -> Any:
        response = await self._api.request("GET", path)
        if response.status_code == 404:
            return None
        raise_for_status(response)
        return response.json()

    # applications -----------------------------------------------------------
    async def get_application(self, uuid: str) -> Application | None:
        """The application, or ``None`` on 404 only."""
        data = await self._get_or_none(f"/api/v1/applications/{segment(uuid)}")
        return None if data is None else Application.from_json(data)

    async def list_envs(self, app_uuid: str) -> list[EnvVar]:
        """Env vars of an application; raises ``NotFoundError`` if the app is gone."""
        data = await self._get(f"/api/v1/applications/{segment(app_uuid)}/envs")
        return [EnvVar.from_json(item) for item in data]

    async def delete_env(self, app_uuid: str, env_uuid: str) -> DeleteOutcome:
        path = f"/api/v1/applications/{segment(app_uuid)}/envs/{segment(env_uuid)}"
        return await delete(self._api, path)

    async def list_storages(self, app_uuid: str) -> list[Storage]:
        """Persistent volumes and file mounts; raises ``NotFoundError`` if the app is gone."""
        data = await self._get(f"/api/v1/applications/{segment(app_uuid)}/storages")
        return [Storage.from_json("persistent", item) for item in data["persistent_storages"]] + [
            Storage.from_json("file", item) for item in data["file_storages"]
        ]

    async def delete_storage(self, app_uuid: str, storage_uuid: str) -> DeleteOutcome:
        path = f"/api/v1/applications/{segment(app_uuid)}/storages/{segment(storage_uuid)}"
        return await delete(self._api, path)

    async def delete_application(
        self,
        uuid: str,
        *,
        delete_configurations: bool = True,
        delete_volumes: bool = True,
        docker_cleanup: bool = True,
        delete_connected_networks: bool = True,
    ) -> DeleteOutcome:
        """Delete the app; the flags are Coolify's query parameters (all true by default)."""
        params = _delete_flags(
            delete_configurations, delete_volumes, docker_cleanup, delete_connected_networks
        )
        return await delete(self._api, f"/api/v1/applications/{segment(uuid)}", params=params)

    # databases --------------------------------------------------------------
    async def get_database(self, uuid: str) -> Database | None:
        """The database, or ``None`` on 404 only."""
        data = await self._get_or_none(f"/api/v1/databases/{segment(uuid)}")
        return None if data is None else Database.from_json(data)

    async def delete_database(
        self,
        uuid: str,
        *,
        delete_configurations: bool = True,
        delete_volumes: bool = True,
        docker_cleanup: bool = True,
        delete_connected_networks: bool = True,
    ) -> DeleteOutcome:
        params = _delete_flags(
            delete_configurations, delete_volumes, docker_cleanup, delete_connected_networks
        )
        return await delete(self._api, f"/api/v1/databases/{segment(uuid)}", params=params)
