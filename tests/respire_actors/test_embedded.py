"""The embedded valkey-server: lifecycle, persistence, the data-dir lock, and clear failures."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import anyio
import anyio.abc
import pytest
from helpers.resp import info_fields
from helpers.servers import ValkeyProcess

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


def accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def test_start_and_stop(tmp_path: Path) -> None:
    config = EmbeddedConfig(data_dir=tmp_path, persistent=False)
    async with open_embedded_server(config) as url:
        assert url.startswith("redis://127.0.0.1:")
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
    with anyio.fail_after(10), pytest.raises(EmbeddedServerError, match="did not start"):
        await run_embedded_server(config)


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
