"""Safe retention (job_trim through QueueAdmin.trim_plan / trim and retention.apply_trim):
what a plan reports, that a trim removes exactly the plan, aborts when the groups changed, and
never removes a pending or undelivered entry (property test over random group positions)."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jobs_helpers import create_group, deliver, restricted_client, text

from respire_actors.admin import QueueAdmin
from respire_actors.errors import PermissionDenied
from respire_actors.jobs import JobQueue
from respire_actors.jobs.options import CONSUMER_GROUP
from respire_actors.redis.client import RedisClient
from respire_actors.retention import apply_trim, entry_id_key

pytestmark = pytest.mark.anyio


async def ids_of(client: RedisClient, key: str) -> list[str]:
    return [text(i) for i, _ in await client.execute("XRANGE", key, "-", "+") or []]


async def test_plan_names_boundaries_and_changes_nothing(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    admin = QueueAdmin(client, queue.name)
    await create_group(client, queue.keys)
    entries = [(await queue.enqueue(f"j{i}", "x")).entry_id for i in range(10)]
    delivered = await deliver(client, queue.keys, "c1", 6)
    for d in delivered[:2] + delivered[3:]:  # j2 stays pending
        await client.execute("XACK", queue.keys.ready, CONSUMER_GROUP, d.entry_id)
    plan = await admin.trim_plan("ready", max_length=0)
    assert plan.length == 10
    assert plan.cutoff == entries[2] and plan.count == 2 and not plan.limited
    assert plan.boundary == entries[2] and plan.safe
    (group,) = plan.groups
    assert (group.name, group.pending) == (CONSUMER_GROUP, 1)
    assert group.lowest_pending == entries[2]
    assert group.first_undelivered == entries[6]
    assert group.last_delivered_id == entries[5]
    assert await ids_of(client, queue.keys.ready) == entries  # a plan removes nothing
    result = await admin.trim(plan)
    assert (result.removed, result.cutoff, result.aborted) == (2, entries[2], None)
    assert await ids_of(client, queue.keys.ready) == entries[2:]


async def test_undelivered_entries_stay(client: RedisClient, queue: JobQueue[str]) -> None:
    admin = QueueAdmin(client, queue.name)
    await create_group(client, queue.keys)
    entries = [(await queue.enqueue(f"j{i}", "x")).entry_id for i in range(5)]
    for d in await deliver(client, queue.keys, "c1", 3):
        await client.execute("XACK", queue.keys.ready, CONSUMER_GROUP, d.entry_id)
    await anyio.sleep(0.01)
    result = await admin.trim(await admin.trim_plan("ready", max_age=timedelta(milliseconds=1)))
    assert result.removed == 3
    assert await ids_of(client, queue.keys.ready) == entries[3:]


async def test_a_new_group_aborts_the_trim(client: RedisClient, queue: JobQueue[str]) -> None:
    admin = QueueAdmin(client, queue.name)
    await create_group(client, queue.keys)
    entries = [(await queue.enqueue(f"j{i}", "x")).entry_id for i in range(4)]
    for d in await deliver(client, queue.keys, "c1", 4):
        await client.execute("XACK", queue.keys.ready, CONSUMER_GROUP, d.entry_id)
    plan = await admin.trim_plan("ready", max_length=0)
    assert plan.count == 4
    await client.execute("XGROUP", "CREATE", queue.keys.ready, "auditors", "0")
    result = await admin.trim(plan)
    assert result.removed == 0 and result.aborted and "groups changed" in result.aborted
    assert await ids_of(client, queue.keys.ready) == entries


async def test_a_group_moved_back_aborts_the_trim(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    admin = QueueAdmin(client, queue.name)
    await create_group(client, queue.keys)
    entries = [(await queue.enqueue(f"j{i}", "x")).entry_id for i in range(4)]
    for d in await deliver(client, queue.keys, "c1", 4):
        await client.execute("XACK", queue.keys.ready, CONSUMER_GROUP, d.entry_id)
    plan = await admin.trim_plan("ready", max_length=1)
    assert plan.count == 3
    await client.execute("XGROUP", "SETID", queue.keys.ready, CONSUMER_GROUP, "0")
    result = await admin.trim(plan)
    assert result.removed == 0 and result.aborted and "positions" in result.aborted
    assert await ids_of(client, queue.keys.ready) == entries


async def test_events_and_dead_letters_by_age_and_length(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    admin = QueueAdmin(client, queue.name)
    now = await client.time_ms()
    old = [f"{now - 3_600_000 + i}-0" for i in range(3)]  # an hour ago
    for i in old:
        await client.execute("XADD", queue.keys.events, i, "kind", "progress")
    fresh = [text(await client.execute("XADD", queue.keys.events, "*", "k", "v")) for _ in range(4)]
    plan = await admin.trim_plan("events", max_age=timedelta(minutes=30))
    assert plan.groups == () and plan.count == 3 and plan.cutoff == fresh[0]
    assert (await admin.trim(plan)).removed == 3
    plan = await admin.trim_plan("events", max_age=timedelta(minutes=30), max_length=1)
    assert plan.count == 3
    assert (await admin.trim(plan)).removed == 3
    assert await ids_of(client, queue.keys.events) == fresh[-1:]
    for _ in range(5):
        await client.execute("XADD", admin.dead_key, "*", "_respire.job.id", "a")
    everything = await admin.trim_plan("dead", max_length=0)
    assert everything.count == 5 and everything.cutoff is not None
    assert (await admin.trim(everything)).removed == 5
    assert await client.execute("XLEN", admin.dead_key) == 0


async def test_limit_bounds_one_call(client: RedisClient, queue: JobQueue[str]) -> None:
    admin = QueueAdmin(client, queue.name)
    for _ in range(25):
        await client.execute("XADD", queue.keys.events, "*", "k", "v")
    plan = await admin.trim_plan("events", max_length=0, limit=10)
    assert plan.count == 10 and plan.limited
    removed = []
    while (r := await apply_trim(client, queue.keys.events, max_length=0, limit=10)).removed:
        removed.append(r.removed)
    assert removed == [10, 10, 5]


async def test_missing_stream_plans_nothing(client: RedisClient, queue: JobQueue[str]) -> None:
    admin = QueueAdmin(client, queue.name)
    plan = await admin.trim_plan("ready", max_length=0)
    assert (plan.length, plan.cutoff, plan.count) == (0, None, 0)
    assert (await admin.trim(plan)).removed == 0


async def test_trim_checks_permissions_first(
    server_url: str, client: RedisClient, queue: JobQueue[str], unique_name: str
) -> None:
    for _ in range(3):
        await client.execute("XADD", queue.keys.events, "*", "k", "v")
    async with restricted_client(server_url, client, unique_name, "-xtrim") as restricted:
        admin = QueueAdmin(restricted, queue.name)
        plan = await admin.trim_plan("events", max_length=0)  # reading needs no XTRIM
        assert plan.count == 3
        with pytest.raises(PermissionDenied):
            await admin.trim(plan)
    assert await client.execute("XLEN", queue.keys.events) == 3


# ------------------------------------------------------------------------------------------
# the property: whatever the groups' positions, nothing pending or undelivered goes

group_state = st.tuples(
    st.integers(min_value=0, max_value=30),  # how many entries the group was delivered
    st.lists(st.booleans(), min_size=30, max_size=30),  # which deliveries were acknowledged
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    n=st.integers(min_value=0, max_value=30),
    groups=st.lists(group_state, min_size=0, max_size=3),
    max_length=st.one_of(st.none(), st.integers(min_value=0, max_value=35)),
    age_split=st.one_of(st.none(), st.integers(min_value=0, max_value=31)),
    limit=st.integers(min_value=1, max_value=40),
    apply=st.booleans(),
)
async def test_trim_never_removes_pending_or_undelivered(
    client: RedisClient,
    unique_name: str,
    n: int,
    groups: list[tuple[int, list[bool]]],
    max_length: int | None,
    age_split: int | None,
    limit: int,
    apply: bool,
) -> None:
    if max_length is None and age_split is None:
        max_length = 0
    admin = QueueAdmin(client, unique_name)
    key = admin.keys.ready
    await client.execute("DEL", key)
    # entries one second apart, the newest 40 s old: age_split entries are older than 30.5 s
    now = await client.time_ms()
    ids = [f"{now - 40_000 - (n - 1 - i) * 1000}-0" for i in range(n)]
    for i in ids:
        await client.execute("XADD", key, i, "f", "v")
    max_age = None
    if age_split is not None:
        cut = now - 40_000 - (n - 1 - min(age_split, n)) * 1000 if n else now
        max_age = timedelta(milliseconds=max(1, now - cut + 500))
    for g, (delivered, acked) in enumerate(groups):
        name = f"g{g}"
        await client.execute("XGROUP", "CREATE", key, name, "0", "MKSTREAM")
        if delivered:
            reply = await client.execute(
                "XREADGROUP", "GROUP", name, "c", "COUNT", delivered, "STREAMS", key, ">"
            )
            got = [text(i) for i, _ in (reply.popitem()[1] if isinstance(reply, dict) else [])]
            for i, entry in enumerate(got):
                if acked[i]:
                    await client.execute("XACK", key, name, entry)
    protected: set[str] = set()
    for g in range(len(groups)):
        for row in await client.execute("XPENDING", key, f"g{g}", "-", "+", 100):
            protected.add(text(row[0]))
    for group in await client.execute("XINFO", "GROUPS", key) if groups else []:
        row = {text(k): v for k, v in group.items()}
        last = entry_id_key(text(row["last-delivered-id"]))
        protected.update(i for i in ids if entry_id_key(i) > last)
    before = await ids_of(client, key)
    if apply:
        result = await apply_trim(client, key, max_age=max_age, max_length=max_length, limit=limit)
        assert result.aborted is None
        cutoff = result.cutoff
    else:
        plan = await admin.trim_plan("ready", max_age=max_age, max_length=max_length, limit=limit)
        assert plan.safe
        result = await admin.trim(plan)
        assert result.aborted is None and result.removed == plan.count
        cutoff = plan.cutoff
    after = await ids_of(client, key)
    removed = before[: len(before) - len(after)]
    assert before[len(removed) :] == after  # only a prefix goes
    assert len(removed) == result.removed <= limit
    assert not protected & set(removed), "a pending or undelivered entry was trimmed"
    if removed:
        assert cutoff is not None and entry_id_key(removed[-1]) < entry_id_key(cutoff)
    for index in range(len(removed)):  # every removed entry was out of policy
        too_many = max_length is not None and index < len(before) - max_length
        too_old = max_age is not None and index < (age_split or 0)
        assert too_many or too_old


async def test_a_ready_stream_no_worker_has_read_keeps_every_job(
    client: RedisClient, unique_name: str
) -> None:
    """Jobs enqueued before any worker ran: the ready stream has no consumer group yet, and the
    first worker's group starts at its beginning. A trim, however aggressive, removes none of
    them (it used to remove every one: with no group there was no boundary). The events stream
    of the same queue, with no group by design, is trimmed by policy as before."""
    from respire_actors.codecs import StrCodec

    queue = JobQueue(client, unique_name, StrCodec())
    for i in range(5):
        await queue.enqueue(f"job-{i}", "x")
    await client.execute("XADD", queue.keys.events, "*", "kind", "note")
    await anyio.sleep(0.01)
    admin = QueueAdmin(client, unique_name)
    plan = await admin.trim_plan("ready", max_age=0.001)
    assert plan.count == 0 and plan.groups == ()
    assert (await admin.trim(plan)).removed == 0
    assert await client.execute("XLEN", queue.keys.ready) == 5
    events = await admin.trim_plan("events", max_age=0.001)
    assert events.count == 1
