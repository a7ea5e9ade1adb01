"""The registry of job queue names: a set that workers add their queues to when they start.

Listing queues never uses KEYS or SCAN over the key space: a queue is known once a worker for
it has started (or :func:`register_queue` was called), and stays known until
:func:`unregister_queue` removes it.
"""

from __future__ import annotations

import logging

from .errors import ValidationError
from .keys import queue_registry, validate_name
from .redis.client import RedisClient

log = logging.getLogger("respire_actors.admin")


def _check_client(client: object) -> RedisClient:
    if not isinstance(client, RedisClient):
        raise ValidationError(f"client must be a RedisClient, got {type(client).__name__}")
    return client


async def register_queue(client: RedisClient, name: str) -> bool:
    """Add a job queue name to the registry (SADD; safe to repeat). Returns True when it was
    new. Workers call this at start for each job queue they consume."""
    _check_client(client)
    validate_name(name)
    added = int(await client.execute("SADD", queue_registry(client.key_prefix), name)) == 1
    if added:
        log.debug("registered job queue %r", name)
    return added


async def unregister_queue(client: RedisClient, name: str) -> bool:
    """Remove a job queue name from the registry (its keys are left alone). Returns True when
    it was registered. A worker that starts for it registers it again."""
    _check_client(client)
    validate_name(name)
    removed = int(await client.execute("SREM", queue_registry(client.key_prefix), name)) == 1
    if removed:
        log.info("unregistered job queue %r", name)
    return removed


async def list_queues(client: RedisClient) -> list[str]:
    """Every registered job queue name, sorted (one SMEMBERS of the registry set)."""
    _check_client(client)
    members = await client.execute("SMEMBERS", queue_registry(client.key_prefix))
    names = [m.decode("utf-8", "replace") if isinstance(m, bytes) else str(m) for m in members]
    return sorted(names)
