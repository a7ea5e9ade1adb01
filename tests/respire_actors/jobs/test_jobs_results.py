"""Result retention (issue 8, item 14; beyond the seed, docs/results.md): a worker with
``keep_results`` stores each outcome and the handler's encoded return value with the
acknowledgement, in one fenced script call; ``queue.result`` waits for it on the event stream
and ``queue.status`` reads it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import anyio
import pytest
from jobs_helpers import all_events, fast_options, forbid_commands, running_worker, wait_until

from respire_actors.codecs import JsonCodec, StrCodec
from respire_actors.errors import (
    JobDeadLettered,
    JobResultTimeout,
    JobResultUnavailable,
    ValidationError,
)
from respire_actors.jobs import ACK, NACK, DeadLetter, Job, JobQueue, WorkerOptions
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio

KEEP = fast_options(keep_results=timedelta(minutes=5), delivery_limit=1)


@dataclass
class Receipt:
    to: str
    n: int


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"ok": True, "n": [1, 2]}, {"ok": True, "n": [1, 2]}),
        ([1, "two", None], [1, "two", None]),
        (Receipt("a@b", 3), {"to": "a@b", "n": 3}),
        ("sent", "sent"),
        (42, 42),
        (2.5, 2.5),
        (None, None),
        (ACK, None),
        ((1, 2), [1, 2]),
    ],
    ids=["dict", "list", "dataclass", "str", "int", "float", "none", "ack", "tuple"],
)
async def test_returned_values_are_kept_and_read_back(
    client: RedisClient, queue: JobQueue[str], value: Any, expected: Any
) -> None:
    await queue.enqueue("j", "x")

    async def handler(job: Job[str]) -> Any:
        return value

    async with running_worker(client, queue.name, handler, options=KEEP) as worker:
        await wait_until(lambda: worker.statistics(queue.name).acked == 1)
    assert await queue.result("j", timeout=5) == expected
    status = await queue.status("j")
    assert status.state == "completed"
    assert status.result_state == "value"
    assert status.attempt == 1
    assert status.finished_at is not None and status.finished_at > 0
    # the record lives in the queue's slot, with the retention as its TTL
    ttl = await client.execute("PTTL", queue.keys.result("j"))
    assert 0 < ttl <= 300_000


async def test_a_typed_codec_structures_the_value(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await queue.enqueue("j", "x")

    async def handler(job: Job[str]) -> Receipt:
        return Receipt("a@b", 7)

    async with running_worker(client, queue.name, handler, options=KEEP) as worker:
        await wait_until(lambda: worker.statistics(queue.name).acked == 1)
    assert await queue.result("j", timeout=5, codec=JsonCodec(Receipt)) == Receipt("a@b", 7)


async def test_result_waits_for_a_job_that_has_not_run_yet(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    got: list[Any] = []

    async def handler(job: Job[str]) -> dict[str, str]:
        return {"echo": job.payload}

    async def wait() -> None:
        got.append(await queue.result("later", timeout=20))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.sleep(0.2)  # the waiter is blocked on the event stream by now (or soon)
        await queue.enqueue("other", "noise")
        await queue.enqueue("later", "hello")
        async with running_worker(client, queue.name, handler, options=KEEP) as worker:
            await wait_until(lambda: got != [])
            assert worker.statistics(queue.name).acked == 2
    assert got == [{"echo": "hello"}]


async def test_a_dead_lettered_job_raises_with_its_reason_and_detail(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await queue.enqueue_many([("dl", "x"), ("failing", "y")])

    async def handler(job: Job[str]) -> Any:
        if job.id == "dl":
            return DeadLetter(detail="card declined")
        return NACK

    async with running_worker(client, queue.name, handler, options=KEEP) as worker:
        await wait_until(lambda: worker.statistics(queue.name).dead_lettered == 2)
    with pytest.raises(JobDeadLettered) as caught:
        await queue.result("dl", timeout=5)
    assert (caught.value.reason, caught.value.detail) == ("explicit", "card declined")
    with pytest.raises(JobDeadLettered) as caught:
        await queue.result("failing", timeout=5)
    assert caught.value.reason == "nack"
    status = await queue.status("dl")
    assert (status.state, status.reason, status.detail) == (
        "dead-lettered",
        "explicit",
        "card declined",
    )


async def test_too_large_and_unencodable_values_are_recorded_not_lost(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await queue.enqueue_many([("big", "x"), ("odd", "y")])

    async def handler(job: Job[str]) -> Any:
        return "x" * 2000 if job.id == "big" else object()

    options = fast_options(keep_results=60, max_result_bytes=1000, delivery_limit=1)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 2)
        assert stats.results_not_kept == 2
    for job_id, problem in (("big", "result-too-large"), ("odd", "result-unencodable")):
        status = await queue.status(job_id)
        assert (status.state, status.result_state) == ("completed", problem)
        with pytest.raises(JobResultUnavailable) as caught:
            await queue.result(job_id, timeout=5)
        assert caught.value.problem == problem
    assert [e.kind for e in await all_events(client, queue.keys)] == ["completed"] * 2


async def test_an_expired_record_is_unknown(client: RedisClient, queue: JobQueue[str]) -> None:
    await queue.enqueue("j", "x")

    async def handler(job: Job[str]) -> str:
        return "v"

    options = fast_options(keep_results=0.3, delivery_limit=1)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        await wait_until(lambda: worker.statistics(queue.name).acked == 1)
    assert (await queue.status("j")).state == "completed"

    async def gone() -> bool:
        return (await queue.status("j")).state == "unknown"

    from jobs_helpers import wait_until_async

    await wait_until_async(gone, timeout=5)
    # waiting for an outcome that already happened (and was forgotten) times out
    with pytest.raises(JobResultTimeout):
        await queue.result("j", timeout=0.3)


async def test_without_retention_a_completed_job_has_no_value(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    got: list[BaseException] = []

    async def wait() -> None:
        try:
            await queue.result("j", timeout=20)
        except JobResultUnavailable as exc:
            got.append(exc)

    async def handler(job: Job[str]) -> str:
        return "v"

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.sleep(0.2)
        await queue.enqueue("j", "x")
        async with running_worker(client, queue.name, handler):
            await wait_until(lambda: got != [])
    assert isinstance(got[0], JobResultUnavailable)
    assert got[0].problem == "not-retained"
    assert (await queue.status("j")).state == "unknown"
    assert await client.execute("EXISTS", queue.keys.result("j")) == 0


async def test_a_waiter_is_not_ended_by_the_jobs_progress_or_its_failed_attempts(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """Only a terminal event (completed, dead-letter, cancelled) ends a result waiter: the
    job's progress events and its failed first attempt come first and are passed over (a
    mutation review found no test failing when any event of the job ended the wait)."""
    got: list[BaseException] = []
    finished = anyio.Event()

    async def wait() -> None:
        try:
            await queue.result("j", timeout=20)
        except JobResultUnavailable as exc:
            got.append(exc)
        finished.set()

    async def handler(job: Job[str]) -> Any:
        await job.report_progress(50)
        if job.attempt == 1:
            return NACK  # left for recovery: an attempt that ends without an outcome
        await anyio.sleep(0.3)
        return "v"

    options = fast_options(visibility_timeout=timedelta(milliseconds=300))
    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.sleep(0.2)
        await queue.enqueue("j", "x")
        async with running_worker(client, queue.name, handler, options=options) as worker:
            with anyio.fail_after(20):
                await finished.wait()
            assert worker.statistics(queue.name).acked == 1  # ended by the completion only
    assert len(got) == 1 and got[0].problem == "not-retained", got
    kinds = [e.kind for e in await all_events(client, queue.keys) if e.job_id == "j"]
    assert kinds.count("progress") == 2 and kinds[-1] == "completed", kinds


async def test_result_times_out_with_a_typed_error(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    with anyio.fail_after(10):
        with pytest.raises(JobResultTimeout) as caught:
            await queue.result("never", timeout=0.2)
    assert caught.value.job_id == "never"
    assert isinstance(caught.value, TimeoutError)
    assert (await queue.status("never")).state == "unknown"


@pytest.mark.parametrize(
    "call",
    [
        lambda q: q.result("", timeout=1),
        lambda q: q.result("j", timeout=-1),
        lambda q: q.result("j", timeout=float("nan")),
        lambda q: q.result("j", timeout=1, codec=JsonCodec),
        lambda q: q.result("j", timeout=1, codec="json"),
        lambda q: q.status(None),
    ],
)
async def test_result_arguments_are_checked_before_sending(
    client: RedisClient, queue: JobQueue[str], call: Any
) -> None:
    with forbid_commands(client), pytest.raises(ValidationError):
        await call(queue)


@pytest.mark.parametrize(
    "changes",
    [
        {"keep_results": 0},
        {"keep_results": -1},
        {"keep_results": 10**400},
        {"keep_results": "1h"},
        {"max_result_bytes": 0},
        {"max_result_bytes": True},
        {"max_result_bytes": 2**40},
    ],
)
def test_retention_options_are_validated(changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        WorkerOptions(**changes)


async def test_a_custom_result_codec_is_used(client: RedisClient, queue: JobQueue[str]) -> None:
    from respire_actors.jobs import Worker

    await queue.enqueue("j", "x")

    async def handler(job: Job[str]) -> str:
        return "plain text"

    worker = Worker()
    worker.register(queue.name, handler, StrCodec(), KEEP, result_codec=StrCodec())
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        await wait_until(lambda: worker.statistics(queue.name).acked == 1)
        await worker.stop()
    assert await client.execute("HGET", queue.keys.result("j"), "result") == b"plain text"
    assert await queue.result("j", timeout=5, codec=StrCodec()) == "plain text"


async def test_results_on_a_cluster(cluster_client: RedisClient, unique_name: str) -> None:
    """The record key shares the queue's hash tag, so job_finish and result() work on a
    cluster; the pipelined job_finish calls of one batch go to the queue's node."""
    client = cluster_client
    queue: JobQueue[str] = JobQueue(client, unique_name, StrCodec())
    await queue.enqueue_many([("a", "1"), ("b", "2"), ("c", "3")])

    async def handler(job: Job[str]) -> Any:
        return DeadLetter(detail="no") if job.id == "c" else {"n": int(job.payload)}

    async with running_worker(client, queue.name, handler, options=KEEP) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 2 and stats.dead_lettered == 1)
    assert await queue.result("a", timeout=5) == {"n": 1}
    assert await queue.result("b", timeout=5) == {"n": 2}
    with pytest.raises(JobDeadLettered):
        await queue.result("c", timeout=5)


async def test_a_job_dead_lettered_by_recovery_is_reported_from_its_event(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """Recovery dead-letters a job whose lease ran out at the delivery limit without the
    handler's registration (so no record): the waiter learns it from the dead-letter event."""
    got: list[JobDeadLettered] = []

    async def wait() -> None:
        try:
            await queue.result("stuck", timeout=20)
        except JobDeadLettered as exc:
            got.append(exc)

    async def handler(job: Job[str]) -> Any:
        await anyio.sleep_forever()  # cancelled when the lease runs out

    options = fast_options(
        keep_results=60, delivery_limit=1, visibility_timeout=0.3, renew_leases=False
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.sleep(0.2)
        await queue.enqueue("stuck", "x")
        async with running_worker(client, queue.name, handler, options=options):
            await wait_until(lambda: got != [], timeout=20)
    assert got[0].reason == "delivery-limit"
    assert (await queue.status("stuck")).state == "unknown"


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str boom")


async def test_a_handler_failure_carries_its_exception_into_the_dead_letter(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """Found by review: a handler that raised was dead-lettered with an empty detail, so the
    cause was only in the worker's log. The detail is now the exception's type and text (an
    exception whose str() fails too, without ending the runners), and so is a payload the
    worker could not decode."""
    await queue.enqueue_many([("raises", "x"), ("unprintable", "y"), ("awaitable", "z")])

    async def handler(job: Job[str]) -> Any:
        if job.id == "raises":
            raise ValueError("bad value 42")
        if job.id == "unprintable":
            raise _Unprintable()
        return anyio.sleep(0.01)  # not awaited: a failure

    async with running_worker(client, queue.name, handler, options=KEEP) as worker:
        await wait_until(lambda: worker.statistics(queue.name).dead_lettered == 3)
    expected = {
        "raises": "ValueError: bad value 42",
        "unprintable": "_Unprintable: <_Unprintable whose str() failed>",
        "awaitable": "TypeError: the handler returned an awaitable without awaiting it",
    }
    for job_id, detail in expected.items():
        with pytest.raises(JobDeadLettered) as caught:
            await queue.result(job_id, timeout=5)
        assert (caught.value.reason, caught.value.detail) == ("processing-failed", detail)
    rows = await client.execute("XRANGE", queue.keys.dead, "-", "+")
    details = {
        dict(zip(r[1][::2], r[1][1::2], strict=True))[b"_respire.job.id"].decode(): dict(
            zip(r[1][::2], r[1][1::2], strict=True)
        ).get(b"_respire.detail")
        for r in rows
    }
    assert details == {k: v.encode() for k, v in expected.items()}


@dataclass
class V2:
    n: int
    tenant: str


async def test_a_payload_the_worker_cannot_decode_names_the_field(
    client: RedisClient, unique_name: str
) -> None:
    """A payload written for an older schema: the dead letter says which field is missing
    (cattrs' own message only said 'While structuring V2 (1 sub-exception)')."""
    old = JobQueue(client, unique_name, JsonCodec(dict[str, int]))
    await old.enqueue("v1", {"n": 1})

    async def handler(job: Job[V2]) -> None:
        raise AssertionError("never called")

    queue = JobQueue(client, unique_name, JsonCodec(V2))
    options = fast_options(keep_results=timedelta(minutes=5), delivery_limit=1)
    async with running_worker(
        client, queue.name, handler, options=options, codec=JsonCodec(V2)
    ) as worker:
        await wait_until(lambda: worker.statistics(queue.name).dead_lettered == 1)
    with pytest.raises(JobDeadLettered) as caught:
        await queue.result("v1", timeout=5)
    assert "required field missing @ $.tenant" in caught.value.detail
