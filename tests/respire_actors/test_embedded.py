"""The embedded valkey-server: lifecycle, persistence, the data-dir lock, and clear failures."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import anyio
import anyio.abc
import pytest
from helpers.loading import fill
from helpers.resp import SyncRedis, info_fields
from helpers.servers import ValkeyProcess
from helpers.waiting import wait_until

from respire_actors import embedded
from respire_actors.embedded import (
    DATA_DIR_ENV,
    EmbeddedConfig,
    open_embedded_server,
    run_embedded_server,
)
from respire_actors.errors import EmbeddedServerError
from respire_actors.redis.client import connect

pytestmark = pytest.mark.anyio


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def config_value(reply: object) -> object:
    """The value of a one-parameter CONFIG GET reply (a map in RESP3, a pair in RESP2)."""
    if isinstance(reply, dict):
        return next(iter(reply.values()))
    return reply[1]  # type: ignore[index]


def _password(url: str) -> str:
    return unquote(urlsplit(url).password or "")


def accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def test_start_and_stop(tmp_path: Path) -> None:
    config = EmbeddedConfig(data_dir=tmp_path, persistent=False)
    async with open_embedded_server(config) as url:
        assert url.startswith("redis://:") and "@127.0.0.1:" in url
        async with connect(url) as client:
            assert await client.execute("PING") == b"PONG"
            info = info_fields(await client.execute("INFO", "server"))
            pid = int(info["process_id"])
            assert config_value(await client.execute("CONFIG", "GET", "appendonly")) == b"no"
            assert (await client.server_info()).flavor == "valkey"
    port = int(url.rsplit(":", 1)[1])
    assert not pid_alive(pid)
    assert not accepts(port)
    assert (tmp_path / "valkey.log").exists()  # its log lives in the data directory


async def test_data_survives_a_restart(tmp_path: Path) -> None:
    config = EmbeddedConfig(data_dir=tmp_path)  # persistent: AOF, fsync every second
    async with open_embedded_server(config) as url, connect(url) as client:
        await client.execute("SET", "survivor", "still here")
        await client.execute("XADD", "jobs", "*", "job", "1")
    async with open_embedded_server(config) as url, connect(url) as client:
        assert await client.execute("GET", "survivor") == b"still here"
        assert await client.execute("XLEN", "jobs") == 1
        assert config_value(await client.execute("CONFIG", "GET", "appendonly")) == b"yes"


async def test_two_servers_cannot_share_a_data_dir(tmp_path: Path) -> None:
    config = EmbeddedConfig(data_dir=tmp_path, persistent=False)
    async with open_embedded_server(config) as url:
        with pytest.raises(EmbeddedServerError, match="in use by another"):
            await run_embedded_server(config)
        async with connect(url) as client:  # the first one is unharmed
            assert await client.execute("PING") == b"PONG"
    # and the lock is released with the server
    async with open_embedded_server(config) as url, connect(url) as client:
        assert await client.execute("PING") == b"PONG"


async def test_server_killed_externally_raises(tmp_path: Path) -> None:
    config = EmbeddedConfig(data_dir=tmp_path, persistent=False)
    errors: list[EmbeddedServerError] = []

    async def supervised(*, task_status: anyio.abc.TaskStatus[str]) -> None:
        try:
            await run_embedded_server(config, task_status=task_status)
        except EmbeddedServerError as exc:
            errors.append(exc)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            url = await tg.start(supervised)
            async with connect(url) as client:
                pid = int(info_fields(await client.execute("INFO", "server"))["process_id"])
            os.kill(pid, signal.SIGKILL)
    assert len(errors) == 1
    assert "exited" in str(errors[0])


async def test_missing_binary_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded, "valkey_binary", lambda: tmp_path / "no-such-valkey-server")
    with pytest.raises(EmbeddedServerError, match="cannot run valkey-server"):
        await run_embedded_server(EmbeddedConfig(data_dir=tmp_path / "data", persistent=False))


async def test_binary_that_exits_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "fake-valkey"
    fake.write_text("#!/bin/sh\necho 'fake server refuses to start' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(embedded, "valkey_binary", lambda: fake)
    config = EmbeddedConfig(data_dir=tmp_path / "data", persistent=False, ready_timeout=5)
    with anyio.fail_after(10), pytest.raises(EmbeddedServerError, match="did not start") as info:
        await run_embedded_server(config)
    # what the server printed before any log file was open is quoted
    assert "fake server refuses to start" in str(info.value)


async def test_a_bad_config_file_is_quoted_not_an_earlier_runs_log(tmp_path: Path) -> None:
    """Found by review: valkey prints a config error on stderr (sent to /dev/null) before
    its log file is open, and the error quoted the log of the previous, healthy run."""
    config = EmbeddedConfig(data_dir=tmp_path, persistent=False, ready_timeout=5)
    async with open_embedded_server(config):
        pass  # a healthy run leaves its shutdown lines in valkey.log
    (tmp_path / "valkey.conf").write_text("maxmemory banana\n")
    with anyio.fail_after(15), pytest.raises(EmbeddedServerError, match="did not start") as info:
        await run_embedded_server(config)
    message = str(info.value)
    assert "maxmemory banana" in message or "FATAL CONFIG" in message, message
    assert "bye" not in message.lower() and "shutdown" not in message.lower(), message


async def test_port_conflict_is_a_clear_error(tmp_path: Path, valkey_server: ValkeyProcess) -> None:
    # The port is taken by another valkey-server, which would answer PING: the embedded
    # server must notice that the answer is not its own and report the failed start.
    config = EmbeddedConfig(data_dir=tmp_path, port=valkey_server.port, persistent=False)
    with anyio.fail_after(15), pytest.raises(EmbeddedServerError, match="did not start") as info:
        await run_embedded_server(config)
    assert "Address already in use" in str(info.value) or "bind" in str(info.value).lower()
    assert valkey_server.alive()


def test_data_dir_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert EmbeddedConfig(data_dir=tmp_path).resolved_dir() == tmp_path
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "from-env"))
    assert EmbeddedConfig().resolved_dir() == tmp_path / "from-env"
    monkeypatch.delenv(DATA_DIR_ENV)
    monkeypatch.chdir(tmp_path)
    assert EmbeddedConfig().resolved_dir() == tmp_path / ".respire" / "valkey"


def test_binary_is_shipped() -> None:
    binary = embedded.valkey_binary()
    assert binary.is_file()
    assert os.access(binary, os.X_OK)


# ------------------------------------------------------------------------------------------
# readiness while the data set loads (issue 8, item 1)


def load_seconds(data_dir: Path) -> float:
    """How long the last start spent loading the AOF, from the server's own log."""
    lines = (data_dir / "valkey.log").read_text().splitlines()
    loaded = [line for line in lines if "DB loaded from append only file" in line]
    return float(loaded[-1].rsplit(":", 1)[1].split()[0])


async def test_ready_means_loaded_even_when_loading_outlasts_ready_timeout(
    tmp_path: Path,
) -> None:
    # A restart replays the AOF; meanwhile the server answers INFO but refuses other commands
    # with LOADING. key-load-delay (a test-only setting, read from valkey.conf in the data
    # directory) slows the replay so that it takes several times ready_timeout.
    async with open_embedded_server(EmbeddedConfig(data_dir=tmp_path)) as url:
        await anyio.to_thread.run_sync(fill, int(url.rsplit(":", 1)[1]), 20_000, _password(url))
    (tmp_path / "valkey.conf").write_text(
        "key-load-delay 50\nloading-process-events-interval-bytes 1024\n"
    )
    slow = EmbeddedConfig(data_dir=tmp_path, ready_timeout=0.5)
    with anyio.fail_after(90):
        async with open_embedded_server(slow) as url, connect(url) as client:
            # ready was reported only once every command runs: no LOADING refusal here
            assert await client.execute("DBSIZE") == 20_000
            info = info_fields(await client.execute("INFO", "persistence"))
            assert info["loading"] == "0"
    assert load_seconds(tmp_path) > 2 * slow.ready_timeout  # the wait really was extended


async def test_probe_tells_loading_from_ready(tmp_path: Path) -> None:
    async with open_embedded_server(EmbeddedConfig(data_dir=tmp_path)) as url:
        port, password = int(url.rsplit(":", 1)[1]), _password(url)
        await anyio.to_thread.run_sync(fill, port, 5_000, password)
        async with connect(url) as client:
            pid = int(info_fields(await client.execute("INFO", "server"))["process_id"])
        ready = await embedded._probe(port, pid, password)
        assert ready.ours and ready.ready and not ready.loading
        assert not (await embedded._probe(port, pid + 1, password)).ours  # another's answer
        assert not (await embedded._probe(port, pid, "wrong")).ours  # not our password
    (tmp_path / "valkey.conf").write_text(
        "key-load-delay 1000\nloading-process-events-interval-bytes 1024\n"
    )
    # Start the server by hand (no readiness wait) and catch it loading.
    lock = embedded._open_lock(tmp_path)
    port = embedded.free_port()
    cmd = embedded._command(embedded.valkey_binary(), EmbeddedConfig(), port, tmp_path)
    config = embedded._stdin_config(tmp_path, "pw")
    process = embedded._spawn(cmd, lock.fileno(), tmp_path / embedded.START_OUTPUT, config)
    try:
        with anyio.fail_after(20):
            while not (probe := await embedded._probe(port, process.pid, "pw")).loading:
                assert not probe.ready, "the server finished loading before we looked"
                await anyio.sleep(0.02)
        assert probe.ours and not probe.ready
    finally:
        await embedded._stop(process, 10)
        lock.close()


def test_a_server_that_exits_before_reading_its_configuration_is_reported_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by CI: a binary that exited before reading its stdin made the buffered write fail
    when the pipe was closed (flushed), and the start failed with 'Broken pipe' instead of the
    exit code and output. The Popen here returns only once the child has exited, which makes
    the timing certain."""

    class ExitedFirst(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            self.wait(timeout=10)

    monkeypatch.setattr(embedded.subprocess, "Popen", ExitedFirst)
    lock = embedded._open_lock(tmp_path)
    try:
        cmd = ["/bin/sh", "-c", "echo refuses to start; exit 3"]
        process = embedded._spawn(cmd, lock.fileno(), tmp_path / "out", b"# config\n")
        assert process.wait(timeout=10) == 3
        assert (tmp_path / "out").read_text() == "refuses to start\n"
    finally:
        lock.close()


# ------------------------------------------------------------------------------------------
# the data-directory lock and orphans (issue 8, item 2; serve-level tests in test_serve_*.py)


def running(pid: int) -> bool:
    return embedded._pid_alive(pid)


def lock_is_free(data_dir: Path) -> bool:
    with open(data_dir / embedded.LOCK_FILE, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(handle, fcntl.LOCK_UN)
        return True


async def test_the_server_itself_holds_the_lock(tmp_path: Path) -> None:
    async with open_embedded_server(EmbeddedConfig(data_dir=tmp_path, persistent=False)):
        record = embedded.read_record(tmp_path)
        assert record is not None and record.owner_pid == os.getpid()
        fds = f"/proc/{record.server_pid}/fd"
        if os.path.isdir(fds):  # noqa: ASYNC240 - Linux: valkey-server has the lock file open (inherited)
            targets = {os.readlink(os.path.join(fds, fd)) for fd in os.listdir(fds)}
            assert str(tmp_path / embedded.LOCK_FILE) in targets
        assert not lock_is_free(tmp_path)
    assert lock_is_free(tmp_path)
    assert embedded.read_record(tmp_path) is None  # the record goes with the server


ORPHAN_MAKER = """
import sys
import anyio
from respire_actors import embedded

embedded._USE_DEATH_SIGNAL = sys.argv[2] == "1"

async def main() -> None:
    config = embedded.EmbeddedConfig(data_dir=sys.argv[1])
    async with embedded.open_embedded_server(config) as url:
        print(url, flush=True)
        await anyio.sleep_forever()

anyio.run(main)
"""


@contextlib.contextmanager
def owner_process(
    data_dir: Path, *, death_signal: bool
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A separate Python process that runs an embedded server in ``data_dir``."""
    with subprocess.Popen(
        [sys.executable, "-c", ORPHAN_MAKER, str(data_dir), "1" if death_signal else "0"],
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().strip()
            assert url.startswith("redis://"), url
            yield proc, url
        finally:
            if proc.poll() is None:
                proc.terminate()
            proc.wait()


async def test_killed_owner_takes_its_server_along(tmp_path: Path) -> None:
    with owner_process(tmp_path, death_signal=True) as (owner, _):
        record = embedded.read_record(tmp_path)
        assert record is not None and record.owner_pid == owner.pid
        owner.kill()
    await wait_until(lambda: not running(record.server_pid), timeout=10)
    await wait_until(lambda: lock_is_free(tmp_path), timeout=10)


async def test_an_orphaned_server_is_stopped_by_the_next_start(tmp_path: Path) -> None:
    # Where no death signal exists (macOS), a server outlives its killed owner and keeps the
    # data directory locked; the next start finds it through the record and stops it.
    with owner_process(tmp_path, death_signal=False) as (owner, url):
        port = int(url.rsplit(":", 1)[1])
        with SyncRedis("127.0.0.1", port) as conn:
            conn.execute("AUTH", _password(url))
            conn.execute("SET", "survivor", "from the first server")
        record = embedded.read_record(tmp_path)
        assert record is not None
        owner.kill()
    try:
        await anyio.sleep(0.5)
        assert running(record.server_pid)  # orphaned, still serving
        assert not lock_is_free(tmp_path)  # and still holding the directory
        with anyio.fail_after(30):
            async with open_embedded_server(EmbeddedConfig(data_dir=tmp_path)) as url2:
                assert not running(record.server_pid)
                async with connect(url2) as client:
                    assert await client.execute("GET", "survivor") == b"from the first server"
    finally:
        if running(record.server_pid):  # the test failed: leave no orphan behind
            os.kill(record.server_pid, signal.SIGKILL)


async def test_a_live_owner_keeps_its_directory(tmp_path: Path) -> None:
    with (
        owner_process(tmp_path, death_signal=True) as (owner, _),
        pytest.raises(EmbeddedServerError, match=rf"in use by another process \(pid {owner.pid}\)"),
    ):
        await run_embedded_server(EmbeddedConfig(data_dir=tmp_path))


async def test_unusable_data_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(EmbeddedServerError, match=r"cannot use the data directory .*--data-dir"):
        await run_embedded_server(EmbeddedConfig(data_dir=blocker / "data"))


async def test_other_local_users_cannot_use_the_server_or_read_its_data(tmp_path: Path) -> None:
    """Found by review: any local user could connect without a password (and FLUSHALL, or
    read every job) and read the AOF. Each start now has its own password, kept only in the
    owner-only record (never on the command line), and a data directory created here is
    owner-only."""
    data = tmp_path / "data"
    async with open_embedded_server(EmbeddedConfig(data_dir=data)) as url:
        port, password = int(url.rsplit(":", 1)[1]), _password(url)
        assert len(password) >= 24
        with SyncRedis("127.0.0.1", port) as conn, pytest.raises(Exception, match="NOAUTH"):
            conn.execute("PING")
        record = embedded.read_record(data)
        assert record is not None and record.url == url
        assert (data / embedded.RECORD_FILE).stat().st_mode & 0o777 == 0o600
        assert data.stat().st_mode & 0o777 == 0o700
        cmdline = Path(f"/proc/{record.server_pid}/cmdline")
        if cmdline.exists():  # noqa: ASYNC240 - Linux only, a tiny file
            assert password.encode() not in cmdline.read_bytes()  # noqa: ASYNC240
        assert await embedded.running_server_url(data) == url
