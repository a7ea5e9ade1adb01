"""Contracts of the job queue's Lua scripts, called directly on real servers.

Each script validates and preflights before its first write; expected outcomes (duplicate,
stale fence, paused, empty) are return values, broken invariants typed errors.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from respire_actors.errors import PermissionDenied, ScriptError, ServerError, WrongKeyType
from respire_actors.jobs.options import CONSUMER_GROUP
from respire_actors.keys import JobQueueKeys
from respire_actors.redis.client import RedisClient, connect
from respire_actors.redis.scripts import all_scripts, load

pytestmark = pytest.mark.anyio

ENQUEUE = load("job_enqueue")
COMPLETE = load("job_complete")


def CLAIM_GROUP_KEYS(keys: JobQueueKeys) -> tuple[str, ...]:
    return (keys.group_policy, keys.group_owners, keys.group_leases, keys.group_parked)


def RETRY_KEYS(keys: JobQueueKeys) -> tuple[str, ...]:
    return (
        keys.ready,
        keys.scheduled,
        keys.due,
        keys.group_jobs,
        keys.group_order,
        keys.group_leases,
        keys.group_owners,
        keys.group_parked,
        keys.group_policy,
    )


READ = load("job_read")
PROGRESS = load("job_progress")
LOG = load("job_log")
CLAIM = load("job_claim_pending")
GROUP = CONSUMER_GROUP


def s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def pairs(flat: Any) -> dict[str, bytes]:
    items = flat.items() if isinstance(flat, dict) else zip(flat[0::2], flat[1::2], strict=True)
    return {s(k): v for k, v in items}


@pytest.fixture
def keys(unique_name: str) -> JobQueueKeys:
    return JobQueueKeys(unique_name)


async def enqueue(
    client: RedisClient, keys: JobQueueKeys, job_id: str, window: Any = 60_000
) -> str:
    reply = await ENQUEUE(
        client,
        (keys.ready, keys.dedup(job_id), keys.control, keys.scheduled),
        (window, "_respire.job.id", job_id, "_respire.job.payload", f"payload of {job_id}"),
    )
    return s(reply[0])


async def read(client: RedisClient, keys: JobQueueKeys, consumer: str, count: int = 1) -> Any:
    return await READ(client, (keys.ready, keys.control), (GROUP, consumer, count))


async def complete(
    client: RedisClient, keys: JobQueueKeys, consumer: str, *outcomes: Sequence[Any]
) -> list[int]:
    args: list[Any] = [GROUP, consumer, len(outcomes)]
    for outcome in outcomes:
        args += list(outcome)
    reply = await COMPLETE(client, (keys.ready, keys.events, keys.dead, *keys.lease_keys), args)
    return [int(x) for x in reply]


async def pending(client: RedisClient, keys: JobQueueKeys) -> list[tuple[str, str, int]]:
    rows = await client.execute("XPENDING", keys.ready, GROUP, "-", "+", 100)
    return [(s(r[0]), s(r[1]), int(r[3])) for r in rows]


async def xlen(client: RedisClient, key: str) -> int:
    return int(await client.execute("XLEN", key))


async def delivered(client: RedisClient, keys: JobQueueKeys, *job_ids: str) -> list[str]:
    """Enqueue ``job_ids`` and deliver them to consumer c1 (delivery count 1)."""
    ids = [await enqueue(client, keys, j) for j in job_ids]
    await client.execute("XGROUP", "CREATE", keys.ready, GROUP, "0", "MKSTREAM")
    reply = await read(client, keys, "c1", len(ids))
    assert s(reply[0]) == "ok" and [s(e[0]) for e in reply[1]] == ids
    return ids


# -- shipped files -------------------------------------------------------------------------------


def test_job_script_headers_name_every_key() -> None:
    scripts = [sc for sc in all_scripts() if sc.name.startswith("job_")]
    assert {sc.name for sc in scripts} >= {
        "job_enqueue",
        "job_complete",
        "job_read",
        "job_progress",
        "job_log",
        "job_claim_pending",
    }
    for script in scripts:
        documented = set(map(int, re.findall(r"^-- KEYS\[(\d+)\]", script.source, re.M)))
        assert documented == set(range(1, script.numkeys + 1)), script.name
        assert "--!include" not in script.source  # includes were resolved


async def test_job_scripts_load_on_the_server(client: RedisClient) -> None:
    for script in all_scripts():
        if script.name.startswith("job_"):
            assert s(await client.execute("SCRIPT", "LOAD", script.source)) == script.sha


# -- job_enqueue ------------------------------------------------------------------------------


async def test_enqueue_returns_new_then_duplicate(client: RedisClient, keys: JobQueueKeys) -> None:
    first = await ENQUEUE(
        client,
        (keys.ready, keys.dedup("a"), keys.control, keys.scheduled),
        (1000, "_respire.job.id", "a"),
    )
    again = await ENQUEUE(
        client,
        (keys.ready, keys.dedup("a"), keys.control, keys.scheduled),
        (1000, "_respire.job.id", "a"),
    )
    assert int(first[1]) == 1 and int(again[1]) == 0
    assert s(first[0]) == s(again[0])
    assert await xlen(client, keys.ready) == 1


async def test_enqueue_preflight_refuses_a_wrong_ready_key_type(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    await client.execute("SET", keys.ready, "not a stream")
    with pytest.raises(WrongKeyType) as caught:
        await enqueue(client, keys, "a")
    assert caught.value.code == "RESPIRE_WRONGTYPE"
    assert await client.execute("GET", keys.ready) == b"not a stream"
    assert await client.execute("EXISTS", keys.dedup("a")) == 0


async def test_enqueue_refuses_a_wrong_dedup_key_type(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    await client.execute("RPUSH", keys.dedup("a"), "squatter")
    with pytest.raises(WrongKeyType):
        await enqueue(client, keys, "a")
    assert await client.execute("EXISTS", keys.ready) == 0


@pytest.mark.parametrize("window", [0, -5, 2**31, "soon"])
async def test_enqueue_refuses_a_bad_window(
    client: RedisClient, keys: JobQueueKeys, window: Any
) -> None:
    with pytest.raises(ScriptError) as caught:
        await enqueue(client, keys, "a", window)
    assert caught.value.code == "RESPIRE_ARGUMENT"
    assert await client.execute("EXISTS", keys.ready, keys.dedup("a")) == 0


@asynccontextmanager
async def restricted_client(
    server_url: str, client: RedisClient, user: str, *rules: str
) -> AsyncIterator[RedisClient]:
    """A client logged in as a temporary ACL user (deleted afterwards)."""
    await client.execute("ACL", "SETUSER", user, "reset", "on", ">pw", "~*", "&*", "+@all", *rules)
    try:
        async with connect(server_url, username=user, password="pw") as restricted:
            yield restricted
    finally:
        await client.execute("ACL", "DELUSER", user)


@pytest.mark.parametrize("denied", ["-set", "-xdel", "-xadd", "-get"])
async def test_enqueue_checks_permissions_before_writing(
    server_url: str, client: RedisClient, keys: JobQueueKeys, unique_name: str, denied: str
) -> None:
    # SET records the deduplication key; XDEL is needed to roll an append back if that fails.
    async with restricted_client(server_url, client, unique_name, denied) as restricted:
        with pytest.raises(PermissionDenied) as caught:
            await enqueue(restricted, keys, "a")
    assert caught.value.code == "RESPIRE_NOPERM"
    assert await client.execute("EXISTS", keys.ready, keys.dedup("a")) == 0


# -- job_read ---------------------------------------------------------------------------------


async def test_read_delivers_then_reports_empty_with_the_last_id(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    await client.execute("XGROUP", "CREATE", keys.ready, GROUP, "0", "MKSTREAM")
    assert [s(x) for x in await read(client, keys, "c1")] == ["empty", "0-0"]

    a = await enqueue(client, keys, "a")
    b = await enqueue(client, keys, "b")
    reply = await read(client, keys, "c1", 5)
    assert s(reply[0]) == "ok"
    assert [s(e[0]) for e in reply[1]] == [a, b]
    assert pairs(reply[1][0][1])["_respire.job.id"] == b"a"
    assert await pending(client, keys) == [(a, "c1", 1), (b, "c1", 1)]

    assert [s(x) for x in await read(client, keys, "c1")] == ["empty", b]


async def test_read_that_reaches_the_end_names_the_newest_entry(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    """A read that takes fewer entries than it asked for read to the stream's end: it returns
    the last entry's id (the reader blocks for a newer one instead of reading again); a full
    read cannot know and returns ''."""
    await create_group(client, keys)
    a = await enqueue(client, keys, "a")
    b = await enqueue(client, keys, "b")
    c = await enqueue(client, keys, "c")
    full = await read(client, keys, "c1", 2)
    assert [s(e[0]) for e in full[1]] == [a, b] and s(full[4]) == ""
    rest = await read(client, keys, "c1", 2)
    assert [s(e[0]) for e in rest[1]] == [c] and s(rest[4]) == c
    # an expired last entry is acknowledged, not returned, and still the newest read
    last = await client.execute(
        "XADD", keys.ready, "*", "_respire.job.id", "old", "_respire.job.expires_at", "1"
    )
    reply = await read(client, keys, "c1", 5)
    assert reply[1] == [] and int(reply[2]) == 1 and s(reply[4]) == s(last)
    assert [s(x) for x in await read(client, keys, "c1")] == ["empty", s(last)]


async def test_read_under_a_rate_limit_does_not_claim_the_end_when_capped(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    """The rate limit lowers the count a read takes: fewer entries than the caller asked
    for is then no sign of the stream's end."""
    await create_group(client, keys)
    ids = [await enqueue(client, keys, f"j{i}") for i in range(5)]
    # 20 permits per minute: one call takes at most a tenth of them (2)
    await client.execute("HSET", keys.control, "rate.limit", "20", "rate.window", "60000")
    reply = await read(client, keys, "c1", 5)
    assert s(reply[0]) == "ok", reply
    assert [s(e[0]) for e in reply[1]] == ids[:2] and s(reply[4]) == ""


async def test_read_reports_paused_without_delivering(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    await client.execute("XGROUP", "CREATE", keys.ready, GROUP, "0", "MKSTREAM")
    await enqueue(client, keys, "a")
    await client.execute("HSET", keys.control, "paused", "1")
    assert [s(x) for x in await read(client, keys, "c1")] == ["paused"]
    assert await pending(client, keys) == []
    await client.execute("HSET", keys.control, "paused", "0")
    assert s((await read(client, keys, "c1"))[0]) == "ok"


async def test_read_without_a_group_is_nogroup(client: RedisClient, keys: JobQueueKeys) -> None:
    await enqueue(client, keys, "a")
    with pytest.raises(ServerError) as caught:
        await read(client, keys, "c1")
    assert caught.value.code == "NOGROUP"


@pytest.mark.parametrize("count", [0, 1001, "x"])
async def test_read_refuses_a_bad_count(
    client: RedisClient, keys: JobQueueKeys, count: Any
) -> None:
    await client.execute("XGROUP", "CREATE", keys.ready, GROUP, "0", "MKSTREAM")
    with pytest.raises(ScriptError):
        await READ(client, (keys.ready, keys.control), (GROUP, "c1", count))


# -- job_complete -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        [GROUP, "c1", 0],
        [GROUP, "c1", "two", "1-0", 1, "ack", "", "a"],
        [GROUP, "c1", 2, "1-0", 1, "ack", "", "a"],
        [GROUP, "c1", 1, "1-0", 1, "ack", ""],
        [GROUP, "c1"],
    ],
    ids=["zero", "not-a-number", "too-few", "short-group", "no-count"],
)
async def test_complete_refuses_a_malformed_batch(
    client: RedisClient, keys: JobQueueKeys, args: list[Any]
) -> None:
    (entry,) = await delivered(client, keys, "a")
    with pytest.raises(ScriptError) as caught:
        await COMPLETE(client, (keys.ready, keys.events, keys.dead, *keys.lease_keys), args)
    assert caught.value.code == "RESPIRE_ARGUMENT"
    assert await pending(client, keys) == [(entry, "c1", 1)]
    assert await client.execute("EXISTS", keys.events, keys.dead) == 0


async def test_complete_is_fenced_by_consumer_and_attempt(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    a, b = await delivered(client, keys, "a", "b")
    assert await complete(client, keys, "c2", (a, 1, "ack", "", "a")) == [0]  # other consumer
    assert await complete(client, keys, "c1", (a, 2, "ack", "", "a")) == [0]  # other attempt
    assert await complete(client, keys, "c1", ("9-9", 1, "ack", "", "x")) == [0]  # not pending
    assert await client.execute("EXISTS", keys.events, keys.dead) == 0
    assert await pending(client, keys) == [(a, "c1", 1), (b, "c1", 1)]

    assert await complete(
        client,
        keys,
        "c1",
        (a, 1, "ack", "", "a"),
        (b, 1, "dead", "explicit", "b"),
        (a, 1, "ack", "", "a"),
    ) == [1, 1, 0]  # the repeat inside the batch is already acknowledged
    assert await pending(client, keys) == []
    events = await client.execute("XRANGE", keys.events, "-", "+")
    assert [pairs(f) for _, f in events] == [
        {"kind": b"completed", "job_id": b"a", "entry_id": a.encode(), "attempt": b"1"},
        {
            "kind": b"dead-letter",
            "job_id": b"b",
            "entry_id": b.encode(),
            "attempt": b"1",
            "reason": b"explicit",
        },
    ]
    (letter,) = await client.execute("XRANGE", keys.dead, "-", "+")
    assert pairs(letter[1]) == {
        "_respire.job.id": b"b",
        "_respire.job.payload": b"payload of b",
        "_respire.source_id": b.encode(),
        "_respire.attempt": b"1",
        "_respire.reason": b"explicit",
        "_respire.consumer": b"c1",
    }


async def test_complete_after_recovery_fences_the_old_attempt(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    (a,) = await delivered(client, keys, "a")
    await client.execute("XCLAIM", keys.ready, GROUP, "c1", 0, a)  # same name, attempt 2
    assert await complete(client, keys, "c1", (a, 1, "ack", "", "a")) == [0]
    assert await complete(client, keys, "c1", (a, 2, "ack", "", "a")) == [1]
    (event,) = await client.execute("XRANGE", keys.events, "-", "+")
    assert pairs(event[1])["attempt"] == b"2"


async def test_complete_dead_letters_a_deleted_body_with_what_it_knows(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    (a,) = await delivered(client, keys, "a")
    await client.execute("XDEL", keys.ready, a)
    assert await complete(client, keys, "c1", (a, 1, "dead", "explicit", "a")) == [1]
    (letter,) = await client.execute("XRANGE", keys.dead, "-", "+")
    fields = pairs(letter[1])
    assert fields["_respire.job.id"] == b"a" and fields["_respire.source_id"] == a.encode()
    assert "_respire.job.payload" not in fields


async def test_complete_expired_only_acknowledges(client: RedisClient, keys: JobQueueKeys) -> None:
    (a,) = await delivered(client, keys, "a")
    assert await complete(client, keys, "c1", (a, 1, "expired", "", "a")) == [1]
    assert await pending(client, keys) == []
    assert await client.execute("EXISTS", keys.events, keys.dead) == 0


async def test_complete_preflight_refuses_a_wrong_events_key_type(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    a, b = await delivered(client, keys, "a", "b")
    await client.execute("SET", keys.events, "squatter")
    with pytest.raises(WrongKeyType):
        await complete(client, keys, "c1", (a, 1, "ack", "", "a"), (b, 1, "dead", "x", "b"))
    assert await pending(client, keys) == [(a, "c1", 1), (b, "c1", 1)]
    assert await client.execute("EXISTS", keys.dead) == 0


# -- job_progress and job_log ---------------------------------------------------------------------


async def progress(
    client: RedisClient, keys: JobQueueKeys, consumer: str, entry: str, attempt: int, pct: Any
) -> int:
    return int(
        await PROGRESS(
            client, (keys.ready, keys.events), (GROUP, consumer, entry, attempt, "a", pct)
        )
    )


async def test_progress_is_fenced(client: RedisClient, keys: JobQueueKeys) -> None:
    (a,) = await delivered(client, keys, "a")
    assert await progress(client, keys, "c2", a, 1, 10) == 0
    assert await progress(client, keys, "c1", a, 2, 10) == 0
    assert await progress(client, keys, "c1", a, 1, 10) == 1
    (event,) = await client.execute("XRANGE", keys.events, "-", "+")
    assert pairs(event[1]) == {
        "kind": b"progress",
        "job_id": b"a",
        "entry_id": a.encode(),
        "attempt": b"1",
        "percent": b"10",
    }


@pytest.mark.parametrize("pct", [-1, 101, 50.5, "half"])
async def test_progress_refuses_a_bad_percent(
    client: RedisClient, keys: JobQueueKeys, pct: Any
) -> None:
    (a,) = await delivered(client, keys, "a")
    with pytest.raises(ScriptError):
        await progress(client, keys, "c1", a, 1, pct)
    assert await client.execute("EXISTS", keys.events) == 0


async def log(
    client: RedisClient,
    keys: JobQueueKeys,
    consumer: str,
    entry: str,
    attempt: int,
    line: str,
    *,
    lines: Any = 100,
    retention: Any = 60_000,
    expires: Any = 0,
) -> int:
    return int(
        await LOG(
            client,
            (keys.ready, keys.logs("a")),
            (GROUP, consumer, entry, attempt, line, lines, retention, expires),
        )
    )


async def test_log_is_fenced(client: RedisClient, keys: JobQueueKeys) -> None:
    (a,) = await delivered(client, keys, "a")
    assert await log(client, keys, "c2", a, 1, "x") == 0
    assert await log(client, keys, "c1", a, 2, "x") == 0
    assert await client.execute("EXISTS", keys.logs("a")) == 0
    assert await log(client, keys, "c1", a, 1, "x") == 1
    assert await client.execute("LRANGE", keys.logs("a"), 0, -1) == [b"x"]


async def test_log_respects_the_job_expiry(client: RedisClient, keys: JobQueueKeys) -> None:
    (a,) = await delivered(client, keys, "a")
    now = await client.time_ms()
    # 2, not 0: the TTL refused the line, but the delivery is still current (fence holds)
    assert await log(client, keys, "c1", a, 1, "late", expires=now - 1) == 2
    assert await client.execute("EXISTS", keys.logs("a")) == 0
    # a stale fence still wins over the TTL: 0 means the lease is lost
    assert await log(client, keys, "c2", a, 1, "late", expires=now - 1) == 0
    # A job expiring before the retention ends shortens the log's lifetime to the job's.
    assert await log(client, keys, "c1", a, 1, "on time", expires=now + 5_000) == 1
    assert 0 < await client.execute("PTTL", keys.logs("a")) <= 5_000


@pytest.mark.parametrize(
    "policy",
    [
        {"lines": 0},
        {"lines": 1001},
        {"retention": 0},
        {"retention": 2**31},
        {"expires": "never"},
    ],
)
async def test_log_refuses_a_bad_policy(
    client: RedisClient, keys: JobQueueKeys, policy: dict[str, Any]
) -> None:
    (a,) = await delivered(client, keys, "a")
    with pytest.raises(ScriptError):
        await log(client, keys, "c1", a, 1, "x", **policy)
    assert await client.execute("EXISTS", keys.logs("a")) == 0


async def test_log_preflight_refuses_a_wrong_key_type(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    (a,) = await delivered(client, keys, "a")
    await client.execute("SET", keys.logs("a"), "squatter")
    with pytest.raises(WrongKeyType):
        await log(client, keys, "c1", a, 1, "x")


# -- job_claim_pending ------------------------------------------------------------------------


async def claim(
    client: RedisClient,
    keys: JobQueueKeys,
    consumer: str,
    mode: str,
    *,
    min_idle: int = 0,
    cursor: str = "0-0",
    count: Any = 10,
    limit: int = 0,
) -> Any:
    return await CLAIM(
        client,
        (keys.ready, keys.control, keys.events, keys.dead, *CLAIM_GROUP_KEYS(keys)),
        (GROUP, consumer, mode, min_idle, cursor, count, limit),
    )


async def test_replay_pages_through_own_pending_entries(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    ids = await delivered(client, keys, "a", "b", "c")
    await client.execute("XCLAIM", keys.ready, GROUP, "other", 0, ids[2])

    first = await claim(client, keys, "c1", "replay", count=1)
    assert s(first[0]) == "ok" and s(first[1]) == ids[0]
    assert [(s(e[0]), int(e[2])) for e in first[2]] == [(ids[0], 2)]
    second = await claim(client, keys, "c1", "replay", count=1, cursor=ids[0])
    assert s(second[1]) == ids[1]
    assert [s(e[0]) for e in second[2]] == [ids[1]]
    last = await claim(client, keys, "c1", "replay", count=1, cursor=ids[1])
    assert s(last[1]) == "0-0" and last[2] == []  # "other" owns c
    assert await pending(client, keys) == [
        (ids[0], "c1", 2),
        (ids[1], "c1", 2),
        (ids[2], "other", 2),
    ]


async def test_recover_claims_idle_entries_and_counts_deleted_ones(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    a, b = await delivered(client, keys, "a", "b")
    # Not idle long enough: nothing is claimed.
    reply = await claim(client, keys, "c2", "recover", min_idle=60_000)
    assert s(reply[0]) == "ok" and reply[2] == [] and int(reply[3]) == 0
    # that call recorded a 60 s lease for the queue (see the next test): forget it here
    await client.execute("HDEL", keys.control, "lease.ms", "lease.until")
    await client.execute("XDEL", keys.ready, a)
    reply = await claim(client, keys, "c2", "recover", min_idle=0)
    assert [(s(e[0]), int(e[2])) for e in reply[2]] == [(b, 2)]
    assert int(reply[3]) == 1 and int(reply[4]) == 0
    assert await pending(client, keys) == [(b, "c2", 2)]


async def test_recovery_waits_for_the_longest_visibility_timeout_a_worker_recorded(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    """Found by review: a worker configured with a 2 s visibility timeout claimed the running,
    renewed jobs of one configured with 30 s (it renews every 10 s), so every job ran twice.
    Each recovery call marks its caller's timeout for 3 s (a live worker marks it again every
    second while it runs jobs); a shorter caller waits for the longer one while it is marked."""
    (a,) = await delivered(client, keys, "a")
    await anyio.sleep(0.3)
    # the long-timeout worker's recovery pass: nothing idle for 30 s, its lease recorded
    assert (await claim(client, keys, "c1", "recover", min_idle=30_000))[2] == []
    ms, until = await client.execute("HMGET", keys.control, "lease.ms", "lease.until")
    (now_s, now_us) = await client.execute("TIME")
    now = int(now_s) * 1000 + int(now_us) // 1000
    assert int(ms) == 30_000 and abs(int(until) - now - 3_000) < 1000  # a 3 s mark
    # the short-timeout worker: the entry is idle past its 200 ms, but not past 30 s
    assert (await claim(client, keys, "c2", "recover", min_idle=200))[2] == []
    assert int(await client.execute("HGET", keys.control, "lease.ms")) == 30_000  # kept
    assert await pending(client, keys) == [(a, "c1", 1)]
    # the long one lapsed (its worker died: no more marks): the short one applies, is recorded
    await client.execute("HSET", keys.control, "lease.until", now - 1)
    reply = await claim(client, keys, "c2", "recover", min_idle=200)
    assert [s(e[0]) for e in reply[2]] == [a]
    assert int(await client.execute("HGET", keys.control, "lease.ms")) == 200
    # a longer timeout replaces a shorter record at once
    await claim(client, keys, "c1", "recover", min_idle=5_000)
    assert int(await client.execute("HGET", keys.control, "lease.ms")) == 5_000


async def test_reads_and_renewals_record_the_workers_visibility_timeout(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    """A worker busy with long jobs runs no recovery pass (no free capacity): its reads and
    lease renewals (and a renewal call with no deliveries, its mark every second while it runs
    jobs) record its timeout, refreshing the 3 s mark once a third of it has passed."""
    await create_group(client, keys)
    a = await enqueue(client, keys, "a")
    reply = await READ(client, (keys.ready, keys.control), (GROUP, "c1", 1, "ack", 30_000))
    assert s(reply[0]) == "ok"
    assert int(await client.execute("HGET", keys.control, "lease.ms")) == 30_000
    first = int(await client.execute("HGET", keys.control, "lease.until"))
    # a shorter timeout does not replace it; the same one within its first third keeps it
    await READ(client, (keys.ready, keys.control), (GROUP, "c2", 1, "ack", 1_000))
    await READ(client, (keys.ready, keys.control), (GROUP, "c1", 1, "ack", 30_000))
    assert await client.execute("HMGET", keys.control, "lease.ms", "lease.until") == [
        b"30000",
        str(first).encode(),
    ]
    renew = load("job_lease_renew")
    lease_keys = (keys.ready, keys.group_leases, keys.group_owners, keys.group_policy)
    await client.execute("HDEL", keys.control, "lease.ms", "lease.until")
    assert await renew(client, (*lease_keys, keys.control), (GROUP, "c1", 1, a, 1, "", 20_000)) == [
        1
    ]
    assert int(await client.execute("HGET", keys.control, "lease.ms")) == 20_000
    # without the timeout argument (an older caller), nothing is recorded
    await client.execute("HDEL", keys.control, "lease.ms", "lease.until")
    assert await renew(client, (*lease_keys, keys.control), (GROUP, "c1", 1, a, 1, "")) == [1]
    assert await client.execute("HGET", keys.control, "lease.ms") is None


@pytest.mark.parametrize("who", ["another consumer", "a newer delivery", "acknowledged"])
async def test_lease_renewal_is_fenced_by_consumer_and_delivery_count(
    client: RedisClient, keys: JobQueueKeys, who: str
) -> None:
    """A renewal renews only what is still pending for this consumer with this delivery count:
    once its own worker re-claimed the entry (delivery 2), delivery 1's renewal fails, so its
    handler is cancelled rather than running beside the new one (found by a mutation review:
    no test failed with the delivery-count check removed)."""
    (a,) = await delivered(client, keys, "a")
    renew = load("job_lease_renew")
    lease_keys = (keys.ready, keys.group_leases, keys.group_owners, keys.group_policy)
    if who == "acknowledged":
        await client.execute("XACK", keys.ready, GROUP, a)
    else:
        owner = "c2" if who == "another consumer" else "c1"
        await client.execute("XCLAIM", keys.ready, GROUP, owner, 0, a)
    reply = await renew(client, (*lease_keys, keys.control), (GROUP, "c1", 1, a, 1, ""))
    assert [int(x) for x in reply] == [0]
    if who == "a newer delivery":
        reply = await renew(client, (*lease_keys, keys.control), (GROUP, "c1", 1, a, 2, ""))
        assert [int(x) for x in reply] == [1]


async def test_the_rate_policy_recover_redirect_waits_for_the_recorded_lease(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    await create_group(client, keys)
    await enqueue(client, keys, "a")
    await enqueue(client, keys, "b")
    ((a, _),) = (await read(client, keys, "c1"))[1]
    await client.execute("HSET", keys.control, "rate.limit", "1000", "rate.window", "60000")
    await claim(client, keys, "c1", "recover", min_idle=30_000)  # records 30 s
    await anyio.sleep(0.3)
    reply = await READ(client, (keys.ready, keys.control), (GROUP, "c2", 1, "ack", 200))
    assert s(reply[0]) == "ok"  # not sent to recover c1's entry, idle only 0.3 s of 30
    await client.execute("HDEL", keys.control, "lease.ms", "lease.until")
    await enqueue(client, keys, "c")
    reply = await READ(client, (keys.ready, keys.control), (GROUP, "c2", 1, "ack", 200))
    assert [s(x) for x in reply[:2]] == ["recover", s(a)]


async def test_recover_dead_letters_past_the_limit(client: RedisClient, keys: JobQueueKeys) -> None:
    await delivered(client, keys, "a")
    reply = await claim(client, keys, "c2", "recover", limit=1)
    assert reply[2] == [] and int(reply[4]) == 1
    assert await pending(client, keys) == []
    (letter,) = await client.execute("XRANGE", keys.dead, "-", "+")
    fields = pairs(letter[1])
    assert fields["_respire.reason"] == b"delivery-limit" and fields["_respire.attempt"] == b"1"
    (event,) = await client.execute("XRANGE", keys.events, "-", "+")
    assert pairs(event[1])["reason"] == b"delivery-limit"


async def test_claim_reports_paused(client: RedisClient, keys: JobQueueKeys) -> None:
    (a,) = await delivered(client, keys, "a")
    await client.execute("HSET", keys.control, "paused", "1")
    for mode in ("replay", "recover"):
        assert [s(x) for x in await claim(client, keys, "c1", mode)] == ["paused"]
    assert await pending(client, keys) == [(a, "c1", 1)]


@pytest.mark.parametrize("count", [0, 1001, "many"])
async def test_claim_refuses_bad_arguments(
    client: RedisClient, keys: JobQueueKeys, count: Any
) -> None:
    await delivered(client, keys, "a")
    with pytest.raises(ScriptError):
        await claim(client, keys, "c1", "recover", count=count)


# ------------------------------------------------------------------------------------------
# scheduling, retries and queue controls

SCHEDULE = load("job_schedule")


async def create_group(client: RedisClient, keys: JobQueueKeys) -> None:
    await client.execute("XGROUP", "CREATE", keys.ready, GROUP, "0", "MKSTREAM")


PROMOTE = load("job_promote")
RETRY = load("job_retry")
PAUSE = load("job_pause")
RATE = load("job_rate_policy")


async def schedule(
    client: RedisClient, keys: JobQueueKeys, job_id: str, delay: Any = 0, ttl: Any = 0
) -> str:
    reply = await SCHEDULE(
        client,
        (keys.scheduled, keys.due, keys.dedup(job_id), keys.control, keys.ready),
        (60_000, delay, 0, ttl, "_respire.job.id", job_id, "_respire.job.payload", "p"),
    )
    return s(reply[0])


@pytest.mark.parametrize(
    "args",
    [
        (0, 0, 0, 0),
        (1000, -1, 0, 0),
        (1000, 0, 2**31, 0),
        (1000, 0, 0.5, 0),
        (1000, 0, 0, 2**31),
        (1000, "x", 0, 0),
    ],
)
async def test_schedule_refuses_bad_arguments(
    client: RedisClient, keys: JobQueueKeys, args: tuple[Any, ...]
) -> None:
    with pytest.raises(ScriptError):
        await SCHEDULE(
            client,
            (keys.scheduled, keys.due, keys.dedup("a"), keys.control, keys.ready),
            (*args, "f", "v"),
        )
    assert await client.execute("EXISTS", keys.scheduled, keys.due, keys.dedup("a")) == 0


async def test_read_acknowledges_expired_entries_without_returning_them(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    await create_group(client, keys)
    await client.execute(
        "XADD", keys.ready, "*", "_respire.job.id", "old", "_respire.job.expires_at", "1"
    )
    live = await enqueue(client, keys, "live")
    reply = await read(client, keys, "c1", 5)
    assert s(reply[0]) == "ok" and [s(e[0]) for e in reply[1]] == [live] and int(reply[2]) == 1
    assert [r[0] for r in await pending(client, keys)] == [live]


async def test_claim_acknowledges_expired_entries(client: RedisClient, keys: JobQueueKeys) -> None:
    await create_group(client, keys)
    await client.execute(
        "XADD", keys.ready, "*", "_respire.job.id", "old", "_respire.job.expires_at", "1"
    )
    await client.execute("XREADGROUP", "GROUP", GROUP, "c1", "COUNT", 5, "STREAMS", keys.ready, ">")
    reply = await CLAIM(
        client,
        (keys.ready, keys.control, keys.events, keys.dead, *CLAIM_GROUP_KEYS(keys)),
        (GROUP, "c2", "recover", 0, "0-0", 10, 5),
    )
    assert s(reply[0]) == "ok" and reply[2] == [] and int(reply[5]) == 1
    assert await pending(client, keys) == []
    assert await xlen(client, keys.dead) == 0


async def test_read_and_claim_report_limited_before_claiming(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    await create_group(client, keys)
    await enqueue(client, keys, "a")
    assert await RATE(client, (keys.control,), ("set", 1, 86_400_000)) == 1
    assert s((await read(client, keys, "c1", 5))[0]) == "ok"
    await enqueue(client, keys, "b")
    limited = await read(client, keys, "c1", 5)
    assert s(limited[0]) == "limited" and int(limited[1]) > 0
    claim = await CLAIM(
        client,
        (keys.ready, keys.control, keys.events, keys.dead, *CLAIM_GROUP_KEYS(keys)),
        (GROUP, "c2", "recover", 0, "0-0", 10, 5),
    )
    assert s(claim[0]) == "limited"
    assert [(c, n) for _, c, n in await pending(client, keys)] == [("c1", 1)]
    assert int(await client.execute("HGET", keys.control, "rate_limit_hits")) == 2


async def test_rate_policy_init_and_bad_arguments(client: RedisClient, keys: JobQueueKeys) -> None:
    assert [s(x) for x in await RATE(client, (keys.control,), ("init", 3, 1000))] == ["stored"]
    assert [s(x) for x in await RATE(client, (keys.control,), ("init", 3, 1000))] == ["match"]
    assert [s(x) for x in await RATE(client, (keys.control,), ("init", 4, 1000))] == [
        "mismatch",
        "3",
        "1000",
    ]
    for args in (("set", 0, 1), ("set", 1, 0), ("nope",), ("init", 1, 2**31)):
        with pytest.raises(ScriptError):
            await RATE(client, (keys.control,), args)


async def test_pause_script_is_idempotent_and_checks_types(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    assert await PAUSE(client, (keys.control, keys.events), ("pause",)) == 1
    assert await PAUSE(client, (keys.control, keys.events), ("pause",)) == 0
    assert await xlen(client, keys.events) == 1
    with pytest.raises(ScriptError):
        await PAUSE(client, (keys.control, keys.events), ("stop",))
    await client.execute("DEL", keys.events)
    await client.execute("SET", keys.events, "x")
    with pytest.raises(WrongKeyType):
        await PAUSE(client, (keys.control, keys.events), ("resume",))
    assert s(await client.execute("HGET", keys.control, "paused")) == "1"


async def test_retry_refuses_malformed_batches(client: RedisClient, keys: JobQueueKeys) -> None:
    for args in (
        (GROUP, "c1", "ack", 1, "1-0", 1, 0),
        (GROUP, "c1", "bogus", 1, "1-0", 1, 0, ""),
        (GROUP, "c1", "ack", 1, "1-0", 1, -5, ""),
        (GROUP, "c1", "ack", 1, "1-0", 1, 0, "x" * 257),
    ):
        with pytest.raises(ScriptError):
            await RETRY(client, RETRY_KEYS(keys), args)
    assert await client.execute("EXISTS", keys.scheduled, keys.due) == 0


async def test_promote_then_retry_preserves_the_envelope(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    await schedule(client, keys, "a", ttl=3_600_000)
    assert [int(x) for x in await PROMOTE(client, (keys.scheduled, keys.due, keys.ready), (8,))][
        :3
    ] == [1, 0, 0]
    await create_group(client, keys)
    ((entry, fields),) = (await read(client, keys, "c1"))[1]
    reply = await RETRY(
        client, RETRY_KEYS(keys), (GROUP, "c1", "delete", 1, entry, 1, 0, "processing-failed")
    )
    assert [int(x) for x in reply] == [1]
    assert await xlen(client, keys.ready) == 0  # "delete": XACK + XDEL here (no XACKDEL)
    ((_, staged),) = await client.execute("XRANGE", keys.scheduled, "-", "+")
    before, after = pairs(fields), pairs(staged)
    assert after.pop("_respire.job.attempts") == b"1"
    # the attempt's provenance (seed 004): the prior stream id and a compact reason code
    assert after.pop("_respire.retry.previous_id") == entry
    assert after.pop("_respire.retry.reason") == b"processing-failed"
    assert after == before


async def test_a_second_retry_replaces_the_first_ones_provenance(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    await create_group(client, keys)
    await enqueue(client, keys, "a")
    ((first, _),) = (await read(client, keys, "c1"))[1]
    await RETRY(client, RETRY_KEYS(keys), (GROUP, "c1", "ack", 1, first, 1, 0, "nack"))
    await PROMOTE(client, (keys.scheduled, keys.due, keys.ready), (8,))
    ((second, fields),) = (await read(client, keys, "c1"))[1]
    assert pairs(fields)["_respire.retry.previous_id"] == first
    # no reason given: the field is left out, and the first retry's is not carried over
    await RETRY(client, RETRY_KEYS(keys), (GROUP, "c1", "ack", 1, second, 1, 0, ""))
    ((_, staged),) = await client.execute("XRANGE", keys.scheduled, "-", "+")
    after = pairs(staged)
    assert after["_respire.retry.previous_id"] == second
    assert "_respire.retry.reason" not in after
    assert after["_respire.job.attempts"] == b"2"
    assert list(staged[::2]).count(b"_respire.retry.previous_id") == 1


@pytest.mark.parametrize("who", ["another consumer", "a newer delivery"])
async def test_retry_is_fenced_by_consumer_and_delivery_count(
    client: RedisClient, keys: JobQueueKeys, who: str
) -> None:
    """A handler whose job was recovered (by another consumer, or by its own worker's next
    delivery) cannot stage a retry of it nor acknowledge the current delivery (found by a
    mutation review: no test failed with the fence removed)."""
    (entry,) = await delivered(client, keys, "a")  # delivered to c1, count 1
    owner = "c2" if who == "another consumer" else "c1"
    await client.execute("XCLAIM", keys.ready, GROUP, owner, 0, entry)  # count 2
    reply = await RETRY(client, RETRY_KEYS(keys), (GROUP, "c1", "ack", 1, entry, 1, 0, "nack"))
    assert [int(x) for x in reply] == [0]  # stale: nothing staged, nothing acknowledged
    assert await client.execute("EXISTS", keys.scheduled, keys.due) == 0
    assert await pending(client, keys) == [(entry, owner, 2)]
    # the current delivery still can
    reply = await RETRY(client, RETRY_KEYS(keys), (GROUP, owner, "ack", 1, entry, 2, 0, "nack"))
    assert [int(x) for x in reply] == [1]
    assert await pending(client, keys) == []


# -- job_group ---------------------------------------------------------------------------------

GROUP_SCRIPT = load("job_group")


async def group_call(
    client: RedisClient, keys: JobQueueKeys, context: str, on_missing: str = "fail"
) -> str:
    reply = await GROUP_SCRIPT(client, (keys.ready, keys.control), (GROUP, context, on_missing))
    return s(reply[0])


async def test_job_group_creates_once_then_refuses_to_replay(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    first = await enqueue(client, keys, "a")
    assert await group_call(client, keys, "start") == "created"  # a new queue: at 0
    assert s(await client.execute("HGET", keys.control, "group.created")) == "1"
    assert await group_call(client, keys, "start") == "exists"
    assert s((await read(client, keys, "c1"))[1][0][0]) == first  # entries before it are read
    await client.execute("XGROUP", "DESTROY", keys.ready, GROUP)
    assert await group_call(client, keys, "start") == "missing"  # nothing written
    assert await group_call(client, keys, "lost") == "missing"
    assert await client.execute("XINFO", "GROUPS", keys.ready) == []
    assert await group_call(client, keys, "lost", "$") == "recreated"
    assert s((await read(client, keys, "c1"))[0]) == "empty"  # "$": history is not replayed


async def test_job_group_lost_without_mark_never_creates_at_zero(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    await enqueue(client, keys, "a")  # a queue from before the mark: seen as lost, not new
    assert await group_call(client, keys, "lost") == "missing"
    assert await group_call(client, keys, "lost", "0-0") == "recreated"  # explicit: the caller's


async def test_job_group_checks_arguments_and_types(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    for context, on_missing in (("later", "fail"), ("start", "")):
        with pytest.raises(ServerError, match="RESPIRE_ARGUMENT"):
            await GROUP_SCRIPT(client, (keys.ready, keys.control), (GROUP, context, on_missing))
    await client.execute("SET", keys.control, "x")
    with pytest.raises(WrongKeyType):
        await group_call(client, keys, "start")
    assert await client.execute("EXISTS", keys.ready) == 0


# -- job_finish (an outcome with its retained record) --------------------------------------------

FINISH = load("job_finish")


async def finish(
    client: RedisClient,
    keys: JobQueueKeys,
    consumer: str,
    entry: str,
    *,
    job_id: str = "a",
    attempt: Any = 1,
    kind: str = "ack",
    reason: str = "",
    detail: str = "",
    keep: Any = 60_000,
    state: str = "value",
    result: Any = b"42",
    mode: str = "ack",
) -> int:
    reply = await FINISH(
        client,
        (keys.ready, keys.events, keys.dead, keys.result(job_id), *keys.lease_keys),
        (GROUP, consumer, entry, attempt, kind, reason, job_id, detail, keep, state, result, mode),
    )
    return int(reply)


async def test_finish_commits_the_outcome_and_its_record_together(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    a, b = await delivered(client, keys, "a", "b")
    assert await finish(client, keys, "c1", a) == 1
    record = pairs(await client.execute("HGETALL", keys.result("a")))
    assert record["state"] == b"completed"
    assert record["result"] == b"42"
    assert record["result_state"] == b"value"
    assert record["entry_id"] == a.encode()
    assert 0 < await client.execute("PTTL", keys.result("a")) <= 60_000
    assert (
        await finish(
            client,
            keys,
            "c1",
            b,
            job_id="b",
            kind="dead",
            reason="explicit",
            detail="why",
            state="",
            result="",
        )
        == 1
    )
    dead = pairs((await client.execute("XRANGE", keys.dead, "-", "+"))[0][1])
    assert dead["_respire.detail"] == b"why"
    assert dead["_respire.reason"] == b"explicit"
    record = pairs(await client.execute("HGETALL", keys.result("b")))
    assert (record["state"], record["detail"]) == (b"dead-lettered", b"why")
    assert "result" not in record
    assert await pending(client, keys) == []
    # a repeat (lost reply) is stale and writes nothing more
    assert await finish(client, keys, "c1", a) == 0
    assert await xlen(client, keys.events) == 2


async def test_finish_is_fenced_and_without_retention_writes_no_record(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    (a,) = await delivered(client, keys, "a")
    assert await finish(client, keys, "c2", a) == 0
    assert await finish(client, keys, "c1", a, attempt=2) == 0
    assert await client.execute("EXISTS", keys.events, keys.result("a")) == 0
    assert (
        await finish(
            client,
            keys,
            "c1",
            a,
            kind="dead",
            reason="nack",
            detail="d",
            keep=0,
            state="",
            result="",
        )
        == 1
    )
    assert await client.execute("EXISTS", keys.result("a")) == 0
    assert await xlen(client, keys.dead) == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": "retry"},
        {"keep": -1},
        {"keep": 2**31},
        {"keep": "x"},
        {"state": "weird"},
        {"state": "", "result": "x"},
        {"detail": "x" * 1025},
        {"mode": "nope"},
    ],
)
async def test_finish_refuses_malformed_arguments_before_writing(
    client: RedisClient, keys: JobQueueKeys, bad: dict[str, Any]
) -> None:
    (a,) = await delivered(client, keys, "a")
    with pytest.raises(ScriptError):
        await finish(client, keys, "c1", a, **bad)
    assert await client.execute("EXISTS", keys.events, keys.result("a"), keys.dead) == 0
    assert len(await pending(client, keys)) == 1


async def test_finish_preflights_the_record_key_type(
    client: RedisClient, keys: JobQueueKeys
) -> None:
    (a,) = await delivered(client, keys, "a")
    await client.execute("SET", keys.result("a"), "squatter")
    with pytest.raises(WrongKeyType):
        await finish(client, keys, "c1", a)
    assert await client.execute("EXISTS", keys.events) == 0
    assert len(await pending(client, keys)) == 1
