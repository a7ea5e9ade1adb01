"""The dashboard as an ASGI application that can be served alone or mounted in a Starlette or
FastAPI service."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from ..errors import ValidationError
from ..redis.client import RedisClient, connect
from . import actions, live, pages
from .config import DashboardConfig
from .security import RevokedSessions
from .web import error_page


class Dashboard:
    """The dashboard, an ASGI application.

    Give it an entered :class:`~respire_actors.RedisClient` (``client=``), or a ``redis_url``
    that it connects to for its lifespan. Served alone (``python -m respire_actors
    dashboard`` or any ASGI server) it runs its own lifespan; mounted in your application,
    either pass ``client=`` or enter :meth:`lifespan` in your application's lifespan::

        dashboard = Dashboard(DashboardConfig(auth=TokenAuth(token)), redis_url=url)
        app = Starlette(routes=[Mount("/jobs", app=dashboard)], lifespan=dashboard.lifespan)

    Raises :class:`ValidationError` for neither or both of ``client`` and ``redis_url``.
    """

    def __init__(
        self,
        config: DashboardConfig | None = None,
        *,
        client: RedisClient | None = None,
        redis_url: str | None = None,
    ) -> None:
        if (client is None) == (redis_url is None):
            raise ValidationError("give the dashboard exactly one of client= and redis_url=")
        if client is not None and not isinstance(client, RedisClient):
            raise ValidationError(f"client must be a RedisClient, got {type(client).__name__}")
        config = DashboardConfig() if config is None else config
        if not isinstance(config, DashboardConfig):
            raise ValidationError("config must be a DashboardConfig")
        self.config = config
        # sessions ended by a logout (see dashboard/security.py)
        self.revoked_sessions = RevokedSessions()
        self.redis_url = redis_url
        self._client = client
        self._closing: anyio.Event | None = None
        self.app = Starlette(
            routes=_routes(),
            lifespan=self.lifespan,
            exception_handlers={404: _not_found, 405: _not_allowed},
        )

    def closing(self) -> anyio.Event:
        """Set when the server serving the dashboard shuts down: open live streams end then,
        before the server's graceful deadline (created on first use, in the event loop)."""
        if self._closing is None:
            self._closing = anyio.Event()
        return self._closing

    @property
    def client(self) -> RedisClient:
        """The Redis client in use; raises :class:`RuntimeError` outside the lifespan when
        the dashboard connects by URL."""
        if self._client is None:
            raise RuntimeError(
                "the dashboard is not connected: enter Dashboard.lifespan() (or pass client=)"
            )
        return self._client

    @asynccontextmanager
    async def lifespan(self, app: object = None) -> AsyncIterator[None]:
        """Connect to ``redis_url`` for the block (nothing to do with ``client=``)."""
        if self.redis_url is None or self._client is not None:
            yield
            return
        async with connect(self.redis_url) as client:
            self._client = client
            try:
                yield
            finally:
                self._client = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["respire.dashboard"] = self
        await self.app(scope, receive, send)


def _routes() -> list[Any]:
    static = StaticFiles(directory=str(resources.files(__package__) / "static"))
    return [
        Route("/", pages.overview, name="overview"),
        Route("/live", live.overview_live),
        Route("/queue", pages.queue_detail),
        Route("/queue/live", live.queue_live),
        Route("/job", pages.job_detail),
        Route("/dead", pages.dead_letters),
        Route("/groups", pages.groups),
        Route("/batches", pages.batches),
        Route("/login", actions.login, methods=["GET", "POST"]),
        Route("/logout", actions.logout, methods=["POST"]),
        Route("/queue/pause", actions.pause_queue, methods=["POST"]),
        Route("/queue/resume", actions.resume_queue, methods=["POST"]),
        Route("/dead/retry", actions.retry_dead, methods=["POST"]),
        Route("/dead/delete", actions.delete_dead, methods=["POST"]),
        Route("/groups/pause", actions.pause_group, methods=["POST"]),
        Route("/groups/resume", actions.resume_group, methods=["POST"]),
        Mount("/static", app=static, name="static"),
    ]


async def _not_found(request: Request, exc: Exception) -> Response:
    return error_page(request, 404, "Not found", "there is no such page")


async def _not_allowed(request: Request, exc: Exception) -> Response:
    return error_page(request, 405, "Method not allowed", f"{request.method} is not allowed here")


__all__ = ["Dashboard"]
