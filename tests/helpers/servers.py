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
from typing import Any

from respire_actors.embedded import free_port, valkey_binary

from .resp import RespError, SyncRedis, info_fields

CLUSTER_SLOTS = 16384


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
    """A running Redis Cluster of valkey-server masters (no replicas)."""

    nodes: list[ValkeyProcess] = field(default_factory=list)

    @property
    def url(self) -> str:
        """``redis+cluster://`` URL listing every node as a startup node."""
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
        rows: Any = self.nodes[0].execute("CLUSTER", "SLOTS")
        for row in rows:
            if int(row[0]) <= slot <= int(row[1]):
                return next(n for n in self.nodes if n.port == int(row[2][1]))
        raise ValueError(slot)

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
        source = self.owner_of(slot)
        if source.port == target.port:
            raise ValueError("the slot is already on the target")
        source_id = _text(source.execute("CLUSTER", "MYID"))
        target_id = _text(target.execute("CLUSTER", "MYID"))
        target.execute("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        source.execute("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        held = {k.encode() if isinstance(k, str) else k for k in last}
        moved = 0
        deadline = time.monotonic() + hold

        def move(key: bytes) -> None:
            nonlocal moved
            source.execute("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", key)
            moved += 1
            if step_pause:
                time.sleep(step_pause)

        while True:
            keys = source.execute("CLUSTER", "GETKEYSINSLOT", slot, 100)
            early = [k for k in keys if k not in held]  # type: ignore[union-attr]
            for key in early:
                move(key)
            if not early and time.monotonic() >= deadline:
                break
            if not early:
                time.sleep(0.05)
        for key in source.execute("CLUSTER", "GETKEYSINSLOT", slot, 100000):  # type: ignore[union-attr]
            move(key)
        for node in (target, source, *[n for n in self.nodes if n not in (source, target)]):
            node.execute("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        return moved

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def slot_ranges(masters: int) -> list[tuple[int, int]]:
    """Split the 16384 slots into ``masters`` contiguous ranges."""
    step = CLUSTER_SLOTS // masters
    ranges = []
    for i in range(masters):
        start = i * step
        end = CLUSTER_SLOTS - 1 if i == masters - 1 else start + step - 1
        ranges.append((start, end))
    return ranges


def start_cluster(base_dir: Path, masters: int = 3, *, timeout: float = 20.0) -> Cluster:
    """Start ``masters`` cluster-enabled nodes, assign slots, MEET them, wait for state ok.

    Done by hand (CLUSTER ADDSLOTSRANGE + CLUSTER MEET) so it needs no redis-cli.
    """
    cluster = Cluster()
    try:
        for i in range(masters):
            cluster.nodes.append(_start_cluster_node(base_dir / f"node-{i}", i))
        for node, (start, end) in zip(cluster.nodes, slot_ranges(masters), strict=True):
            node.execute("CLUSTER", "ADDSLOTSRANGE", start, end)
        first = cluster.nodes[0]
        with first.sync_client() as conn:
            for other in cluster.nodes[1:]:
                bus_port = int(other.execute("CONFIG", "GET", "cluster-port")[1])  # type: ignore[index]
                conn.execute("CLUSTER", "MEET", "127.0.0.1", other.port, bus_port)
        wait_cluster_ok(cluster.nodes, timeout=timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _start_cluster_node(node_dir: Path, index: int, attempts: int = 3) -> ValkeyProcess:
    """One cluster-enabled node. Both its ports are picked free; when another process (another
    xdist worker, an outgoing connection) takes the bus port first, retry with fresh ports
    (``start_valkey`` only re-picks the client port)."""
    for attempt in range(attempts):
        try:
            return start_valkey(
                node_dir,
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                f"nodes-{index}.conf",
                "--cluster-port",
                str(free_port()),
                "--cluster-node-timeout",
                "5000",
                attempts=1,
            )
        except ServerStartError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def wait_cluster_ok(nodes: Sequence[ValkeyProcess], *, timeout: float = 20.0) -> None:
    """Wait until every node reports ``cluster_state:ok`` and knows every other node."""
    deadline = time.monotonic() + timeout
    states: dict[int, dict[str, str]] = {}
    while time.monotonic() < deadline:
        for node in nodes:
            states[node.port] = info_fields(node.execute("CLUSTER", "INFO"))  # type: ignore[arg-type]
        if all(
            s.get("cluster_state") == "ok"
            and s.get("cluster_known_nodes") == str(len(nodes))
            and s.get("cluster_slots_ok") == str(CLUSTER_SLOTS)
            for s in states.values()
        ):
            return
        time.sleep(0.05)
    summary = {p: (s.get("cluster_state"), s.get("cluster_known_nodes")) for p, s in states.items()}
    raise ServerStartError(f"cluster did not reach state ok within {timeout}s: {summary}")


def key_slot(key: str | bytes) -> int:
    """The Redis Cluster slot of ``key`` (CRC16/XMODEM of its hash tag, mod 16384)."""
    data = key.encode() if isinstance(key, str) else key
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc % CLUSTER_SLOTS


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
