"""Throwaway valkey-server processes (single nodes and a small cluster) for tests.

Started synchronously with :mod:`subprocess` so session fixtures can own them whatever anyio
backend a test runs on. Every process is started in its own data directory, listens on loopback
only, keeps no data (no AOF, no RDB) unless asked, and is terminated (then killed) on stop.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from respire_actors.chaos import cluster as cluster_admin
from respire_actors.chaos.cluster import CLUSTER_SLOTS, key_slot, slot_ranges
from respire_actors.embedded import free_port, valkey_binary

from .resp import RespError, SyncRedis, info_fields

__all__ = [
    "CLUSTER_SLOTS",
    "Cluster",
    "ServerStartError",
    "ValkeyProcess",
    "key_slot",
    "port_is_free",
    "running_valkey",
    "short_tmp_dir",
    "slot_ranges",
    "start_cluster",
    "start_valkey",
    "wait_cluster_ok",
    "server_binary",
    "CHAOS_PAIRS",
]


class ServerStartError(RuntimeError):
    """A test server did not come up."""


@dataclass
class ValkeyProcess:
    """One running valkey-server. ``url`` is its ``redis://`` (or ``unix://``) address."""

    process: subprocess.Popen[bytes]
    port: int
    data_dir: Path
    unix_socket: str | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    @property
    def unix_url(self) -> str:
        if self.unix_socket is None:
            raise RuntimeError("this server was started without --unixsocket")
        return f"unix://{self.unix_socket}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def sync_client(self, timeout: float = 5.0) -> SyncRedis:
        return SyncRedis("127.0.0.1", self.port, timeout=timeout)

    def execute(self, *args: str | bytes | int | float) -> object:
        """Run one command on a fresh connection (set-up and assertions)."""
        with self.sync_client() as conn:
            return conn.execute(*args)

    def log_tail(self, lines: int = 10) -> str:
        try:
            text = (self.data_dir / "valkey.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; always reaps the process."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        else:
            self.process.wait()


def _answers_as(port: int, pid: int) -> bool:
    """True when the server on ``port`` is the process ``pid`` (not a port squatter)."""
    try:
        with SyncRedis("127.0.0.1", port, timeout=1.0) as conn:
            fields = info_fields(conn.execute("INFO", "server"))
    except (OSError, RespError):
        return False
    return fields.get("process_id") == str(pid)


def start_valkey(
    data_dir: Path,
    *extra_args: str,
    port: int | None = None,
    unix_socket: str | None = None,
    ready_timeout: float = 10.0,
    attempts: int = 3,
) -> ValkeyProcess:
    """Start valkey-server in ``data_dir`` and wait until it answers as itself.

    ``port`` None picks a free port (retrying on the rare lost race for it). Raises
    :class:`ServerStartError` with the server's log when it does not come up.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    last_error = ""
    for _ in range(attempts if port is None else 1):
        chosen = port or free_port()
        cmd = [
            str(valkey_binary()),
            "--port",
            str(chosen),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(data_dir),
            "--logfile",
            "valkey.log",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--enable-debug-command",
            "local",
            *(("--unixsocket", unix_socket, "--unixsocketperm", "700") if unix_socket else ()),
            *extra_args,
        ]
        process = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        server = ValkeyProcess(process, chosen, data_dir, unix_socket)
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline and process.poll() is None:
            if _answers_as(chosen, process.pid):
                return server
            time.sleep(0.01)
        last_error = server.log_tail() or f"exit code {process.poll()}"
        server.stop()
    raise ServerStartError(f"valkey-server did not start in {data_dir}: {last_error}")


@contextlib.contextmanager
def running_valkey(data_dir: Path, *extra_args: str, **kwargs: object) -> Iterator[ValkeyProcess]:
    server = start_valkey(data_dir, *extra_args, **kwargs)  # type: ignore[arg-type]
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Cluster:
    """A running Redis Cluster of valkey-server masters and, once added, their replicas.

    The bootstrap, replica and migration steps are the chaos suite's
    (:mod:`respire_actors.chaos.cluster`): one implementation for the product and the tests.
    """

    nodes: list[ValkeyProcess] = field(default_factory=list)
    replicas: list[ValkeyProcess] = field(default_factory=list)
    base_dir: Path | None = None

    @property
    def url(self) -> str:
        """``redis+cluster://`` URL listing every master as a startup node."""
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        return f"redis+cluster://{hosts}"

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]

    def node_for_slot(self, slot: int) -> ValkeyProcess:
        for node, (start, end) in zip(self.nodes, slot_ranges(len(self.nodes)), strict=True):
            if start <= slot <= end:
                return node
        raise ValueError(slot)

    def owner_of(self, slot: int) -> ValkeyProcess:
        """The node serving ``slot`` now (after migrations, unlike :meth:`node_for_slot`)."""
        return cluster_admin.owner_of([*self.nodes, *self.replicas], slot)  # type: ignore[return-value]

    def add_replica(self, master: ValkeyProcess) -> ValkeyProcess:
        """Start a node, CLUSTER MEET it, CLUSTER REPLICATE ``master``, wait for its sync."""
        if self.base_dir is None:
            raise RuntimeError("this cluster was not started by start_cluster")
        index = len(self.nodes) + len(self.replicas)
        replica = _start_node(self.base_dir, index)
        try:
            cluster_admin.add_replica([*self.nodes, *self.replicas], replica, master)
        except BaseException:
            replica.stop()
            raise
        self.replicas.append(replica)
        return replica

    def migrate_slot(
        self,
        slot: int,
        target: ValkeyProcess,
        *,
        hold: float = 0.0,
        last: Sequence[str] = (),
        step_pause: float = 0.0,
    ) -> int:
        """Move ``slot`` to ``target`` the way an operator does (SETSLOT IMPORTING/MIGRATING,
        MIGRATE key by key, SETSLOT NODE everywhere). Keys named in ``last`` move only after
        ``hold`` seconds, so the slot stays half-migrated that long (what a slot holding many
        keys looks like to clients); ``step_pause`` sleeps between keys. Returns keys moved."""
        return cluster_admin.migrate_slot(
            [*self.nodes, *self.replicas], slot, target, hold=hold, last=last, step_pause=step_pause
        )

    def stop(self) -> None:
        for node in (*self.nodes, *self.replicas):
            node.stop()


def _start_node(base_dir: Path, index: int, attempts: int = 3) -> ValkeyProcess:
    """One cluster-enabled node. Both its ports are picked free; when another process (another
    xdist worker, an outgoing connection) takes the bus port first, retry with fresh ports
    (``start_valkey`` only re-picks the client port)."""
    for attempt in range(attempts):
        args = cluster_admin.cluster_node_args(free_port(), f"nodes-{index}.conf", 5000)
        try:
            return start_valkey(base_dir / f"node-{index}", *args, attempts=1)
        except ServerStartError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def start_cluster(base_dir: Path, masters: int = 3, *, timeout: float = 20.0) -> Cluster:
    """Start ``masters`` cluster-enabled nodes, assign slots, MEET them, wait for state ok.

    Done by hand (CLUSTER ADDSLOTSRANGE + CLUSTER MEET) so it needs no redis-cli.
    """
    cluster = Cluster(base_dir=base_dir)
    try:
        for i in range(masters):
            cluster.nodes.append(_start_node(base_dir, i))
        cluster_admin.bootstrap_cluster(cluster.nodes, timeout=timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def wait_cluster_ok(nodes: Sequence[ValkeyProcess], *, timeout: float = 20.0) -> None:
    """Wait until every node reports ``cluster_state:ok`` and knows every other node."""
    cluster_admin.wait_cluster_ok(nodes, timeout=timeout)


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def short_tmp_dir(prefix: str = "ra-") -> Path:
    """A short directory under /tmp (unix socket paths are limited to ~107 bytes)."""
    import tempfile

    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp" if os.path.isdir("/tmp") else None))


def server_binary(server: str) -> Path | None:
    """The binary chaos scenarios start their own servers from: None for ``valkey`` (the
    embedded valkey-server), the system's redis-server for ``redis`` (skips without one)."""
    if server == "valkey":
        return None
    import shutil

    import pytest

    found = shutil.which("redis-server")
    if found is None:
        pytest.skip("no redis-server on PATH")
    return Path(found)


CHAOS_PAIRS = [("asyncio", "valkey"), ("trio", "redis")]
"""(anyio backend, server) pairs the process-heavy chaos scenario tests run on."""
