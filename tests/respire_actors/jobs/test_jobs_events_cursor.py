"""Event-reader cursors ("$" and validation) and dead-letter reads."""

from __future__ import annotations

import anyio
import pytest
from jobs_helpers import forbid_commands

from respire_actors.errors import ValidationError
from respire_actors.jobs import JobQueue
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


async def _event(client: RedisClient, queue: JobQueue[str], job_id: str) -> None:
    await client.execute(
        "XADD",
        queue.keys.events,
        "*",
        "kind",
        "completed",
        "job_id",
        job_id,
        "entry_id",
        "1-0",
        "attempt",
        "1",
    )


async def test_dollar_cursor_skips_retained_events_and_sees_new_ones(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await _event(client, queue, "old-1")
    await _event(client, queue, "old-2")
    async with queue.read_events("$") as events:
        await _event(client, queue, "new")
        with anyio.fail_after(10):
            first = await events.__anext__()
    assert first.job_id == "new"


async def test_dollar_cursor_on_an_empty_stream_sees_the_first_event(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    async with queue.read_events("$") as events:
        await _event(client, queue, "first")
        with anyio.fail_after(10):
            event = await events.__anext__()
    assert event.job_id == "first"


@pytest.mark.parametrize("cursor", ["", "abc", "1-x", "-1", "$$", "1-0\n", 5])
async def test_bad_cursors_raise_before_any_command(
    client: RedisClient, queue: JobQueue[str], cursor: object
) -> None:
    with forbid_commands(client), pytest.raises(ValidationError):
        async with queue.read_events(cursor):  # type: ignore[arg-type]
            pass


@pytest.mark.parametrize("count", [0, 10_001, True, 1.5])
async def test_read_dead_letters_validates_count(
    client: RedisClient, queue: JobQueue[str], count: object
) -> None:
    with forbid_commands(client), pytest.raises(ValidationError):
        await queue.read_dead_letters(count)  # type: ignore[arg-type]


async def test_read_dead_letters_rejects_a_bad_stream_suffix(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    with forbid_commands(client), pytest.raises(ValidationError):
        await queue.read_dead_letters(10, stream="{other}")
