"""Build, grow and reconfigure a small Redis Cluster by hand (no redis-cli needed).

Every function works on *admin nodes*: anything with a ``port`` and a synchronous
``execute(*args)`` (the chaos suite's :class:`~respire_actors.chaos.servers.ServerProcess` and
the tests' ``ValkeyProcess``), so the chaos scenarios and the test fixtures share one bootstrap:
:func:`bootstrap_cluster` (slots + MEET), :func:`add_replica` (MEET + ``CLUSTER REPLICATE`` +
wait for the initial sync), :func:`migrate_slot` (the operator's resharding steps) and
:func:`failover` (``CLUSTER FAILOVER`` [FORCE|TAKEOVER] on a replica, waiting for the promotion).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Literal, Protocol

from .admin import info_fields

CLUSTER_SLOTS = 16384


class ClusterSetupError(RuntimeError):
    """A cluster (or a replica) did not reach the expected state in time."""


class AdminNode(Protocol):
    @property
    def port(self) -> int: ...

    def execute(self, *args: str | bytes | int | float) -> Any: ...


def text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def cluster_node_args(bus_port: int, config_file: str, node_timeout_ms: int = 5000) -> list[str]:
    """The server arguments of a cluster node (its bus port and nodes.conf name)."""
    return [
        "--cluster-enabled", "yes",
        "--cluster-config-file", config_file,
        "--cluster-port", str(bus_port),
        "--cluster-node-timeout", str(node_timeout_ms),
        "--repl-diskless-sync-delay", "0",  # a replica syncs at once (default: waits 5 s)
    ]  # fmt: skip


def slot_ranges(masters: int) -> list[tuple[int, int]]:
    """Split the 16384 slots into ``masters`` contiguous ranges."""
    step = CLUSTER_SLOTS // masters
    ranges = []
    for i in range(masters):
        start = i * step
        end = CLUSTER_SLOTS - 1 if i == masters - 1 else start + step - 1
        ranges.append((start, end))
    return ranges


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


def node_id(node: AdminNode) -> str:
    return text(node.execute("CLUSTER", "MYID"))


def _meet(first: AdminNode, other: AdminNode) -> None:
    bus_port = int(other.execute("CONFIG", "GET", "cluster-port")[1])
    first.execute("CLUSTER", "MEET", "127.0.0.1", other.port, bus_port)


def bootstrap_cluster(masters: Sequence[AdminNode], *, timeout: float = 20.0) -> None:
    """Give each of ``masters`` (started cluster-enabled, empty) a contiguous slot range, MEET
    them and wait for ``cluster_state:ok`` everywhere."""
    for node, (start, end) in zip(masters, slot_ranges(len(masters)), strict=True):
        node.execute("CLUSTER", "ADDSLOTSRANGE", start, end)
    for other in masters[1:]:
        _meet(masters[0], other)
    wait_cluster_ok(masters, timeout=timeout)


def wait_cluster_ok(
    nodes: Sequence[AdminNode], *, known: int | None = None, timeout: float = 20.0
) -> None:
    """Wait until every node reports ``cluster_state:ok``, all slots served and ``known``
    nodes (default: ``len(nodes)``)."""
    expected = str(known if known is not None else len(nodes))
    deadline = time.monotonic() + timeout
    states: dict[int, dict[str, str]] = {}
    while time.monotonic() < deadline:
        for node in nodes:
            states[node.port] = info_fields(node.execute("CLUSTER", "INFO"))
        if all(
            s.get("cluster_state") == "ok"
            and s.get("cluster_known_nodes") == expected
            and s.get("cluster_slots_ok") == str(CLUSTER_SLOTS)
            for s in states.values()
        ):
            return
        time.sleep(0.05)
    summary = {p: (s.get("cluster_state"), s.get("cluster_known_nodes")) for p, s in states.items()}
    raise ClusterSetupError(f"cluster did not reach state ok within {timeout}s: {summary}")


def replication(node: AdminNode) -> dict[str, str]:
    """``INFO replication`` as a dict."""
    return info_fields(node.execute("INFO", "replication"))


def wait_replica_synced(replica: AdminNode, *, timeout: float = 20.0) -> None:
    """Wait until ``replica`` has its link to its primary up and the initial sync done."""
    deadline = time.monotonic() + timeout
    fields: dict[str, str] = {}
    while time.monotonic() < deadline:
        fields = replication(replica)
        if (
            fields.get("role") == "slave"
            and fields.get("master_link_status") == "up"
            and fields.get("master_sync_in_progress") == "0"
        ):
            return
        time.sleep(0.05)
    raise ClusterSetupError(f"replica :{replica.port} did not sync within {timeout}s: {fields}")


def replication_lag(primary: AdminNode, replica: AdminNode) -> int:
    """Bytes of the replication stream the primary has and the replica has not processed
    (``master_repl_offset`` minus the replica's ``slave_repl_offset``)."""
    ahead = int(replication(primary)["master_repl_offset"])
    behind = int(replication(replica).get("slave_repl_offset", 0))
    return max(0, ahead - behind)


def add_replica(
    cluster: Sequence[AdminNode], replica: AdminNode, master: AdminNode, *, timeout: float = 20.0
) -> None:
    """Join ``replica`` (a started, empty cluster-enabled node) to ``cluster`` as a replica of
    ``master``: MEET, wait until it knows the master, ``CLUSTER REPLICATE``, wait for the
    initial sync and for every node to see the new member."""
    _meet(cluster[0], replica)
    master_id = node_id(master)
    deadline = time.monotonic() + timeout
    while True:
        try:
            replica.execute("CLUSTER", "REPLICATE", master_id)
            break
        except Exception:  # "Unknown node" until the gossip reached the replica
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    wait_replica_synced(replica, timeout=timeout)
    members = [*cluster, replica]
    wait_cluster_ok(members, timeout=max(1.0, deadline - time.monotonic()))


def owner_of(nodes: Sequence[AdminNode], slot: int) -> AdminNode:
    """The node serving ``slot`` now, as the first answering node sees it."""
    for asked in nodes:
        try:
            rows = asked.execute("CLUSTER", "SLOTS")
        except OSError:
            continue  # a killed node
        for row in rows:
            if int(row[0]) <= slot <= int(row[1]):
                port = int(row[2][1])
                return next(n for n in nodes if n.port == port)
        break
    raise ValueError(f"no node serves slot {slot}")


def migrate_slot(
    nodes: Sequence[AdminNode],
    slot: int,
    target: AdminNode,
    *,
    hold: float = 0.0,
    last: Sequence[str | bytes] = (),
    step_pause: float = 0.0,
) -> int:
    """Move ``slot`` to ``target`` the way an operator does (SETSLOT IMPORTING/MIGRATING,
    MIGRATE key by key, SETSLOT NODE everywhere). Keys named in ``last`` move only after
    ``hold`` seconds, so the slot stays half-migrated that long (what a slot holding many keys
    looks like to clients); ``step_pause`` sleeps between keys. Returns the keys moved."""
    source = owner_of(nodes, slot)
    if source.port == target.port:
        raise ValueError("the slot is already on the target")
    source_id, target_id = node_id(source), node_id(target)
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
        early = [k for k in keys if k not in held]
        for key in early:
            move(key)
        if not early and time.monotonic() >= deadline:
            break
        if not early:
            time.sleep(0.05)
    for key in source.execute("CLUSTER", "GETKEYSINSLOT", slot, 100000):
        move(key)
    for node in (target, source, *[n for n in _masters(nodes) if n not in (source, target)]):
        node.execute("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    return moved


def _masters(nodes: Sequence[AdminNode]) -> list[AdminNode]:
    masters = []
    for node in nodes:
        try:
            if replication(node).get("role") == "master":
                masters.append(node)
        except OSError:
            continue  # a killed node
    return masters


def _sees_master(node: AdminNode, member: AdminNode) -> bool:
    """True when ``node``'s CLUSTER NODES lists ``member`` as a master (or ``node`` is down)."""
    try:
        lines = text(node.execute("CLUSTER", "NODES")).splitlines()
    except OSError:
        return True
    for line in lines:
        fields = line.split()
        if len(fields) > 2 and fields[1].split("@")[0].endswith(f":{member.port}"):
            return "master" in fields[2].split(",")
    return False


def failover(
    replica: AdminNode,
    mode: Literal["graceful", "FORCE", "TAKEOVER"] = "graceful",
    *,
    cluster: Sequence[AdminNode] = (),
    timeout: float = 20.0,
) -> float:
    """``CLUSTER FAILOVER`` [FORCE|TAKEOVER] on ``replica``; wait until it reports itself a
    master and every reachable node of ``cluster`` sees it as one. Returns the seconds the
    promotion took. A graceful failover pauses the old master's clients until the replica has
    caught up, so it loses no acknowledged write."""
    started = time.monotonic()
    replica.execute("CLUSTER", "FAILOVER", *(() if mode == "graceful" else (mode,)))
    fields: dict[str, str] = {}
    while time.monotonic() - started < timeout:
        fields = replication(replica)
        if fields.get("role") == "master" and all(_sees_master(n, replica) for n in cluster):
            return time.monotonic() - started
        time.sleep(0.02)
    raise ClusterSetupError(f"replica :{replica.port} not promoted ({mode}) in {timeout}s")
