"""The event stream and its readers (spec: "Progress and completion observers")."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from jobs_helpers import fast_options, running_worker, text, wait_until, wait_until_async

from respire_actors.codecs import StrCodec
from respire_actors.errors import ValidationError, WrongKeyType
from respire_actors.jobs import ACK, DeadLetter, Job, JobEvent, JobQueue, Outcome
from respire_actors.jobs.queue import EventReader
from respire_actors.redis.client import RedisClient, connect

pytestmark = pytest.mark.anyio


async def take(reader: EventReader, n: int, timeout: float = 10) -> list[JobEvent]:
    out: list[JobEvent] = []
    with anyio.fail_after(timeout):
        async for event in reader:
            out.append(event)
            if len(out) == n:
                break
    return out


async def produce_events(client: RedisClient, queue: JobQueue[str]) -> dict[str, str]:
    """Run a worker over two jobs: a (progress 10, 50, then ack) and b (dead letter)."""
    a = await queue.enqueue("a", "x")
    b = await queue.enqueue("b", "y")

    async def handler(job: Job[str]) -> Outcome:
        if job.id == "a":
            assert await job.report_progress(10)
            assert await job.report_progress(50)
            return ACK
        return DeadLetter(detail="poison")

    async with running_worker(
        client, queue.name, handler, options=fast_options(consumer_count=1)
    ) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 1 and stats.dead_lettered == 1)
    return {"a": a.entry_id, "b": b.entry_id}


async def test_reader_sees_every_event_in_order_with_its_fields(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    entries = await produce_events(client, queue)
    async with queue.read_events() as reader:
        events = await take(reader, 4)
        assert reader.cursor == events[-1].id

    assert [(e.kind, e.job_id, e.entry_id, e.attempt, e.percent, e.reason) for e in events] == [
        ("progress", "a", entries["a"], 1, 10, None),
        ("progress", "a", entries["a"], 1, 50, None),
        ("completed", "a", entries["a"], 1, None, None),
        ("dead-letter", "b", entries["b"], 1, None, "explicit"),
    ]
    ids = [tuple(map(int, e.id.split("-"))) for e in events]
    assert ids == sorted(ids) and len(set(ids)) == 4
    assert all(e.extra == {} for e in events)


async def test_reader_resumes_after_a_cursor_and_observers_do_not_compete(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await produce_events(client, queue)
    async with queue.read_events() as first, queue.read_events() as second:
        everything = await take(first, 4)
        assert await take(second, 4) == everything

    async with queue.read_events(everything[1].id, batch=1) as resumed:
        assert await take(resumed, 2) == everything[2:]


async def test_reader_waits_for_new_events(client: RedisClient, queue: JobQueue[str]) -> None:
    got: list[JobEvent] = []

    async with queue.read_events(block=timedelta(milliseconds=100)) as reader:

        async def observe() -> None:
            got.extend(await take(reader, 3))

        async with anyio.create_task_group() as tg:
            tg.start_soon(observe)
            await produce_events(client, queue)

    assert [e.kind for e in got] == ["progress", "progress", "completed"]


async def test_reader_survives_a_dropped_connection(
    server_url: str, client: RedisClient, queue: JobQueue[str]
) -> None:
    name = f"observer-{queue.name}"
    events_key = queue.keys.events

    async def add(i: int) -> str:
        return text(
            await client.execute(
                "XADD",
                events_key,
                "*",
                "kind",
                "completed",
                "job_id",
                f"j{i}",
                "entry_id",
                f"{i}-0",
                "attempt",
                "1",
            )
        )

    async def observer_connections() -> dict[str, str]:
        """id -> last command of each connection named ``name`` (ordinary and blocking)."""
        listing = text(await client.execute("CLIENT", "LIST", "TYPE", "normal"))
        out = {}
        for line in listing.splitlines():
            fields = dict(p.split("=", 1) for p in line.split() if "=" in p)
            if fields.get("name") == name:
                out[fields["id"]] = fields["cmd"] + ("-blocked" if "b" in fields["flags"] else "")
        return out

    async def blocked_reader() -> str | None:
        ids = [i for i, cmd in (await observer_connections()).items() if cmd == "xread-blocked"]
        return ids[0] if ids else None

    async def reader_is_blocked() -> bool:
        return await blocked_reader() is not None

    first = await add(1)
    async with connect(server_url, client_name=name) as observer_client:
        observer = JobQueue(observer_client, queue.name, StrCodec())
        async with observer.read_events(block=timedelta(seconds=30)) as reader:
            assert [e.id for e in await take(reader, 1)] == [first]
            got: list[JobEvent] = []

            async def observe() -> None:
                got.extend(await take(reader, 3, timeout=15))

            async with anyio.create_task_group() as tg:
                tg.start_soon(observe)
                await wait_until_async(reader_is_blocked)
                old_id = await blocked_reader()
                assert old_id is not None
                assert await client.execute("CLIENT", "KILL", "ID", old_id) == 1
                later = [await add(i) for i in (2, 3, 4)]

            connections = await observer_connections()
            assert old_id not in connections
            assert len(connections) == 2  # the ordinary one and the reconnected blocking one

    assert [e.id for e in got] == later
    assert [e.job_id for e in got] == ["j2", "j3", "j4"]


async def test_permanent_errors_surface(client: RedisClient, queue: JobQueue[str]) -> None:
    await client.execute("SET", queue.keys.events, "not a stream")
    async with queue.read_events() as reader:
        with anyio.fail_after(5), pytest.raises(WrongKeyType):
            await reader.__anext__()


async def test_cancelling_ends_the_enumeration(queue: JobQueue[str]) -> None:
    with anyio.move_on_after(0.2) as scope:
        async with queue.read_events(block=timedelta(seconds=10)) as reader:
            async for _event in reader:
                raise AssertionError("no events were written")
    assert scope.cancelled_caught


@pytest.mark.parametrize(
    "kwargs",
    [{"batch": 0}, {"batch": 10_001}, {"batch": True}, {"block": timedelta(0)}, {"block": -1}],
)
async def test_reader_arguments_are_validated(
    queue: JobQueue[str], kwargs: dict[str, object]
) -> None:
    with pytest.raises(ValidationError):
        async with queue.read_events(**kwargs):  # type: ignore[arg-type]
            raise AssertionError("opened")
