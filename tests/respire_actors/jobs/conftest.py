"""Fixtures for the job queue tests, on top of the shared harness in ``tests/conftest.py``
(real servers, both anyio backends; the ``client`` fixture deletes every key containing
``unique_name`` afterwards, so queues named ``unique_name`` clean up after themselves)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from jobs_helpers import new_runtime

from respire_actors.actors.runtime import QueueRuntime
from respire_actors.codecs import StrCodec
from respire_actors.jobs import JobQueue
from respire_actors.redis.client import RedisClient, connect


@pytest.fixture
def queue(client: RedisClient, unique_name: str) -> JobQueue[str]:
    """A ``str`` job queue named ``unique_name``."""
    return JobQueue(client, unique_name, StrCodec())


@pytest.fixture
def make_runtime(client: RedisClient) -> Iterator[Callable[..., QueueRuntime]]:
    """``make_runtime(queue, consumer=..., options=...)``: a registration's state without
    actors, for driving :class:`Job` and the completer directly; mailboxes closed afterwards."""
    made: list[QueueRuntime] = []

    def make(queue: str, **kwargs: Any) -> QueueRuntime:
        rt = new_runtime(client, queue, **kwargs)
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.deliveries.close()
        rt.completions.close()


@pytest.fixture
async def prefixed(
    client: RedisClient, server_url: str, unique_name: str
) -> AsyncIterator[RedisClient]:
    """A client whose key prefix holds ``unique_name``: the queue registry it sees holds only
    this test's queues (the ``client`` fixture deletes every key containing the name)."""
    async with connect(f"{server_url}?key_prefix={unique_name}:") as redis:
        yield redis
