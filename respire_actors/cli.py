"""``python -m respire_actors``: serve an app, or inspect a server.

::

    python -m respire_actors serve examples.email_app:app [--backend trio|asyncio]
                                   [--redis-url URL] [--data-dir DIR]
    python -m respire_actors ping  [--redis-url URL]       (alias: info)
    python -m respire_actors --version

Without ``--redis-url`` or ``$RESPIRE_REDIS_URL``, ``serve`` starts the embedded valkey-server
(data under ``--data-dir``, default ``./.respire/valkey``). The first SIGINT/SIGTERM stops
gracefully (intake stops, handlers finish within their grace, unfinished work stays pending);
a second one cancels at once.

Exit codes: 0 success, 1 runtime failure, 2 usage error, 3 start-up failure.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.abc

from supervisors import ChildSpec, Restart, Strategy, Supervisor, current_child, render_snapshot

from . import __version__
from .embedded import EmbeddedConfig, run_embedded_server
from .errors import ConfigurationError, RespireError
from .redis.client import DEFAULT_URL_ENV, RedisClient, connect

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_STARTUP = 0, 1, 2, 3

log = logging.getLogger("respire_actors.cli")


class App(Protocol):
    """What ``serve`` runs: any object with this method (a :class:`~respire_actors.Worker`
    is one). Returning ends the service with exit code 0."""

    async def run(
        self, client: RedisClient, *, task_status: anyio.abc.TaskStatus[None] = ...
    ) -> None: ...


class StartupError(RespireError):
    """The service could not start (bad app path, unreachable server, ...)."""


def load_app(path: str) -> App:
    """Import ``module:attribute`` (the attribute may be dotted, or a zero-argument factory)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise StartupError(f"app path {path!r} must look like 'package.module:app'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise StartupError(f"cannot import module {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise StartupError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not hasattr(obj, "run") and callable(obj):
        obj = obj()
    if not callable(getattr(obj, "run", None)):
        raise StartupError(f"{path!r} is not an app: it needs an async run(client) method")
    return obj  # type: ignore[no-any-return]


@dataclass(slots=True)
class ServeConfig:
    app: App
    redis_url: str | None = None
    data_dir: Path | None = None
    shutdown_timeout: float = 60.0


async def serve(
    config: ServeConfig,
    *,
    task_status: anyio.abc.TaskStatus[Supervisor] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run the app (and the embedded server when no URL is set) as one supervision tree.

    Reports the root supervisor once everything has started. Returns when the app returns or
    after a graceful stop of the supervisor.
    """
    url_holder: dict[str, str] = {}
    finished = anyio.Event()

    async def embedded(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with anyio.create_task_group() as tg:
            url_holder["url"] = await tg.start(
                run_embedded_server, EmbeddedConfig(data_dir=config.data_dir)
            )
            task_status.started()
            await current_child().wait_stop_requested()
            tg.cancel_scope.cancel()  # SIGTERM to the server: it flushes its AOF and exits

    async def host(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with connect(url_holder["url"]) as client:
            info = await client.server_info()
            log.info("connected to %s at %s", info.describe(), client.settings.describe())
            await config.app.run(client, task_status=task_status)
        finished.set()

    children = []
    if config.redis_url:
        url_holder["url"] = config.redis_url
    else:
        children.append(ChildSpec("embedded-valkey", embedded, shutdown=15.0))
    children.append(
        ChildSpec("app", host, restart=Restart.TRANSIENT, shutdown=config.shutdown_timeout)
    )
    root = Supervisor(
        "respire", children, strategy=Strategy.REST_FOR_ONE, max_restarts=5, period=60
    )

    async with anyio.create_task_group() as tg:

        async def run_root(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            await root.run(task_status=task_status)
            tg.cancel_scope.cancel()  # stopped: nothing left to wait for

        async def stop_when_app_returns() -> None:
            await finished.wait()
            root.request_stop()

        await tg.start(run_root)
        tg.start_soon(stop_when_app_returns)
        task_status.started(root)


async def _serve_with_signals(config: ServeConfig) -> int:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with anyio.create_task_group() as tg:
            outer = tg.cancel_scope

            async def watch_signals() -> None:
                count = 0
                async for signum in signals:
                    count += 1
                    if count == 1:
                        log.warning(
                            "%s: stopping gracefully (again to stop at once)",
                            signal.Signals(signum).name,
                        )
                        root = roots.get("root")
                        if root is not None:
                            root.request_stop()
                    else:
                        outer.cancel()

            roots: dict[str, Supervisor] = {}

            async def serve_and_record(*, task_status: anyio.abc.TaskStatus[None]) -> None:
                async with anyio.create_task_group() as inner:
                    roots["root"] = await inner.start(serve, config)
                    task_status.started()
                outer.cancel()

            tg.start_soon(watch_signals)
            await tg.start(serve_and_record)
    return EXIT_OK


async def ping(url: str | None) -> int:
    async with connect(
        url or os.environ.get(DEFAULT_URL_ENV) or "redis://127.0.0.1:6379"
    ) as client:
        info = await client.server_info()
        rows = [
            ("server", client.settings.describe()),
            ("flavor", info.flavor),
            ("version", info.version_text),
            ("mode", info.mode),
            ("role", info.role),
            ("XACKDEL", "yes" if info.has_xackdel else "no (XACK + XDEL)"),
            ("key prefix", client.key_prefix or "(none)"),
        ]
        width = max(len(k) for k, _ in rows)
        for key, value in rows:
            print(f"{key:<{width}}  {value}")
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m respire_actors", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--version", action="version", version=f"respire_actors {__version__}")
    parser.add_argument("--log-level", default=os.environ.get("RESPIRE_LOG_LEVEL", "INFO"))
    sub = parser.add_subparsers(dest="command")
    s = sub.add_parser("serve", help="run an app (module:attribute)")
    s.add_argument("app", help="the app to run, as 'package.module:attribute'")
    s.add_argument("--backend", choices=("trio", "asyncio"), default="trio")
    s.add_argument("--redis-url", default=None, help=f"default: ${DEFAULT_URL_ENV}, else embedded")
    s.add_argument("--data-dir", type=Path, default=None, help="embedded server data directory")
    for name in ("ping", "info"):
        p = sub.add_parser(name, help="show the server, its version and capabilities")
        p.add_argument("--redis-url", default=None)
        p.add_argument("--backend", choices=("trio", "asyncio"), default="trio")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)-7s %(name)s: %(message)s"
    )
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        if args.command == "serve":
            app = load_app(args.app)
            url = args.redis_url or os.environ.get(DEFAULT_URL_ENV) or None
            if url:
                from .redis.client import ConnectionSettings

                ConnectionSettings.from_url(url)  # a bad URL is a start-up error, said at once
            return anyio.run(
                _serve_with_signals, ServeConfig(app, url, args.data_dir), backend=args.backend
            )
        return anyio.run(ping, args.redis_url, backend=args.backend)
    except (StartupError, ConfigurationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_STARTUP
    except BaseExceptionGroup as group:
        first = _first_leaf(group)
        print(f"error: {first}", file=sys.stderr)
        return EXIT_STARTUP if isinstance(first, RespireError) else EXIT_FAILURE
    except RespireError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_STARTUP
    except KeyboardInterrupt:
        return EXIT_FAILURE


def _first_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    while exc.__cause__ is not None and not isinstance(exc, RespireError):
        exc = exc.__cause__
    return exc


def console_main() -> None:
    sys.exit(main())


__all__ = ["App", "ServeConfig", "load_app", "main", "render_snapshot", "serve"]
