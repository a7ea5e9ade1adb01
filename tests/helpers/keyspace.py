"""Unique names and key clean-up. Servers are shared: never FLUSHALL/FLUSHDB, delete by pattern."""

from __future__ import annotations

from uuid import uuid4

import anyio
import anyio.to_thread

from respire_actors.keys import queue_registry
from respire_actors.redis.client import RedisClient

from .resp import SyncRedis


def new_name(prefix: str = "t") -> str:
    """A unique queue name / key prefix such as ``t-3f2a9c1b7d4e`` (glob-safe, no braces)."""
    return f"{prefix}-{uuid4().hex[:12]}"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def delete_matching(client: RedisClient, pattern: str, *, batch: int = 500) -> int:
    """Delete every key matching the glob ``pattern`` with SCAN + UNLINK; return the count.
    Queue names matching it are removed from the (shared) queue registry too.

    On a cluster client, scan every master (SCAN is per node) through plain connections.
    """
    await forget_registered(client, pattern)
    if client.is_cluster:
        deleted = 0
        for host, port in await cluster_masters(client):
            deleted += await anyio.to_thread.run_sync(_delete_on_node, host, port, pattern, batch)
        return deleted
    deleted = 0
    cursor: bytes = b"0"
    while True:
        cursor, keys = await client.execute("SCAN", cursor, "MATCH", pattern, "COUNT", batch)
        if keys:
            deleted += int(await client.execute("UNLINK", *keys))
        if _text(cursor) == "0":
            return deleted


def _delete_on_node(host: str, port: int, pattern: str, batch: int) -> int:
    with SyncRedis(host, port) as conn:
        return delete_matching_sync(conn, pattern, batch=batch, cluster=True)


def delete_matching_sync(
    conn: SyncRedis, pattern: str, *, batch: int = 500, cluster: bool = False
) -> int:
    """SCAN + UNLINK on one connection. With ``cluster`` keys are unlinked one by one
    (keys found on one node may live in different slots)."""
    deleted = 0
    cursor: object = b"0"
    while True:
        cursor, keys = conn.execute("SCAN", _text(cursor), "MATCH", pattern, "COUNT", batch)
        if keys:
            if cluster:
                for key in keys:
                    deleted += int(conn.execute("UNLINK", key))
            else:
                deleted += int(conn.execute("UNLINK", *keys))
        if _text(cursor) == "0":
            return deleted


async def forget_registered(client: RedisClient, pattern: str) -> int:
    """Remove the job queue names matching the glob ``pattern`` from the queue registry
    (workers register their queues there; the set itself is shared by every test)."""
    key = queue_registry(client.key_prefix)
    removed = 0
    cursor: object = b"0"
    while True:
        cursor, names = await client.execute("SSCAN", key, cursor, "MATCH", pattern)
        if names:
            removed += int(await client.execute("SREM", key, *names))
        if _text(cursor) == "0":
            return removed


async def cluster_masters(client: RedisClient) -> list[tuple[str, int]]:
    """(host, port) of every master, from CLUSTER SLOTS."""
    reply = await client.execute("CLUSTER", "SLOTS")
    masters = {(_text(entry[2][0]), int(entry[2][1])) for entry in reply}
    return sorted(masters)
