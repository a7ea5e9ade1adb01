"""Unique names and key clean-up. Servers are shared: never FLUSHALL/FLUSHDB, delete by pattern.

Each test's keys go when it ends (``release_keys``): at once on the servers the test session
started itself, whose keyspace holds only tests' keys. On the machine's shared Redis (6379) a
SCAN walks the whole keyspace, and that Redis may hold anything: 500,000 leftover benchmark keys
made every test's clean-up a thousand round trips and the Redis half of the suite 4.5 times
slower. There the keys are collected instead and deleted in one pass when the session ends
(``sweep_deferred``); the queue registry entries still go at once.
"""

from __future__ import annotations

import re
from collections import defaultdict
from uuid import uuid4

import anyio
import anyio.to_thread

from respire_actors.keys import queue_registry
from respire_actors.redis.client import ConnectionSettings, RedisClient

from .resp import SyncRedis, sync_redis_for

_TOKEN = re.compile(rb"(?<![0-9a-f])[0-9a-f]{12}")  # the start of a run of hex digits
_shared: dict[tuple[str, int, int], str] = {}  # (host, port, db) -> URL of a shared server
_deferred: dict[str, dict[bytes, set[bytes]]] = defaultdict(lambda: defaultdict(set))


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


def share(url: str) -> None:
    """Mark the server of ``url`` as shared with the rest of the machine (see the module)."""
    settings = ConnectionSettings.from_url(url)
    if not settings.cluster and settings.unix_socket_path is None:
        _shared[(settings.host, settings.port, settings.db)] = url


async def release_keys(client: RedisClient, pattern: str) -> None:
    """Delete the keys matching ``pattern`` (``*<literal>*``) now, or, on a shared server, at the
    end of the session (``sweep_deferred``); forget the matching registered queues now."""
    s = client.settings
    if client.is_cluster or not _defer((s.host, s.port, s.db), pattern):
        await delete_matching(client, pattern)
    else:
        await forget_registered(client, pattern)


def release_keys_sync(url: str, pattern: str) -> None:
    """``release_keys`` for a URL, from synchronous code (the registry is left alone)."""
    s = ConnectionSettings.from_url(url)
    if s.cluster or not _defer((s.host, s.port, s.db), pattern):
        with sync_redis_for(url) as conn:
            delete_matching_sync(conn, pattern)


def _defer(endpoint: tuple[str, int, int], pattern: str) -> bool:
    url = _shared.get(endpoint)
    literal = pattern.strip("*").encode()
    tokens = _TOKEN.findall(literal)
    if url is None or not (pattern.startswith("*") and pattern.endswith("*")) or not tokens:
        return False
    if any(c in literal for c in b"*?[\\"):  # a glob inside: not a plain substring
        return False
    _deferred[url][tokens[0]].add(literal)
    return True


def sweep_deferred(*, batch: int = 5000) -> int:
    """One SCAN pass per shared server deleting every key a released pattern matched."""
    deleted = 0
    for url, by_token in _deferred.items():
        with sync_redis_for(url, timeout=30.0) as conn:
            cursor: object = b"0"
            while True:
                cursor, keys = conn.execute("SCAN", _text(cursor), "COUNT", batch)
                doomed = [key for key in keys if _released(key, by_token)]
                if doomed:
                    deleted += int(conn.execute("UNLINK", *doomed))
                if _text(cursor) == "0":
                    break
    _deferred.clear()
    return deleted


def _released(key: bytes, by_token: dict[bytes, set[bytes]]) -> bool:
    for token in _TOKEN.findall(key):
        for literal in by_token.get(token, ()):
            if literal in key:
                return True
    return False
