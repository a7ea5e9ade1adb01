"""Per-minute completion counters (issue 13): committed by the completion scripts in the same
execution as the terminal event and acknowledgement, never twice for a replayed or stale
completion, not for retries, expiries or cancellations; a storage error leaves the delivery
pending. Minute boundaries are driven by crafting slots against the Redis clock (no sleeps)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from test_job_scripts import (
    CLAIM,
    CLAIM_GROUP_KEYS,
    GROUP,
    RETRY_KEYS,
    delivered,
    pending,
    s,
)

from respire_actors.errors import ScriptError, ValidationError, WrongKeyType
from respire_actors.jobs.metrics import read_metrics
from respire_actors.keys import JobQueueKeys
from respire_actors.redis.client import RedisClient
from respire_actors.redis.scripts import load

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
async def _clear_of_a_minute_boundary(client: RedisClient) -> None:
    """These tests record outcomes, then compare with the server's current minute: one that
    starts in a minute's last seconds waits for the next one, so the minute cannot turn
    between the writes and the comparison (a loaded CI run saw it turn and failed)."""
    sec, usec = await client.execute("TIME")
    into = int(sec) % 60 + int(usec) / 1_000_000
    if into > 50:
        await anyio.sleep(60.05 - into)


COMPLETE = load("job_complete")
FINISH = load("job_finish")
RETRY = load("job_retry")
READ = load("metrics_read")


@pytest.fixture
def keys(unique_name: str) -> JobQueueKeys:
    return JobQueueKeys(unique_name)


async def complete(
    client: RedisClient, keys: JobQueueKeys, retention: Any, *outcomes: tuple[Any, ...]
) -> list[int]:
    args: list[Any] = [GROUP, "c1", len(outcomes)]
    for outcome in outcomes:
        args += list(outcome)
    args += ["ack", retention]
    reply = await COMPLETE(client, (keys.ready, keys.events, keys.dead, *keys.lease_keys), args)
    return [int(x) for x in reply]


async def now_minute(client: RedisClient) -> int:
    sec, _ = await client.execute("TIME")
    return int(sec) // 60


async def slots(client: RedisClient, keys: JobQueueKeys) -> dict[str, str]:
    raw = await client.execute("HGETALL", keys.metrics)
    items = raw.items() if isinstance(raw, dict) else zip(raw[0::2], raw[1::2], strict=True)
    return {s(k): s(v) for k, v in items}


def counts(text: str) -> tuple[int, int]:
    _, c, f = text.split(":")
    return int(c), int(f)


async def test_completed_and_failed_are_counted_once(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    a, b, c = await delivered(client, keys, "a", "b", "c")
    outcomes = ((a, 1, "ack", "", "a"), (b, 1, "dead", "explicit", "b"))
    assert await complete(client, keys, 5, *outcomes) == [1, 1]
    assert await complete(client, keys, 5, *outcomes) == [0, 0]  # lost reply, repeated
    assert await complete(client, keys, 5, (c, 7, "ack", "", "c")) == [0]  # stale attempt
    minute = await now_minute(client)
    stored = await slots(client, keys)
    assert stored["retention"] == "5"
    assert counts(stored[str(minute % 5)]) == (1, 1)
    history = await read_metrics(client, keys, 5)
    assert len(history) == 5
    assert [(h.completed, h.failed) for h in history] == [(0, 0)] * 4 + [(1, 1)]
    assert int(history[-1].minute.timestamp()) // 60 == minute
    # the whole hash expires when the last recorded minute leaves the window
    pttl = int(await client.execute("PTTL", keys.metrics))
    sec, usec = await client.execute("TIME")
    now_ms = int(sec) * 1000 + int(usec) // 1000
    assert abs(now_ms + pttl - (minute + 5) * 60_000) < 2_000


async def test_finish_counts_its_outcome(client: RedisClient, keys: JobQueueKeys) -> None:
    a, b = await delivered(client, keys, "a", "b")
    for entry, kind, job in ((a, "ack", "a"), (b, "dead", "b")):
        reason = "" if kind == "ack" else "explicit"
        args = (GROUP, "c1", entry, 1, kind, reason, job, "why", 0, "", "", "ack", "0", "", 3)
        finish_keys = (keys.ready, keys.events, keys.dead, keys.result(job), *keys.lease_keys)
        assert await FINISH(client, finish_keys, args) == 1
        assert await FINISH(client, finish_keys, args) == 0
    minute = await now_minute(client)
    assert counts((await slots(client, keys))[str(minute % 3)]) == (1, 1)


async def test_retries_expiries_and_cancellations_are_not_counted(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    a, b, c = await delivered(client, keys, "a", "b", "c")
    assert await complete(client, keys, 5, (a, 1, "expired", "", "a")) == [1]
    assert await complete(client, keys, 5, (b, 1, "cancelled", "", "b")) == [1]
    assert await RETRY(client, RETRY_KEYS(keys), (GROUP, "c1", "ack", 1, c, 1, 1000, "")) == [1]
    assert await client.execute("EXISTS", keys.metrics) == 0
    assert await read_metrics(client, keys, 60) == []


async def test_recovery_dead_letters_count_as_failed(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    await delivered(client, keys, "a", "b")
    reply = await CLAIM(
        client,
        (keys.ready, keys.control, keys.events, keys.dead, *CLAIM_GROUP_KEYS(keys)),
        (GROUP, "c2", "recover", 0, "0-0", 10, 1, "ack", 4),
    )
    assert int(reply[4]) == 2
    minute = await now_minute(client)
    assert counts((await slots(client, keys))[str(minute % 4)]) == (0, 2)


async def test_a_slot_of_an_older_minute_is_reused_from_zero(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    minute = await now_minute(client)
    # the current minute's slot still holds the minute one retention ago; the previous slot
    # holds a count of the previous minute; a far older slot has left the window
    await client.execute(
        "HSET",
        keys.metrics,
        str(minute % 3),
        f"{minute - 3}:40:2",
        str((minute - 1) % 3),
        f"{minute - 1}:7:1",
        "retention",
        "3",
    )
    assert [(h.completed, h.failed) for h in await read_metrics(client, keys, 10)] == [
        (0, 0),
        (7, 1),
        (0, 0),
    ]
    (a,) = await delivered(client, keys, "a")
    assert await complete(client, keys, 3, (a, 1, "ack", "", "a")) == [1]
    assert counts((await slots(client, keys))[str(minute % 3)]) == (1, 0)
    assert [(h.completed, h.failed) for h in await read_metrics(client, keys, 2)] == [
        (7, 1),
        (1, 0),
    ]


async def test_a_metrics_key_of_the_wrong_type_leaves_the_delivery_pending(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    (a,) = await delivered(client, keys, "a")
    await client.execute("SET", keys.metrics, "not a hash")
    with pytest.raises(WrongKeyType):
        await complete(client, keys, 5, (a, 1, "ack", "", "a"))
    assert [p[0] for p in await pending(client, keys)] == [a]
    assert await client.execute("EXISTS", keys.events) == 0
    with pytest.raises(WrongKeyType):
        await read_metrics(client, keys, 5)


async def test_metrics_off_records_nothing(client: RedisClient, keys: JobQueueKeys) -> None:
    (a,) = await delivered(client, keys, "a")
    assert await complete(client, keys, 0, (a, 1, "ack", "", "a")) == [1]
    assert await client.execute("EXISTS", keys.metrics) == 0


@pytest.mark.parametrize("retention", [-1, 1441, "x", 1.5])
async def test_a_bad_retention_is_refused_before_any_write(
    client: RedisClient, keys: JobQueueKeys, retention: Any
) -> None:
    (a,) = await delivered(client, keys, "a")
    with pytest.raises(ScriptError, match="RESPIRE_ARGUMENT"):
        await complete(client, keys, retention, (a, 1, "ack", "", "a"))
    assert [p[0] for p in await pending(client, keys)] == [a]


@pytest.mark.parametrize("minutes", [0, 1441, True, 2.0])
async def test_read_metrics_refuses_bad_minutes_before_sending(
    minutes: Any, keys: JobQueueKeys
) -> None:
    with pytest.raises(ValidationError):
        await read_metrics(None, keys, minutes)  # type: ignore[arg-type]
