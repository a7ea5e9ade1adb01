"""Batches of jobs with completion callbacks (placeholder until batches land: no batch exists,
so no member is ever cancelled)."""

from __future__ import annotations

from ..keys import JobQueueKeys
from ..redis.client import RedisClient


async def cancellation_requested(client: RedisClient, keys: JobQueueKeys, batch_id: str) -> bool:
    """True when cancellation of ``batch_id`` was requested (its members must not start)."""
    return False
