"""Contracts of the application-group scripts (job_schedule_group, job_select, the lease
release/renewal in job_complete / job_retry / job_claim_pending / job_group_release /
job_lease_renew, and job_group_admin), driven through JobQueue and JobSource on real servers.

"Visit" below is one rotation turn; each read here admits one job (count 1), so every read is
one visit when all groups have due, live, equal-priority jobs.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import anyio
import pytest

from respire_actors.actors.messages import Completion, Delivery
from respire_actors.actors.source import renew_item
from respire_actors.codecs import StrCodec
from respire_actors.errors import ValidationError
from respire_actors.jobs import JobEnqueueOptions, JobQueue, RateLimit
from respire_actors.jobs.options import CONSUMER_GROUP
from respire_actors.jobs.source import JobSource
from respire_actors.keys import JobQueueKeys
from respire_actors.redis.client import RedisClient, connect

pytestmark = pytest.mark.anyio


def source(client: RedisClient, name: str, batch: int = 64) -> JobSource:
    keys = JobQueueKeys(name, client.key_prefix)
    return JobSource(client, keys, keys.dead, CONSUMER_GROUP, selection_batch=batch)


async def stage(
    queue: JobQueue[str], group: str, n: int, *, prefix: str = "", **options: Any
) -> None:
    opts = JobEnqueueOptions(group=group, **options)
    await queue.enqueue_scheduled_many(
        [(f"{prefix}{group}-{i}", f"{group}:{i}") for i in range(n)], opts
    )


async def take(src: JobSource, consumer: str = "c1", count: int = 1) -> list[Delivery]:
    result = await src.read(consumer, count, 0)
    return list(result.deliveries)


async def test_enqueue_keeps_the_exact_group_text_and_job_group(
    client: RedisClient, unique_name: str
) -> None:
    queue = JobQueue(client, unique_name, StrCodec())
    src = source(client, unique_name)
    await src.ensure_group("fail")
    odd = " Tenant{7}:\x00|x "
    r = await queue.enqueue_scheduled("j1", "p", JobEnqueueOptions(group=odd))
    assert r.enqueued
    # deduplication stays queue-wide: another group does not create a second job
    dup = await queue.enqueue_scheduled("j1", "p", JobEnqueueOptions(group="other"))
    assert not dup.enqueued and dup.entry_id == r.entry_id
    (d,) = await take(src)
    assert d.group == odd and d.job_id == "j1"
    # no key carries the group text
    found = await client.execute("KEYS", f"*{unique_name}*")
    assert all(b"Tenant" not in k for k in found)


@pytest.mark.parametrize(
    "bad", ["", "   ", "\ud800", 7, b"bytes", "x" * 1025], ids=lambda v: repr(v)[:12]
)
async def test_bad_group_names_raise_before_anything_is_sent(
    client: RedisClient, unique_name: str, bad: Any
) -> None:
    queue = JobQueue(client, unique_name, StrCodec())
    with pytest.raises(ValidationError):
        await queue.enqueue_scheduled("j", "p", JobEnqueueOptions(group=bad))
    for call in (queue.pause_group, queue.resume_group, queue.get_group):
        with pytest.raises(ValidationError):
            await call(bad)
    with pytest.raises(ValidationError):
        await queue.set_group_options(bad, max_concurrency=1)
    assert await client.execute("KEYS", f"*{unique_name}*") == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_concurrency": 0},
        {"max_concurrency": True},
        {"max_concurrency": 2**31},
        {"rate_limit": (1, 2)},
        {"lease_duration": timedelta(milliseconds=99)},
        {"lease_duration": 2**31 / 1000},
        {"lease_duration": "60"},
    ],
)
async def test_bad_group_options_raise_before_anything_is_sent(
    client: RedisClient, unique_name: str, kwargs: dict[str, Any]
) -> None:
    queue = JobQueue(client, unique_name, StrCodec())
    with pytest.raises(ValidationError):
        await queue.set_group_options("g", **kwargs)
    assert await client.execute("KEYS", f"*{unique_name}*") == []


async def test_each_of_g_groups_is_selected_within_g_visits_by_independent_clients(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    queue = JobQueue(client, unique_name, StrCodec())
    groups = [f"g{i:02d}" for i in range(7)]
    for g in groups:
        await stage(queue, g, 4)
    src = source(client, unique_name)
    await src.ensure_group("fail")
    picked: list[str] = []
    # two independent clients alternate; both reconnect midway through the rotation
    for phase in range(2):
        async with connect(server_url) as a, connect(server_url) as b:
            sources = [source(a, unique_name), source(b, unique_name)]
            for i in range(len(groups) * 2):
                (d,) = await take(sources[i % 2], f"c{i % 2}")
                picked.append(d.group or "")
        del phase
    assert len(picked) == 28
    for start in range(len(picked) - len(groups) + 1):
        window = picked[start : start + len(groups)]
        assert sorted(window) == groups, (start, window)


async def test_ten_jobs_of_a_small_group_are_selected_within_20_visits(
    client: RedisClient, server_url: str, unique_name: str
) -> None:
    queue = JobQueue(client, unique_name, StrCodec())
    await stage(queue, "A", 10_000)
    await stage(queue, "B", 10)
    src = source(client, unique_name)
    await src.ensure_group("fail")
    picked: list[str] = []
    for half in range(2):
        async with connect(server_url) as a, connect(server_url) as b:
            sources = [source(a, unique_name), source(b, unique_name)]
            for i in range(10):
                (d,) = await take(sources[i % 2], f"c{half}{i % 2}")
                picked.append(d.group or "")
    assert Counter(picked) == {"A": 10, "B": 10}
    info = await queue.get_group("A")
    assert info.staged == 9_990 and info.running == 10


async def test_priority_within_a_visit_and_ordering(client: RedisClient, unique_name: str) -> None:
    queue = JobQueue(client, unique_name, StrCodec())
    await queue.enqueue_scheduled("low", "p", JobEnqueueOptions(group="g", priority=1))
    await queue.enqueue_scheduled("high", "p", JobEnqueueOptions(group="g", priority=5))
    await queue.enqueue_scheduled("mid", "p", JobEnqueueOptions(group="g", priority=3))
    src = source(client, unique_name, batch=2)
    await src.ensure_group("fail")
    # the candidates are the oldest 2 due (low, high): high wins; then mid beats low
    assert [d.job_id for d in await take(src)] == ["high"]
    assert [d.job_id for d in await take(src)] == ["mid"]
    assert [d.job_id for d in await take(src)] == ["low"]
    assert (await src.read("c1", 1, 0)).status == "empty"
    # the count of prioritized staged jobs is back to none: visits read one member again
    assert await client.execute("HEXISTS", src.keys.group_policy, "qg") == 0


async def test_ungrouped_ready_work_precedes_groups(client: RedisClient, unique_name: str) -> None:
    queue = JobQueue(client, unique_name, StrCodec())
    await stage(queue, "g", 2)
    await queue.enqueue("plain", "p")
    src = source(client, unique_name)
    await src.ensure_group("fail")
    got = await take(src, count=2)
    assert [d.job_id for d in got] == ["plain", "g-0"]
    assert got[0].group is None


async def test_delayed_and_expired_candidates_consume_their_turn(
    client: RedisClient, unique_name: str
) -> None:
    queue = JobQueue(client, unique_name, StrCodec())
    await stage(queue, "a", 1, delay=timedelta(hours=1))
    await stage(queue, "b", 1, ttl=timedelta(milliseconds=1))
    await stage(queue, "c", 1)
    await anyio.sleep(0.01)
    src = source(client, unique_name)
    await src.ensure_group("fail")
    keys = src.keys
    # one visit at a time: a (delayed) and b (expired: removed) yield nothing
    result = await src.read("c1", 1, 0)
    assert [d.group for d in result.deliveries] == ["c"]
    assert await client.execute("XLEN", keys.scheduled) == 1  # only a's body is left
    assert await client.execute("GET", keys.group_cursor) == b"c"
    empty = await src.read("c1", 1, 0)
    assert empty.status == "empty" and 0 < empty.wake_ms <= 3_600_000
    # the delayed group waits outside the rotation until its job is due
    assert await client.execute("ZRANGE", keys.group_order, 0, -1) == []
    info = await queue.get_group("a")
    assert info.parked == "delayed" and info.wake_at_ms is not None and info.due == 0
    # a job of the delayed group that is due now wakes it at once
    await stage(queue, "a", 1, prefix="now-")
    assert [d.job_id for d in await take(src)] == ["now-a-0"]


async def test_queue_pause_leaves_staged_jobs_and_cursor(
    client: RedisClient, unique_name: str
) -> None:
    queue = JobQueue(client, unique_name, StrCodec())
    await stage(queue, "a", 1)
    await stage(queue, "b", 1)
    src = source(client, unique_name)
    await src.ensure_group("fail")
    await take(src)
    cursor = await client.execute("GET", src.keys.group_cursor)
    await queue.pause()
    assert (await src.read("c1", 1, 0)).status == "paused"
    assert await client.execute("GET", src.keys.group_cursor) == cursor
    assert (await queue.get_group("b")).staged == 1
    await queue.resume()
    assert [d.group for d in await take(src)] == ["b"]


async def test_pause_and_resume_a_group(client: RedisClient, unique_name: str) -> None:
    queue = JobQueue(client, unique_name, StrCodec())
    await stage(queue, "a", 2)
    await stage(queue, "b", 2)
    src = source(client, unique_name)
    await src.ensure_group("fail")
    assert await queue.pause_group("a") is True
    assert await queue.pause_group("a") is False
    assert [d.group for d in await take(src, count=4)] == ["b", "b"]
    info = await queue.get_group("a")
    assert info.paused and info.parked == "paused" and info.staged == 2
    # parked groups leave the rotation; new jobs of a paused group do not rejoin it
    await stage(queue, "a", 1, prefix="more-")
    assert await client.execute("ZRANGE", src.keys.group_order, 0, -1) == []
    assert (await src.read("c1", 4, 0)).status == "empty"
    assert await queue.resume_group("a") is True
    assert await queue.resume_group("a") is False
    assert [d.group for d in await take(src, count=4)] == ["a", "a", "a"]


async def test_max_concurrency_parks_and_release_wakes(
    client: RedisClient, unique_name: str
) -> None:
    queue = JobQueue(client, unique_name, StrCodec())
    assert await queue.set_group_options("a", max_concurrency=2) is True
    assert await queue.set_group_options("a", max_concurrency=2) is False
    await stage(queue, "a", 5)
    src = source(client, unique_name)
    await src.ensure_group("fail")
    first = await take(src, count=5)
    assert len(first) == 2
    info = await queue.get_group("a")
    assert info.running == 2 and info.parked == "concurrency" and info.wake_at_ms
    assert await take(src, count=5) == []
    # completing one releases its permit and wakes the group
    assert await src.complete("c1", [Completion(first[0], "ack")]) == [1]
    assert len(await take(src, count=5)) == 1
    # a release by the wrong consumer or attempt frees nothing
    assert await src.complete("c2", [Completion(first[1], "release")]) == [0]
    stale = Delivery(first[1].entry_id, first[1].fields, 2)
    assert await src.complete("c1", [Completion(stale, "release")]) == [0]
    assert await take(src, count=5) == []
    assert await src.complete("c1", [Completion(first[1], "release")]) == [1]
    assert await src.complete("c1", [Completion(first[1], "release")]) == [0]
    assert len(await take(src, count=5)) == 1


async def test_gcra_admits_a_burst_then_one_per_interval(
    client: RedisClient, unique_name: str
) -> None:
    queue = JobQueue(client, unique_name, StrCodec())
    await queue.set_group_options("a", rate_limit=RateLimit(3, timedelta(seconds=3)))
    await stage(queue, "a", 10)
    src = source(client, unique_name)
    await src.ensure_group("fail")
    assert len(await take(src, count=10)) == 3  # the burst
    info = await queue.get_group("a")
    assert info.parked == "rate"
    now = await client.execute("TIME")
    now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
    assert info.wake_at_ms is not None and 0 < info.wake_at_ms - now_ms <= 1000
    assert await take(src, count=10) == []  # an empty selection costs nothing


async def test_expired_lease_frees_its_permit_and_recovery_takes_a_new_lease(
    client: RedisClient, unique_name: str
) -> None:
    queue = JobQueue(client, unique_name, StrCodec())
    # the lease outlasts the steps between taking the permit and checking it is held, even
    # on a loaded machine (100 ms did not, once)
    await queue.set_group_options(
        "a", max_concurrency=1, lease_duration=timedelta(milliseconds=600)
    )
    await stage(queue, "a", 3)
    src = source(client, unique_name)
    await src.ensure_group("fail")
    (first,) = await take(src, "crashed", 3)
    assert await take(src, "c2", 3) == []
    await anyio.sleep(0.75)
    # the crashed worker's permit frees itself at expiry (the group's deadline woke it)
    (second,) = await take(src, "c2", 3)
    # recovery of the crashed delivery (idle 200 ms or more): the group is at its limit
    # again, so it waits
    page = await src.claim("c3", "recover", "0-0", 10, 200, 0)
    assert [d.entry_id for d in page.deliveries] == []
    assert await src.complete("c2", [Completion(second, "ack")]) == [1]
    page = await src.claim("c3", "recover", "0-0", 10, 200, 0)
    (recovered,) = page.deliveries
    assert recovered.entry_id == first.entry_id and recovered.attempt == 2
    # the stale worker's release cannot free the replacement's permit
    assert await src.complete("crashed", [Completion(first, "release")]) == [0]
    assert await src.renew("crashed", [renew_item(first)]) == [0]
    # renewed: a grouped job's status is its group's lease duration in ms
    assert await src.renew("c3", [renew_item(recovered)]) == [600]
    assert (await queue.get_group("a")).running == 1
    assert await take(src, "c2", 3) == []


async def test_pause_blocks_recovery_admission_and_replay_yields(
    client: RedisClient, unique_name: str
) -> None:
    queue = JobQueue(client, unique_name, StrCodec())
    await stage(queue, "a", 2)
    src = source(client, unique_name)
    await src.ensure_group("fail")
    got = await take(src, "c1", 2)
    assert len(got) == 2
    await queue.pause_group("a")
    page = await src.claim("c2", "recover", "0-0", 10, 0, 0)
    assert page.deliveries == [] and not page.denied
    replay = await src.claim("c1", "replay", "0-0", 10, 0, 0)
    assert replay.deliveries == [] and replay.next_cursor == "0-0"
    await queue.resume_group("a")
    page = await src.claim("c2", "recover", "0-0", 10, 0, 0)
    assert sorted(d.entry_id for d in page.deliveries) == sorted(d.entry_id for d in got)


async def test_retry_keeps_the_group_and_releases_the_lease(
    client: RedisClient, unique_name: str
) -> None:
    queue = JobQueue(client, unique_name, StrCodec())
    await queue.set_group_options("a", max_concurrency=1)
    await stage(queue, "a", 1, priority=4)
    src = source(client, unique_name)
    await src.ensure_group("fail")
    (d,) = await take(src)
    assert await src.complete("c1", [Completion(d, "retry", "nack", 0)]) == [1]
    assert (await queue.get_group("a")).running == 0
    assert await client.execute("HGET", src.keys.group_policy, "qa") == b"1"
    (again,) = await take(src)
    assert again.group == "a" and again.job_id == d.job_id and again.priority == 4
    assert again.prior_attempts == 1
    assert await src.complete("c1", [Completion(again, "dead", "explicit")]) == [1]
    info = await queue.get_group("a")
    assert info.running == 0 and info.staged == 0


async def test_policy_change_wakes_a_parked_group(client: RedisClient, unique_name: str) -> None:
    queue = JobQueue(client, unique_name, StrCodec())
    await queue.set_group_options("a", rate_limit=RateLimit(1, timedelta(hours=1)))
    await stage(queue, "a", 3)
    src = source(client, unique_name)
    await src.ensure_group("fail")
    assert len(await take(src, count=3)) == 1
    assert (await queue.get_group("a")).parked == "rate"
    assert await take(src, count=3) == []
    await queue.set_group_options("a")  # limits removed
    assert len(await take(src, count=3)) == 2


async def test_inspection_lists_pages_and_idle_policy_groups(
    client: RedisClient, unique_name: str
) -> None:
    queue = JobQueue(client, unique_name, StrCodec())
    for g in ("b", "a", "d", "c"):
        await stage(queue, g, 2)
    await queue.pause_group("c")
    await queue.set_group_options("idle", max_concurrency=3, lease_duration=5)
    page = await queue.list_groups(count=3)
    assert [g.name for g in page.groups] == ["a", "b", "c"] and page.next_cursor == "c"
    assert page.groups[2].paused and page.groups[2].parked == "paused"
    assert page.groups[0].staged == 2 and page.groups[0].due == 2
    rest = await queue.list_groups(page.next_cursor, count=3)
    assert [g.name for g in rest.groups] == ["d"] and rest.next_cursor is None
    idle = await queue.get_group("idle")
    assert idle.known and idle.staged == 0 and idle.options.max_concurrency == 3
    assert idle.options.lease_duration == timedelta(seconds=5)
    assert not (await queue.get_group("never")).known


async def test_grouped_jobs_on_a_cluster(cluster_client: RedisClient, unique_name: str) -> None:
    """Every group key shares the queue's hash tag: staging, selection, controls, completion
    and inspection all run on a 3-master cluster."""
    queue = JobQueue(cluster_client, unique_name, StrCodec())
    await queue.set_group_options("t{1}", max_concurrency=1)
    await stage(queue, "t{1}", 2)
    await stage(queue, "t{2}", 1)
    src = source(cluster_client, unique_name)
    await src.ensure_group("fail")
    got = await take(src, count=3)
    assert sorted(d.group or "" for d in got) == ["t{1}", "t{2}"]
    assert await src.complete("c1", [Completion(d, "ack") for d in got]) == [1, 1]
    assert [d.group for d in await take(src, count=3)] == ["t{1}"]
    assert (await queue.list_groups()).groups == []


async def test_renew_extends_only_the_owners_lease(client: RedisClient, unique_name: str) -> None:
    queue = JobQueue(client, unique_name, StrCodec())
    await queue.set_group_options("a", lease_duration=timedelta(seconds=5))
    await stage(queue, "a", 1)
    src = source(client, unique_name)
    await src.ensure_group("fail")
    (d,) = await take(src)
    member = b"00000001a" + d.entry_id.encode()

    async def expiry() -> int:
        raw = await client.execute("HGET", src.keys.group_owners, member)
        return int(raw.split(b":")[1])

    before = await expiry()
    await queue.set_group_options("a", lease_duration=timedelta(seconds=50))
    assert await src.renew("c1", [renew_item(d)]) == [50_000]  # renewed, and its duration
    assert await expiry() >= before + 40_000  # the group's current lease duration
    other = Delivery(d.entry_id, d.fields, 1)
    assert await src.renew("c2", [renew_item(other)]) == [0]
    assert await src.renew("c1", [renew_item(Delivery(d.entry_id, d.fields, 2))]) == [0]
    assert await src.complete("c1", [Completion(d, "ack")]) == [1]
    assert await src.renew("c1", [renew_item(d)]) == [0]  # released: lost


@pytest.mark.parametrize(
    "args",
    [("c1", "1-0", "1"), ("c1", "1-0", "x", "g"), ("c1", "1-0", "0", "g"), ("c1", "1-0", "1", "")],
)
async def test_renew_and_release_refuse_malformed_batches(
    client: RedisClient, unique_name: str, args: tuple[str, ...]
) -> None:
    from respire_actors.errors import ScriptError
    from respire_actors.redis.scripts import load

    keys = JobQueueKeys(unique_name)
    if args[2] != "0":
        with pytest.raises(ScriptError):
            await load("job_group_release")(client, keys.lease_keys, args)
    assert await client.execute("KEYS", f"*{unique_name}*") == []


@pytest.mark.parametrize(
    "args",
    [
        ("c1", "1"),  # n without its triple
        ("c1", "1", "1-0", "1"),  # a pair, not a triple
        ("c1", "1", "1-0", "0", "g"),  # attempt 0
        ("c1", "1", "x", "1", "g"),  # not an entry id
        ("c1", "1001"),  # over the batch limit
    ],
)
async def test_lease_renewal_refuses_malformed_batches(
    client: RedisClient, unique_name: str, args: tuple[str, ...]
) -> None:
    from respire_actors.errors import ScriptError
    from respire_actors.redis.scripts import load

    keys = JobQueueKeys(unique_name)
    with pytest.raises(ScriptError):
        await load("job_lease_renew")(
            client,
            (keys.ready, keys.group_leases, keys.group_owners, keys.group_policy, keys.control),
            ("respire", *args),
        )
    assert await client.execute("KEYS", f"*{unique_name}*") == []


async def test_a_lost_group_lease_is_not_renewed_and_leaves_the_delivery_idle(
    client: RedisClient, unique_name: str
) -> None:
    """The fence holds but the group's concurrency lease is gone (taken over after expiry):
    renewal reports the lease lost and does not reset the entry's idle time, so the delivery is
    recovered one visibility timeout after its last renewal."""
    queue = JobQueue(client, unique_name, StrCodec())
    await stage(queue, "a", 1)
    src = source(client, unique_name)
    await src.ensure_group("fail")
    (d,) = await take(src)
    assert await src.renew("c1", [renew_item(d)]) == [60_000]  # renewed: the default lease
    await anyio.sleep(0.05)
    member = b"00000001a" + d.entry_id.encode()
    assert await client.execute("HDEL", src.keys.group_owners, member) == 1
    assert await src.renew("c1", [renew_item(d)]) == [0]
    (row,) = await client.execute("XPENDING", src.keys.ready, "respire", "-", "+", 10)
    assert int(row[2]) >= 50  # idle time kept growing: not claimed
    # an ungrouped delivery in the same batch is renewed as usual
    ungrouped = Delivery(
        d.entry_id, {k: v for k, v in d.fields.items() if k != b"_respire.job.group"}, d.attempt
    )
    assert await src.renew("c1", [renew_item(ungrouped)]) == [1]


async def test_groups_with_only_future_jobs_are_not_rescanned(
    client: RedisClient, unique_name: str
) -> None:
    """Delayed groups park until their earliest due time: an idle reader's reads stop visiting
    them (no busy rescans of hundreds of groups that hold only future jobs)."""
    queue = JobQueue(client, unique_name, StrCodec())
    for i in range(100):
        await stage(queue, f"g{i:03d}", 1, delay=timedelta(hours=1))
    src = source(client, unique_name)
    await src.ensure_group("fail")
    first = await src.read("c1", 1, 0)
    assert first.status == "ok" and first.deliveries == []  # 64 visits: read again
    second = await src.read("c1", 1, 0)
    assert second.status == "empty" and 0 < second.wake_ms <= 3_600_000
    keys = src.keys
    assert await client.execute("ZCARD", keys.group_order) == 0
    assert await client.execute("ZCARD", keys.group_parked) == 100
    cursor = await client.execute("GET", keys.group_cursor)
    assert (await src.read("c1", 1, 0)).status == "empty"
    assert await client.execute("GET", keys.group_cursor) == cursor  # no visit at all
