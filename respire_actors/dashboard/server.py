"""Serving the dashboard with Hypercorn on the running async library (trio or asyncio)."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace

import anyio
import anyio.abc
import sniffio
from hypercorn.config import Config

from ..errors import ConfigurationError
from .app import Dashboard
from .config import BasicAuth, DashboardConfig, TokenAuth
from .security import is_loopback

TOKEN_ENV = "RESPIRE_DASHBOARD_TOKEN"
PASSWORD_ENV = "RESPIRE_DASHBOARD_PASSWORD"
SECRET_ENV = "RESPIRE_DASHBOARD_SECRET"

log = logging.getLogger("respire_actors.dashboard")


@dataclass(frozen=True, slots=True)
class Bound:
    """Where :func:`serve_dashboard` listens (the real port when 0 was asked)."""

    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"


def is_loopback_host(host: str) -> bool:
    return host == "localhost" or is_loopback(host)


async def serve_dashboard(
    dashboard: Dashboard,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    task_status: anyio.abc.TaskStatus[Bound] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``dashboard`` with Hypercorn until cancelled, on trio or asyncio (whichever runs).

    Reports the bound address (:class:`Bound`) once it listens. Raises
    :class:`ConfigurationError` before listening when ``host`` is not a loopback address and
    the dashboard has no auth (it would refuse every request anyway), and ``OSError`` when the
    address cannot be bound. Cancelling closes the listener and every open connection.
    """
    if dashboard.config.auth is None and not is_loopback_host(host):
        raise ConfigurationError(
            f"refusing to serve the dashboard on {host!r} without auth: set a token "
            f"(${TOKEN_ENV}) or basic auth, or listen on 127.0.0.1"
        )
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigurationError(f"port must be an integer from 0 to 65535, got {port!r}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host, port), family=family, backlog=128)
    bound = Bound(host, listener.getsockname()[1])
    config = Config()
    config.bind = [f"fd://{listener.detach()}"]  # Hypercorn owns (and closes) the socket
    config.graceful_timeout = 1.0
    config.accesslog = None
    log.info("dashboard listening on %s", bound.url)
    if sniffio.current_async_library() == "trio":
        from hypercorn.trio import serve
    else:
        from hypercorn.asyncio import serve  # type: ignore[assignment]
    stop = anyio.Event()
    # Hypercorn stops through its shutdown trigger (its asyncio server does not survive being
    # cancelled): the server runs shielded, and cancelling this call pulls the trigger, then
    # gives open connections the graceful timeout (and a hard deadline after it).
    shielded = anyio.CancelScope(shield=True)

    async def run_server() -> None:
        with shielded:
            await serve(dashboard, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_server)
        task_status.started(bound)
        try:
            await anyio.sleep_forever()
        finally:
            dashboard.closing().set()  # live streams end themselves, within the grace
            stop.set()
            shielded.deadline = anyio.current_time() + config.graceful_timeout + 5


def config_from_environment(
    *,
    queues: tuple[str, ...] | None,
    basic_user: str | None,
    read_only: bool,
    show_payloads: bool,
    dead_streams: Mapping[str, str] | None = None,
) -> DashboardConfig:
    """The command line's settings: auth and the signing secret come from the environment
    (never from arguments, which other users of the machine can see)."""
    token = os.environ.get(TOKEN_ENV) or None
    auth: TokenAuth | BasicAuth | None = None
    if basic_user is not None:
        if token is not None:
            raise ConfigurationError(f"set either ${TOKEN_ENV} or --basic-user, not both")
        password = os.environ.get(PASSWORD_ENV)
        if not password:
            raise ConfigurationError(f"--basic-user needs the password in ${PASSWORD_ENV}")
        auth = BasicAuth(basic_user, password)
    elif token is not None:
        auth = TokenAuth(token)
    config = DashboardConfig(
        auth=auth,
        queues=queues,
        read_only=read_only,
        show_payloads=show_payloads,
        dead_streams=dict(dead_streams or {}),
    )
    secret = os.environ.get(SECRET_ENV)
    return replace(config, secret=secret.encode()) if secret else config


__all__ = [
    "PASSWORD_ENV",
    "SECRET_ENV",
    "TOKEN_ENV",
    "Bound",
    "config_from_environment",
    "is_loopback_host",
    "serve_dashboard",
]
