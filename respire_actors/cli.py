"""``python -m respire_actors``: serve an app, or inspect a server.

``main(argv)`` is a thin shell over :func:`serve`, which runs the app (and the embedded server
when no URL is set) as one supervision tree and can itself be started in a task group.
The command line is documented in ``docs/cli.md`` and by ``--help``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import inspect
import logging
import math
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

import anyio
import anyio.abc

from supervisors import (
    ChildSpec,
    Restart,
    RunState,
    Strategy,
    Supervisor,
    SupervisorError,
    current_child,
    render_snapshot,
)

from . import __version__
from .chaos.cli import add_chaos_parser, run_chaos
from .cli_admin import ADMIN_COMMANDS, add_admin_commands, run_admin_command
from .embedded import DATA_DIR_ENV, EmbeddedConfig, run_embedded_server, running_server_url
from .errors import (
    ConfigurationError,
    EmbeddedServerError,
    RedisUnavailable,
    RespireError,
    ServerError,
)
from .redis.client import DEFAULT_URL_ENV, ConnectionSettings, RedisClient, connect
from .startup import connect_when_loaded

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_STARTUP = 0, 1, 2, 3
LOG_LEVEL_ENV = "RESPIRE_LOG_LEVEL"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
DEFAULT_STATS_INTERVAL = 10.0

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
    """Import ``module:attribute`` (the attribute may be dotted, or a zero-argument factory).

    Raises :class:`StartupError` saying what is wrong with the path or the object.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise StartupError(f"app path {path!r} must look like 'package.module:app'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        missing = getattr(exc, "name", None)
        if missing and not (module_name == missing or module_name.startswith(missing + ".")):
            # the module was found; something it imports is not installed
            raise StartupError(
                f"importing module {module_name!r} failed: {exc} (a package it imports is "
                "not installed in this environment)"
            ) from exc
        raise StartupError(
            f"cannot import module {module_name!r}: {exc} (run from the project's directory, "
            "or put it on PYTHONPATH)"
        ) from exc
    except Exception as exc:
        raise StartupError(
            f"importing module {module_name!r} failed: {type(exc).__name__}: {exc} (the error "
            "is in that module's top-level code)"
        ) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise StartupError(f"module {module_name!r} has no attribute {attr!r}") from None
    needs = (
        "an object with a method 'async def run(self, client, *, "
        "task_status=anyio.TASK_STATUS_IGNORED)', or a factory that takes no arguments"
    )
    if isinstance(obj, type) or (not hasattr(obj, "run") and callable(obj)):
        # a factory (a class is one too: its run is not bound to an instance yet)
        try:
            inspect.signature(obj).bind()
        except TypeError:
            raise StartupError(f"{path!r} is not an app: serve needs {needs}") from None
        except ValueError:  # no signature to check (a builtin): just try it
            pass
        try:
            obj = obj()
        except Exception as exc:
            raise StartupError(f"building the app with {path}() failed: {exc!r}") from exc
    run = getattr(obj, "run", None)
    if not callable(run):
        raise StartupError(f"{path!r} is not an app: serve needs {needs}")
    _check_run(path, run, needs)
    return obj  # type: ignore[no-any-return]


def _check_run(path: str, run: Any, needs: str) -> None:
    """Refuse an app whose ``run`` is not async or cannot take ``(client, *, task_status=)``,
    before anything runs (a blocking sync ``run`` would otherwise run first)."""
    target = run if inspect.isfunction(run) or inspect.ismethod(run) else type(run).__call__
    if not (inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(run)):
        raise StartupError(
            f"{type(run.__self__).__name__ if hasattr(run, '__self__') else path}.run is not "
            f"async: serve needs {needs}"
        )
    try:
        inspect.signature(run).bind(object(), task_status=anyio.TASK_STATUS_IGNORED)
    except TypeError as exc:
        raise StartupError(
            f"{path}: its run cannot be called as run(client, task_status=...) ({exc}); "
            f"serve needs {needs}"
        ) from None
    except ValueError:  # no signature to check: it is tried as it is
        pass


@dataclass(slots=True)
class ServeConfig:
    """What :func:`serve` runs.

    ``redis_url`` None starts the embedded server in ``data_dir``. ``stats_interval`` is the
    period of the throughput summary logged for worker apps (0 turns it off).
    """

    app: App
    redis_url: str | None = None
    data_dir: Path | None = None
    shutdown_timeout: float = 60.0
    stats_interval: float = DEFAULT_STATS_INTERVAL
    # what the app raised while it was being stopped (the supervisor only logs it): serve's
    # exit status reports it
    stop_failures: list[BaseException] = dataclasses.field(default_factory=list)


async def serve(
    config: ServeConfig,
    *,
    task_status: anyio.abc.TaskStatus[Supervisor] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run the app (and the embedded server when no URL is set) as one supervision tree.

    Before the app starts, waits for the server to finish loading its data set (a server
    that has just restarted refuses commands with ``LOADING`` until then). Reports the root
    supervisor once everything has started. Returns when the app returns or after a graceful
    stop of the supervisor. A failure before that raises (wrapped in the supervisor's
    :class:`~supervisors.StartError`).
    """
    url_holder: dict[str, str] = {}
    finished = anyio.Event()
    embedded_config = EmbeddedConfig(data_dir=config.data_dir)

    async def embedded(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        # A server that dies under the running app is started again in place (same port and
        # data directory): the app's connection recovers by itself and its in-flight
        # completions commit, instead of a rest_for_one restart that first waits out the app's
        # graceful stop against a server that cannot come back until that stop ends. A server
        # that cannot be restarted in place fails this child (rest_for_one takes over).
        deaths: list[float] = []
        server_config = embedded_config

        def ready(url: str) -> None:
            if server_config is embedded_config:  # this child's first server
                url_holder["url"] = url
                task_status.started()
            else:
                log.info("the embedded server is back at %s", _without_password(url))

        while True:
            died = await _embedded_until_stop_or_death(server_config, ready)
            if died is None:
                return  # stop requested: the server got SIGTERM and flushed its AOF
            now = anyio.current_time()
            deaths[:] = [t for t in deaths if now - t < IN_PLACE_PERIOD] + [now]
            if len(deaths) > IN_PLACE_RESTARTS:
                raise died
            first = urlsplit(url_holder["url"])
            port = int(first.port or 0)
            # the same port and password: the app's connection reconnects with what it holds
            server_config = dataclasses.replace(
                embedded_config, port=port, password=unquote(first.password or "") or None
            )
            log.warning("the embedded server died (%s); starting it again on port %d", died, port)

    async def host(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        try:
            await host_app(task_status=task_status)
        except Exception as exc:
            if root.state is RunState.STOPPING:  # the service stops (not a restart of the app)
                config.stop_failures.append(exc)
            raise

    async def host_app(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with connect_when_loaded(url_holder["url"]) as client:
            info = await client.server_info()
            where = client.settings.describe()
            if config.redis_url is None:
                where += f" (embedded, data in {embedded_config.resolved_dir().resolve()})"
            async with anyio.create_task_group() as tg:
                await tg.start(_run_app, config.app, client, tg.cancel_scope)
                _log_banner(config.app, info.describe(), where)
                if config.stats_interval > 0 and _is_worker(config.app):
                    tg.start_soon(_report_throughput, config.app, config.stats_interval)
                task_status.started()
        if not current_child().stop_requested:
            # the app returned by itself: the service is done. Not when the supervisor stopped
            # it (a graceful stop, or a rest_for_one restart after the embedded server died:
            # that restart must go ahead, not turn into a stop that exits 0)
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


IN_PLACE_RESTARTS = 5
IN_PLACE_PERIOD = 60.0
"""At most this many in-place restarts of the embedded server per period; one more death
fails the server child, and the supervisor restarts it and the app."""


async def _embedded_until_stop_or_death(
    config: EmbeddedConfig, ready: Callable[[str], None]
) -> EmbeddedServerError | None:
    """Run the embedded server until the supervisor asks this child to stop (None) or the
    server exits by itself after it was ready (that error); ``ready`` gets its URL once it
    answers. A server that fails to start raises."""
    died: list[EmbeddedServerError] = []
    async with anyio.create_task_group() as tg:

        async def server(*, task_status: anyio.abc.TaskStatus[str]) -> None:
            status = _StartedOnce(task_status)
            try:
                await run_embedded_server(config, task_status=status)
            except EmbeddedServerError as exc:
                if not status.called:
                    raise  # it never started: nothing to restart in place
                died.append(exc)
                tg.cancel_scope.cancel()

        ready(await tg.start(server))
        await current_child().wait_stop_requested()
        tg.cancel_scope.cancel()  # SIGTERM to the server: it flushes its AOF and exits
    return died[0] if died else None


async def _run_app(
    app: App,
    client: RedisClient,
    done: anyio.CancelScope,
    *,
    task_status: anyio.abc.TaskStatus[None],
) -> None:
    status = _StartedOnce(task_status)
    running = app.run(client, task_status=status)
    if not inspect.isawaitable(running):
        raise StartupError(
            f"{type(app).__name__}.run is not async: serve needs "
            "'async def run(self, client, *, task_status=anyio.TASK_STATUS_IGNORED)'"
        )
    await running
    if not status.called:
        # a one-shot app that never said it was ready: it ran, returned, and is done
        task_status.started()
    done.cancel()  # the app returned: end the throughput reporter with it


class _StartedOnce(anyio.abc.TaskStatus[Any]):
    """Passes ``started`` on, and remembers whether the app called it."""

    def __init__(self, inner: anyio.abc.TaskStatus[Any]) -> None:
        self._inner = inner
        self.called = False

    def started(self, value: Any = None) -> None:
        self.called = True
        self._inner.started(value)


# ------------------------------------------------------------------------------------------
# the banner and the throughput summary (worker apps: anything with registrations)


def _is_worker(app: object) -> bool:
    return isinstance(getattr(app, "registrations", None), list) and callable(
        getattr(app, "statistics", None)
    )


def _registration_name(reg: object) -> tuple[str, str]:
    """("queue", name) for a job registration, ("stream", name) for a stream one."""
    for kind in ("queue", "stream"):
        name = getattr(reg, kind, None)
        if isinstance(name, str):
            return kind, name
    return "registration", repr(reg)


def _handler_name(handler: object) -> str:
    module = getattr(handler, "__module__", None)
    name = getattr(handler, "__qualname__", None) or repr(handler)
    return f"{module}.{name}" if module else str(name)


def _log_banner(app: object, server: str, where: str) -> None:
    if not _is_worker(app):
        log.info("connected to %s at %s", server, where)
        return
    registrations = getattr(app, "registrations", [])
    log.info(
        "respire_actors %s: worker %r on %s at %s, %d registration(s)",
        __version__,
        getattr(app, "name", "worker"),
        server,
        where,
        len(registrations),
    )
    for reg in registrations:
        options = getattr(reg, "options", None)
        extras = []
        if getattr(reg, "queue_options", None) is not None:
            extras.append("scheduling and retries on")
        limit = getattr(options, "delivery_limit", None)
        if limit is not None:
            extras.append(f"delivery limit {limit}")
        log.info(
            "  %s %r -> %s, concurrency %s%s",
            *_registration_name(reg),
            _handler_name(getattr(reg, "handler", None)),
            getattr(options, "consumer_count", "?"),
            "".join(f", {e}" for e in extras),
        )


_COUNTERS = ("acked", "retried", "dead_lettered", "failed")


def _totals(app: Any) -> dict[str, int]:
    totals = dict.fromkeys(_COUNTERS, 0)
    for reg in app.registrations:
        try:
            stats = app.statistics(_registration_name(reg)[1])
        except KeyError:  # not built yet
            continue
        for name in _COUNTERS:
            totals[name] += int(getattr(stats, name, 0))
    return totals


def _in_flight(app: Any) -> int | None:
    probe = getattr(app, "in_flight", None)
    if not callable(probe):
        return None
    try:
        return sum(int(probe(_registration_name(reg)[1])) for reg in app.registrations)
    except KeyError:
        return None


def throughput_line(
    before: dict[str, int], after: dict[str, int], seconds: float, in_flight: int | None
) -> str:
    """The periodic summary: what finished in the last ``seconds``, and what runs now."""
    delta = {name: after[name] - before[name] for name in _COUNTERS}
    processed = delta["acked"] + delta["retried"] + delta["dead_lettered"]
    rate = processed / seconds if seconds > 0 else 0.0
    line = (
        f"throughput: {rate:.1f} jobs/s ({processed} in {seconds:.0f} s): "
        f"acked {delta['acked']}, retried {delta['retried']}, "
        f"dead-lettered {delta['dead_lettered']}, failed {delta['failed']}"
    )
    if in_flight is not None:
        line += f", in flight {in_flight}"
    return line


async def _report_throughput(app: Any, interval: float) -> None:
    before = _totals(app)
    since = anyio.current_time()
    while True:
        await anyio.sleep(interval)
        now = anyio.current_time()
        after = _totals(app)
        log.info(throughput_line(before, after, now - since, _in_flight(app)))
        before, since = after, now


# ------------------------------------------------------------------------------------------
# the command line


class _StartupLogGate(logging.Filter):
    """Holds back warnings and errors logged while the service starts.

    A start-up failure is reported as one ``error:`` line; what the supervisors logged on the
    way (with tracebacks) would bury it. Once the service has started the held records are
    written, and nothing is held any more. With ``--log-level debug`` nothing is held.
    """

    def __init__(self, handler: logging.Handler, *, hold: bool) -> None:
        super().__init__()
        self.handler = handler
        self.holding = hold
        self.held: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if self.holding and record.levelno >= logging.WARNING:
            self.held.append(record)
            return False
        return True

    def release(self) -> None:
        self.holding = False
        held, self.held = self.held, []
        for record in held:
            self.handler.handle(record)

    def drop(self) -> None:
        self.holding = False
        self.held = []


_gate: _StartupLogGate | None = None


HARD_STOP_AFTER_SECOND_SIGNAL = 2.0
"""Seconds the cancellation after a second signal gets before the process exits regardless."""
HARD_STOP_MARGIN = 5.0
"""Seconds past ``--shutdown-timeout`` a graceful stop gets before the process exits
regardless (a shielded handler or one in a worker thread ignores cancellation)."""


class _HardStop:
    """A watchdog that ends the process when a stop takes too long: cancellation cannot
    interrupt shielded code or a worker thread, and a stop must not wait on them for ever. It
    runs in a daemon thread, so a blocked event loop cannot hold it up either. The work those
    handlers held stays pending in Redis and is recovered after its visibility timeout; an
    embedded server goes down with this process (its death signal)."""

    def __init__(self) -> None:
        self._timer: threading.Timer | None = None

    def arm(self, seconds: float, why: str) -> None:
        """Exit in ``seconds`` unless disarmed first (replacing an armed timer only when
        sooner)."""
        if self._timer is not None:
            if seconds >= self._timer.interval:
                return
            self._timer.cancel()
        self._timer = threading.Timer(seconds, self._exit, (seconds, why))
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @staticmethod
    def _exit(seconds: float, why: str) -> None:
        log.error(
            "the app did not stop within %.0f s of %s (a shielded handler, or one running in a "
            "thread, ignores cancellation): exiting now; the jobs it ran stay pending and are "
            "recovered after their visibility timeout",
            seconds,
            why,
        )
        logging.shutdown()
        sys.stderr.flush()
        os._exit(EXIT_FAILURE)


def _without_password(url: str) -> str:
    """``url`` with its password masked, for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return parts._replace(netloc=netloc).geturl()


async def _serve_with_signals(config: ServeConfig, phase: dict[str, bool]) -> int:
    """Serve until the app returns or a signal stops it. SIGINT, SIGTERM and SIGHUP (the
    terminal went away) stop gracefully, the process exiting regardless (code 1) if that takes
    ``--shutdown-timeout`` plus :data:`HARD_STOP_MARGIN` seconds; a second signal cancels at
    once, exiting regardless after :data:`HARD_STOP_AFTER_SECOND_SIGNAL` seconds."""
    stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    hard_stop = _HardStop()
    try:
        return await _serve_until_stopped(config, phase, stop_signals, hard_stop)
    finally:
        hard_stop.disarm()


async def _serve_until_stopped(
    config: ServeConfig,
    phase: dict[str, bool],
    stop_signals: tuple[signal.Signals, ...],
    hard_stop: _HardStop,
) -> int:
    with anyio.open_signal_receiver(*stop_signals) as signals:
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
                            hard_stop.arm(
                                config.shutdown_timeout + HARD_STOP_MARGIN,
                                f"{signal.Signals(signum).name} (--shutdown-timeout "
                                f"{config.shutdown_timeout:g} s)",
                            )
                            root.request_stop()
                        else:
                            # still starting: nothing to drain. What start-up logged so far is
                            # noise now; the stop itself must be seen
                            if _gate is not None:
                                _gate.drop()
                            log.warning("stopped during start-up; nothing was served")
                            outer.cancel()
                    else:
                        log.warning(
                            "%s again: stopping at once (cancelling the running handlers)",
                            signal.Signals(signum).name,
                        )
                        hard_stop.arm(HARD_STOP_AFTER_SECOND_SIGNAL, "the second signal")
                        outer.cancel()

            roots: dict[str, Supervisor] = {}

            async def serve_and_record(*, task_status: anyio.abc.TaskStatus[None]) -> None:
                async with anyio.create_task_group() as inner:
                    roots["root"] = await inner.start(serve, config)
                    phase["started"] = True
                    if _gate is not None:
                        _gate.release()
                    task_status.started()
                outer.cancel()

            tg.start_soon(watch_signals)
            await tg.start(serve_and_record)
    if config.stop_failures:
        exc = root_cause(config.stop_failures[0])
        print(
            f"error: the app failed while stopping: {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    return EXIT_OK


async def embedded_url(data_dir: Path | None) -> str:
    """The URL of the embedded server a running ``serve`` has in the data directory; raises
    :class:`StartupError` saying what to do when none runs there."""
    directory = EmbeddedConfig(data_dir=data_dir).resolved_dir()
    url = await running_server_url(directory)
    if url is None:
        raise StartupError(
            f"no embedded server is running in {directory.resolve()}: start one with "
            "'python -m respire_actors serve APP', or give --redis-url or "
            f"${DEFAULT_URL_ENV}"
        )
    return url


async def _admin(args: argparse.Namespace, url: str | None, phase: dict[str, bool]) -> int:
    """Connect (like ping) and run one operator command (respire_actors.cli_admin)."""
    async with connect(url or await embedded_url(args.data_dir)) as client:
        phase["started"] = True  # connected: later failures are runtime failures (exit 1)
        return await run_admin_command(client, args)


async def ping(url: str | None, data_dir: Path | None) -> int:
    """Print the server's flavour, version and capabilities.

    Without a URL (and no ``$RESPIRE_REDIS_URL``) it finds the embedded server that ``serve``
    runs in the data directory, like ``serve`` would use it.
    """
    async with connect(url or await embedded_url(data_dir)) as client:
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


DESCRIPTION = f"""\
Serve a respire_actors app, or inspect a Redis server.

examples:
  python -m respire_actors serve examples.email_app:app
  python -m respire_actors serve myproject.tasks:worker --redis-url redis://127.0.0.1:6379
  python -m respire_actors ping
  python -m respire_actors dashboard --redis-url redis://127.0.0.1:6379
  python -m respire_actors queues                       # operator commands: see docs/cli.md
  python -m respire_actors dead-letters email --reason nack
  python -m respire_actors retry email --all --reason nack

Without --redis-url or ${DEFAULT_URL_ENV}, serve starts the embedded valkey-server
(data in --data-dir, ${DATA_DIR_ENV}, or ./.respire/valkey) and stops it on exit.
The first SIGINT, SIGTERM or SIGHUP stops gracefully (intake stops, running handlers
finish within their grace, unfinished work stays pending); a second one stops at once.
"""

EPILOG = """\
exit codes:
  0  success: the app returned, or a graceful stop
  1  runtime failure: the app or the server failed after start-up
  2  usage error: unknown command or option
  3  start-up failure: bad app path, unusable or locked data directory, bad log
     level, unreachable or refusing server; one 'error:' line says what to do
     (the traceback too with --log-level debug)
operator commands (queues, retry, trim, ...): 1 also when the command could not do
what was asked (an unknown queue, an aborted trim), 2 also for bad arguments
"""


def _seconds(*, allow_zero: bool) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds, not negative (and not zero unless
    allowed); anything else is a usage error naming the value."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            least = "0 or more" if allow_zero else "more than 0"
            raise argparse.ArgumentTypeError(f"{text!r} must be {least} seconds")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--log-level",
        default=argparse.SUPPRESS,
        metavar="LEVEL",
        help=f"debug, info, warning, error or critical (default: ${LOG_LEVEL_ENV}, else "
        "info); debug also prints tracebacks of start-up failures",
    )
    parser = argparse.ArgumentParser(
        prog="python -m respire_actors",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=fmt,
        parents=[common],
    )
    parser.add_argument(
        "--version", action="version", version=f"respire_actors {__version__}",
        help="print the version and exit",
    )  # fmt: skip
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", help="one of these (COMMAND --help for its options):"
    )
    backend = {
        "choices": ("trio", "asyncio"),
        "default": "trio",
        "help": "the async library to run on (default: trio)",
    }
    s = sub.add_parser(
        "serve",
        help="run an app (package.module:attribute)",
        description="Run an app: a Worker, or any object with a method "
        "'async def run(self, client, *, task_status=anyio.TASK_STATUS_IGNORED)'.",
        epilog=EPILOG,
        formatter_class=fmt,
        parents=[common],
    )
    s.add_argument(
        "app",
        help="the app to run, as 'package.module:attribute' (the attribute may be a factory "
        "that takes no arguments)",
    )
    s.add_argument("--backend", **backend)  # type: ignore[arg-type]
    s.add_argument(
        "--redis-url",
        default=None,
        metavar="URL",
        help=f"the server to use (default: ${DEFAULT_URL_ENV}, else the embedded server)",
    )
    s.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"the embedded server's data directory (default: ${DATA_DIR_ENV}, else "
        "./.respire/valkey)",
    )
    s.add_argument(
        "--stats-interval",
        type=_seconds(allow_zero=True),
        default=DEFAULT_STATS_INTERVAL,
        metavar="SECONDS",
        help="period of the throughput summary logged for worker apps (default: "
        f"{DEFAULT_STATS_INTERVAL:g}; 0 turns it off)",
    )
    s.add_argument(
        "--shutdown-timeout",
        type=_seconds(allow_zero=True),
        default=60.0,
        metavar="SECONDS",
        help="how long a graceful stop waits for the app before cancelling it (default: 60)",
    )
    for name, extra in (("ping", ""), ("info", " (same as ping)")):
        p = sub.add_parser(
            name,
            help="show the server, its version and capabilities" + extra,
            description="Show the server's flavour, version, mode and capabilities. Without "
            f"--redis-url or ${DEFAULT_URL_ENV}: the embedded server that serve runs in the "
            "data directory.",
            epilog=EPILOG,
            formatter_class=fmt,
            parents=[common],
        )
        p.add_argument(
            "--redis-url",
            default=None,
            metavar="URL",
            help=f"the server to ask (default: ${DEFAULT_URL_ENV}, else the embedded server)",
        )
        p.add_argument(
            "--data-dir",
            type=Path,
            default=None,
            metavar="DIR",
            help="where to look for the embedded server (default: as for serve)",
        )
        p.add_argument("--backend", **backend)  # type: ignore[arg-type]
    server = argparse.ArgumentParser(add_help=False)
    server.add_argument(
        "--redis-url",
        default=None,
        metavar="URL",
        help=f"the server (default: ${DEFAULT_URL_ENV}, else the embedded server)",
    )
    server.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where to look for the embedded server (default: as for serve)",
    )
    server.add_argument("--backend", **backend)  # type: ignore[arg-type]
    add_admin_commands(sub, [common, server], EPILOG)
    _add_dashboard_parser(sub, common, backend)
    chaos_server = argparse.ArgumentParser(add_help=False)
    chaos_server.add_argument(
        "--redis-url",
        default=None,
        metavar="URL",
        help=f"the server for scenarios that only need a queue (default: ${DEFAULT_URL_ENV}, "
        "else a throwaway server)",
    )
    chaos_server.add_argument("--backend", **backend)  # type: ignore[arg-type]
    add_chaos_parser(sub, [common, chaos_server], EPILOG)
    return parser


def _add_dashboard_parser(
    sub: Any, common: argparse.ArgumentParser, backend: dict[str, Any]
) -> None:
    d = sub.add_parser(
        "dashboard",
        help="serve the web dashboard",
        description="Serve the web dashboard (needs the 'dashboard' extra). Without auth it "
        "listens on loopback only; set $RESPIRE_DASHBOARD_TOKEN for token auth, or "
        "--basic-user with $RESPIRE_DASHBOARD_PASSWORD for basic auth. "
        "$RESPIRE_DASHBOARD_SECRET signs CSRF tokens and sessions (default: random per "
        "process). See docs/dashboard.md.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )
    d.add_argument(
        "--redis-url",
        default=None,
        metavar="URL",
        help=f"the server to show (default: ${DEFAULT_URL_ENV})",
    )
    d.add_argument(
        "--queue",
        action="append",
        default=None,
        metavar="NAME",
        help="show this queue (repeat for more; default: every registered queue)",
    )
    d.add_argument(
        "--dead-stream",
        action="append",
        default=None,
        metavar="QUEUE=SUFFIX",
        help="the dead-letter stream override a queue's workers use "
        "(WorkerOptions(dead_letter_stream=SUFFIX)); repeat for more queues",
    )
    d.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    d.add_argument("--port", type=int, default=8080, help="port to listen on (8080)")
    d.add_argument(
        "--basic-user",
        default=None,
        metavar="NAME",
        help="use basic auth with this user (password in $RESPIRE_DASHBOARD_PASSWORD)",
    )
    d.add_argument("--read-only", action="store_true", help="hide and refuse every action")
    d.add_argument(
        "--show-payloads",
        action="store_true",
        help="show job payloads (they may hold personal data)",
    )
    d.add_argument("--backend", **backend)


async def run_dashboard(args: argparse.Namespace, url: str, phase: dict[str, bool]) -> int:
    """The ``dashboard`` command: serve until SIGINT/SIGTERM/SIGHUP."""
    try:
        from .dashboard import Dashboard, serve_dashboard
        from .dashboard.server import config_from_environment
    except ImportError as exc:
        raise StartupError(
            f"the dashboard needs the 'dashboard' extra ({exc}): "
            "pip install 'respire-actors[dashboard]'"
        ) from exc
    dead_streams: dict[str, str] = {}
    for item in args.dead_stream or ():
        queue, sep, suffix = item.partition("=")
        if not sep or not queue or not suffix:
            raise ConfigurationError(f"--dead-stream takes QUEUE=SUFFIX, got {item!r}")
        dead_streams[queue] = suffix
    config = config_from_environment(
        queues=tuple(args.queue) if args.queue else None,
        basic_user=args.basic_user,
        read_only=args.read_only,
        show_payloads=args.show_payloads,
        dead_streams=dead_streams,
    )
    signals_to_stop = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    with anyio.open_signal_receiver(*signals_to_stop) as signals:
        async with connect_when_loaded(url) as client, anyio.create_task_group() as tg:
            dashboard = Dashboard(config, client=client)
            bound = await tg.start(
                lambda **kw: serve_dashboard(dashboard, host=args.host, port=args.port, **kw)
            )
            phase["started"] = True
            if _gate is not None:
                _gate.release()
            print(f"dashboard on {bound.url}", flush=True)
            async for signum in signals:
                log.warning("%s: stopping the dashboard", signal.Signals(signum).name)
                break
            tg.cancel_scope.cancel()
    return EXIT_OK


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def _failure_leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside ``exc``: exception groups (task groups) unwrapped, and supervisor
    errors replaced by the child's exception (their ``__cause__``)."""
    found: list[BaseException] = []
    pending = list(_leaves(exc))
    while pending:
        leaf = pending.pop(0)
        if isinstance(leaf, SupervisorError) and leaf.__cause__ is not None:
            pending[:0] = list(_leaves(leaf.__cause__))
        else:
            found.append(leaf)
    return found


def root_cause(exc: BaseException) -> BaseException:
    """The exception that explains a failure: exception groups (task groups) are unwrapped,
    supervisor errors give way to the child's exception (their ``__cause__``), and a
    respire_actors error is preferred over anything else found."""
    candidates = [
        leaf
        for leaf in _failure_leaves(exc)
        # trio's Cancelled, asyncio's CancelledError: a consequence, not a cause
        if not (isinstance(leaf, asyncio.CancelledError) or type(leaf).__name__ == "Cancelled")
    ]
    for candidate in candidates:
        if isinstance(candidate, RespireError):
            return candidate
    return candidates[0] if candidates else exc


def _exit_request(exc: BaseException) -> SystemExit | KeyboardInterrupt | None:
    """A ``SystemExit`` (else a ``KeyboardInterrupt``) inside ``exc``'s exception groups or a
    supervisor error's cause, if there is one."""
    leaves = _failure_leaves(exc)
    exits = [leaf for leaf in leaves if isinstance(leaf, SystemExit)]
    if exits:
        return exits[0]
    return next((leaf for leaf in leaves if isinstance(leaf, KeyboardInterrupt)), None)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def explain(exc: BaseException, url: str | None) -> str:
    """One line: what failed and what to do about it."""
    text = str(exc) or type(exc).__name__
    try:
        settings = ConnectionSettings.from_url(url) if url else None
    except ConfigurationError:
        settings = None
    where = settings.describe() if settings else "the server"
    where_set = f"--redis-url or ${DEFAULT_URL_ENV}"
    names = " ".join(type(e).__name__ for e in _chain(exc)).lower()
    lowered = text.lower()
    if isinstance(exc, (ConfigurationError, ServerError)) and (
        "credential" in lowered or "auth" in names or "noauth" in lowered
    ):
        if settings is not None and settings.password is None:
            return (
                f"{where} requires a password: put it in the URL "
                f"(redis://[USER]:PASSWORD@host:port) given with {where_set}"
            )
        return f"{where} refused the user name or password: check them in {where_set}"
    if "like a redis server" in lowered:
        return f"{text} (the server is set with {where_set})"
    if (
        "protocol error" in lowered
        or "protocol" in names
        or "invalidresponse" in names
        or "connection lost while receiving" in lowered  # closed on us instead of replying
    ):
        return (
            f"{where} did not answer like a Redis server ({text}): check the host and port "
            f"in {where_set}"
        )
    if isinstance(exc, RespireError):
        if isinstance(exc, RedisUnavailable):
            return (
                f"{text} (the server is set with {where_set}; with neither, serve starts an "
                "embedded server)"
            )
        return text
    return f"{type(exc).__name__}: {text}"


def _configure_logging(level_name: str) -> int:
    global _gate
    level = level_name.strip().lower()
    if level not in LOG_LEVELS:
        raise StartupError(
            f"unknown log level {level_name!r}: use one of {', '.join(LOG_LEVELS)} "
            f"(--log-level or ${LOG_LEVEL_ENV})"
        )
    numeric = int(getattr(logging, level.upper()))
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    _gate = _StartupLogGate(handler, hold=numeric > logging.DEBUG)
    handler.addFilter(_gate)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    return numeric


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    level = logging.INFO
    phase = {"started": False}
    url: str | None = getattr(args, "redis_url", None) or os.environ.get(DEFAULT_URL_ENV) or None
    try:
        level = _configure_logging(
            getattr(args, "log_level", None) or os.environ.get(LOG_LEVEL_ENV) or "info"
        )
        if url:
            ConnectionSettings.from_url(url)  # a bad URL is a start-up error, said at once
        if args.command == "serve":
            app = load_app(args.app)
            config = ServeConfig(
                app,
                url,
                args.data_dir,
                shutdown_timeout=args.shutdown_timeout,
                stats_interval=args.stats_interval,
            )
            return anyio.run(_serve_with_signals, config, phase, backend=args.backend)
        if args.command == "dashboard":
            if not url:
                raise StartupError(f"the dashboard needs --redis-url or ${DEFAULT_URL_ENV}")
            return anyio.run(run_dashboard, args, url, phase, backend=args.backend)
        if args.command == "chaos":
            return anyio.run(run_chaos, args, url, phase, backend=args.backend)
        if args.command in ADMIN_COMMANDS:
            return anyio.run(_admin, args, url, phase, backend=args.backend)
        return anyio.run(ping, url, args.data_dir, backend=args.backend)
    except KeyboardInterrupt:
        # interrupting 'events --follow' is how it ends
        return EXIT_OK if getattr(args, "follow", False) else EXIT_FAILURE
    except BaseException as exc:
        if isinstance(exc, SystemExit):
            raise
        exit_request = _exit_request(exc)
        if isinstance(exit_request, SystemExit):
            # sys.exit() in an app or a handler, wrapped by a task group on the way out (trio
            # wraps it, asyncio does not): the process exits with its code on both backends
            raise exit_request from None
        if exit_request is not None:  # a KeyboardInterrupt, wrapped the same way
            return EXIT_OK if getattr(args, "follow", False) else EXIT_FAILURE
        cause = root_cause(exc)
        if _gate is not None and not phase["started"]:
            _gate.drop()
        if level <= logging.DEBUG:
            traceback.print_exception(exc, file=sys.stderr)
        print(f"error: {explain(cause, url)}", file=sys.stderr)
        return EXIT_FAILURE if phase["started"] else EXIT_STARTUP


def console_main() -> None:
    sys.exit(main())


__all__ = [
    "App",
    "ServeConfig",
    "StartupError",
    "load_app",
    "main",
    "render_snapshot",
    "root_cause",
    "serve",
]
