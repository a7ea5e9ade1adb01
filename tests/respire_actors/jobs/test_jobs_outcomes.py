"""What handlers return (issue 8, items 4, 14 and 16): outcomes are validated where the handler
builds them and again where the runner receives them; the completer isolates one bad
completion instead of losing its batch; a plain return value is a success; decode failures
follow the nack policy unless ``dead_letter_undecodable`` asks for an immediate dead letter."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import anyio
import pytest
from jobs_helpers import (
    all_events,
    create_group,
    deliver,
    fast_options,
    pending_rows,
    running_worker,
    wait_until,
)

from respire_actors.actors.completer import commit
from respire_actors.actors.messages import MAX_DETAIL_BYTES, Completion
from respire_actors.actors.runtime import QueueRuntime
from respire_actors.codecs import JsonCodec
from respire_actors.errors import ResultTooLarge, ValidationError
from respire_actors.jobs import (
    ACK,
    NACK,
    Complete,
    DeadLetter,
    DeadLetterReason,
    Job,
    JobQueue,
    RetryAfter,
    Worker,
)
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


# -- validation where the outcome is built -----------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda: DeadLetter(reason=None),  # type: ignore[arg-type]
        lambda: DeadLetter(reason="x" * 5_000_000),
        lambda: DeadLetter(reason="poison pill"),
        lambda: DeadLetter(reason=7),  # type: ignore[arg-type]
        lambda: DeadLetter(detail="x" * (MAX_DETAIL_BYTES + 1)),
        lambda: DeadLetter(detail="é" * (MAX_DETAIL_BYTES // 2 + 1)),  # bytes, not characters
        lambda: DeadLetter(detail="\ud800"),
        lambda: DeadLetter(detail=None),  # type: ignore[arg-type]
        lambda: RetryAfter(-5),
        lambda: RetryAfter(2**31),
        lambda: RetryAfter(True),
        lambda: RetryAfter(1.5),  # type: ignore[arg-type]
        lambda: RetryAfter(None),  # type: ignore[arg-type]
    ],
)
def test_malformed_outcomes_are_refused_where_they_are_built(build: Callable[[], Any]) -> None:
    with pytest.raises(ValidationError):
        build()


def test_reasons_accept_the_enum_or_its_value_and_details_are_kept_whole() -> None:
    assert DeadLetter(DeadLetterReason.NACK).reason == "nack"
    assert DeadLetter("processing-failed").reason == "processing-failed"
    assert DeadLetter().reason == "explicit"
    detail = "é" * (MAX_DETAIL_BYTES // 2)
    assert DeadLetter(detail=detail).detail == detail
    assert RetryAfter(0).delay_ms == 0
    assert RetryAfter(2**31 - 1).delay_ms == 2**31 - 1


def _forged(outcome: Any, **fields: Any) -> Any:
    for name, value in fields.items():
        object.__setattr__(outcome, name, value)
    return outcome


@pytest.mark.parametrize(
    "forge",
    [
        lambda: _forged(DeadLetter(), reason=None),
        lambda: _forged(DeadLetter(), reason="x" * 5_000_000),
        lambda: _forged(DeadLetter(), detail="x" * 5_000_000),
        lambda: _forged(RetryAfter(1), delay_ms=-5),
        lambda: DeadLetter,  # the class, not an outcome
    ],
    ids=["reason-none", "reason-5mb", "detail-5mb", "negative-delay", "class"],
)
async def test_a_forged_outcome_is_a_handler_failure_and_spares_other_jobs(
    client: RedisClient, queue: JobQueue[str], forge: Callable[[], Any]
) -> None:
    """Before the fix the forged outcome reached the completer, whose batch call failed and
    lost the unrelated outcomes batched with it."""
    await queue.enqueue_many([(f"ok-{i}", "fine") for i in range(5)] + [("bad", "forge")])

    async def handler(job: Job[str]) -> Any:
        return forge() if job.payload == "forge" else ACK

    options = fast_options(delivery_limit=1, visibility_timeout=60)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 5 and stats.dead_lettered == 1)
        assert stats.invalid_outcomes == 1
        assert stats.failed == 1
        assert stats.rejected_completions == 0
    ((_, fields),) = await queue.read_dead_letters()
    assert fields["_respire.job.id"] == b"bad"
    assert fields["_respire.reason"] == b"processing-failed"
    assert await pending_rows(client, queue.keys) == []


# -- the completer isolates one bad completion -------------------------------------------------


async def _three_deliveries(
    client: RedisClient, queue: JobQueue[str], make_runtime: Callable[..., QueueRuntime], **kw: Any
) -> tuple[QueueRuntime, list[Any]]:
    await queue.enqueue_many([("a", "1"), ("b", "2"), ("c", "3")])
    await create_group(client, queue.keys)
    rt = make_runtime(queue.name, consumer="c1", **kw)
    deliveries = await deliver(client, queue.keys, "c1", count=3)
    assert [d.job_id for d in deliveries] == ["a", "b", "c"]
    return rt, deliveries


@pytest.mark.parametrize(
    "corrupt",
    [
        {"reason": None},
        {"reason": "x" * 5_000_000},
        {"detail": "x" * 5_000_000},
        {"kind": "launch"},
        {"delay_ms": -5},
        {"result": "not bytes"},
    ],
    ids=["reason-none", "reason-5mb", "detail-5mb", "kind", "delay", "result"],
)
async def test_a_malformed_completion_does_not_cost_its_batch(
    client: RedisClient,
    queue: JobQueue[str],
    make_runtime: Callable[..., QueueRuntime],
    corrupt: dict[str, Any],
) -> None:
    rt, (a, b, c) = await _three_deliveries(client, queue, make_runtime)
    bad = Completion(b, "dead", "explicit")
    for name, value in corrupt.items():
        object.__setattr__(bad, name, value)
    statuses = await commit(rt, [Completion(a, "ack"), bad, Completion(c, "ack")])
    assert statuses == [1, 0, 1]
    assert rt.stats.acked == 2
    assert rt.stats.rejected_completions == 1
    # the good ones committed; the bad one is still pending for recovery
    assert [(e.kind, e.job_id) for e in await all_events(client, queue.keys)] == [
        ("completed", "a"),
        ("completed", "c"),
    ]
    assert [r[0] for r in await pending_rows(client, queue.keys)] == [b.entry_id]


async def test_a_completion_the_server_refuses_is_isolated(
    client: RedisClient, queue: JobQueue[str], make_runtime: Callable[..., QueueRuntime]
) -> None:
    """One job's result record key holds a string: its job_finish call is refused
    (RESPIRE_WRONGTYPE) while the others in the same pipeline commit."""
    rt, (a, b, c) = await _three_deliveries(
        client, queue, make_runtime, options=fast_options(keep_results=60)
    )
    await client.execute("SET", queue.keys.result("b"), "squatter")
    batch = [
        Completion(a, "ack", keep_ms=60_000, result_state="value", result=b"1"),
        Completion(b, "ack", keep_ms=60_000, result_state="value", result=b"2"),
        Completion(c, "dead", "explicit", keep_ms=60_000),
    ]
    assert await commit(rt, batch) == [1, 0, 1]  # returns; the completer survives
    assert rt.stats.rejected_completions == 1
    assert (rt.stats.acked, rt.stats.dead_lettered, rt.stats.stale_completions) == (1, 1, 0)
    kinds = [(e.kind, e.job_id) for e in await all_events(client, queue.keys)]
    assert sorted(kinds) == [("completed", "a"), ("dead-letter", "c")]
    assert [r[0] for r in await pending_rows(client, queue.keys)] == [b.entry_id]
    assert (await queue.status("a")).state == "completed"
    assert (await queue.status("c")).state == "dead-lettered"


# -- plain return values are successes ---------------------------------------------------------


@dataclass
class Receipt:
    to: str
    n: int


@pytest.mark.parametrize(
    "value",
    ["sent", 42, 0, False, [1, 2], {"ok": True}, Receipt("a@b", 1), b"raw", object()],
    ids=["str", "int", "zero", "false", "list", "dict", "dataclass", "bytes", "object"],
)
async def test_a_plain_return_value_is_a_success(
    client: RedisClient, queue: JobQueue[str], value: object
) -> None:
    """Before the fix a value that is not an outcome was treated as a failure and ended in
    the dead-letter stream."""
    await queue.enqueue("j", "x")

    async def handler(job: Job[str]) -> Any:
        return value

    options = fast_options(delivery_limit=1)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 1)
        assert stats.failed == 0
        assert stats.dead_lettered == 0
    assert [e.kind for e in await all_events(client, queue.keys)] == ["completed"]
    assert await queue.read_dead_letters() == []


# -- decode failures follow the nack policy ----------------------------------------------------


async def test_an_undecodable_payload_is_retried_then_dead_lettered_at_the_limit(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """Before the fix an undecodable payload was dead-lettered on its first delivery."""
    bad = await queue.enqueue("bad", "not json")
    await queue.enqueue("good", "42")
    handled: list[int] = []

    async def handler(job: Job[int]) -> Any:
        handled.append(job.payload)
        return ACK

    options = fast_options(delivery_limit=3, visibility_timeout=0.3)
    async with running_worker(
        client, queue.name, handler, codec=JsonCodec(int), options=options
    ) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.dead_lettered == 1 and stats.acked == 1, timeout=20)
        assert stats.decode_failures == 3  # one per delivery; the third reaches the limit
        assert stats.nacked == 3
    assert handled == [42]
    ((_, fields),) = await queue.read_dead_letters()
    assert fields["_respire.source_id"] == bad.entry_id.encode()
    assert fields["_respire.reason"] == b"processing-failed"
    assert fields["_respire.attempt"] == b"3"


async def test_an_undecodable_payload_with_durable_retries_is_retried(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    from respire_actors.jobs import QueueOptions, Worker

    await queue.enqueue("bad", "not json")
    worker = Worker()

    async def handler(job: Job[int]) -> Any:
        return NACK

    worker.register(
        queue.name,
        handler,
        JsonCodec(int),
        fast_options(delivery_limit=2, visibility_timeout=60),
        queue_options=QueueOptions(retry_backoff=0.01, scheduling_poll_interval=0.05),
    )
    import anyio

    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.dead_lettered == 1, timeout=20)
        assert stats.retried == 1
        assert stats.decode_failures == 2
        await worker.stop()
    ((_, fields),) = await queue.read_dead_letters()
    assert fields["_respire.reason"] == b"processing-failed"


def test_decode_options_are_validated() -> None:
    with pytest.raises(ValidationError):
        fast_options(dead_letter_undecodable="yes")
    assert replace(fast_options(), dead_letter_undecodable=True).dead_letter_undecodable


class ScriptedSource:
    """A stand-in for the job source's ``complete`` step (not a Redis double: it replaces our
    own Source protocol to drive the completer's isolation rules)."""

    name = "scripted"

    def __init__(self, refuse: str, error: Exception) -> None:
        self.refuse = refuse
        self.error = error
        self.calls: list[list[str]] = []
        self.transient = 1

    async def complete(self, consumer: str, batch: list[Completion]) -> list[int]:
        self.calls.append([c.delivery.job_id for c in batch])
        if any(c.delivery.job_id == "flaky" for c in batch) and self.transient:
            self.transient -= 1
            from respire_actors.errors import RedisUnavailable

            raise RedisUnavailable("connection dropped")
        if any(c.delivery.job_id == self.refuse for c in batch):
            raise self.error
        return [1] * len(batch)


def _completions(*job_ids: str) -> list[Completion]:
    from respire_actors.actors.messages import Delivery

    return [
        Completion(Delivery(f"1-{i}", {b"_respire.job.id": j.encode()}, 1), "ack")
        for i, j in enumerate(job_ids)
    ]


async def test_a_refused_batch_call_is_committed_again_one_by_one(
    client: RedisClient, queue: JobQueue[str], make_runtime: Callable[..., QueueRuntime]
) -> None:
    from respire_actors.errors import ScriptError

    rt = make_runtime(queue.name)
    source = ScriptedSource("bad", ScriptError("RESPIRE_ARGUMENT completion batch is malformed"))
    rt.source = source
    assert await commit(rt, _completions("a", "bad", "c")) == [1, 0, 1]
    assert source.calls == [["a", "bad", "c"], ["a"], ["bad"], ["c"]]
    assert (rt.stats.acked, rt.stats.rejected_completions) == (2, 1)


async def test_an_acl_refusal_still_stops_the_completer_and_unavailability_is_retried(
    client: RedisClient, queue: JobQueue[str], make_runtime: Callable[..., QueueRuntime]
) -> None:
    from respire_actors.errors import PermissionDenied

    rt = make_runtime(queue.name)
    rt.source = ScriptedSource("x", PermissionDenied("NOPERM no"))
    with pytest.raises(PermissionDenied):
        await commit(rt, _completions("a", "x"))
    source = ScriptedSource("none", ValueError("unused"))
    rt.source = source
    assert await commit(rt, _completions("flaky", "b")) == [1, 1]
    assert source.calls == [["flaky", "b"], ["flaky", "b"]]  # the whole batch, again


# -- Job.complete (flow results) outside a flow ------------------------------------------------


async def test_complete_outside_a_flow_is_an_ordinary_success(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    await queue.enqueue("j", "x")

    async def handler(job: Job[str]) -> Any:
        assert job.flow_id is None and job.flow_node is None and job.batch_id is None
        return job.complete(b"")

    async with running_worker(client, queue.name, handler, options=fast_options()) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 1)
        assert stats.failed == 0
    assert [e.kind for e in await all_events(client, queue.keys)] == ["completed"]
    assert await pending_rows(client, queue.keys) == []


@pytest.mark.parametrize(
    ("result", "error"),
    [(b"x" * 4097, ResultTooLarge), ("text", ValidationError), (None, ValidationError)],
    ids=["oversize", "str", "none"],
)
async def test_complete_refuses_a_bad_result_in_the_handler(
    client: RedisClient, queue: JobQueue[str], result: Any, error: type[Exception]
) -> None:
    await queue.enqueue("j", "x")
    raised: list[Exception] = []

    async def handler(job: Job[str]) -> Any:
        try:
            return job.complete(result)
        except Exception as exc:
            raised.append(exc)
            raise

    options = fast_options(delivery_limit=1)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.dead_lettered == 1)
        assert stats.acked == 0
    assert len(raised) == 1 and type(raised[0]) is error
    assert Complete(b"x" * 4096).result == b"x" * 4096  # the limit itself is allowed


# -- a handler's own CancelledError ------------------------------------------------------------


async def _only_the_bad_job_fails(client: RedisClient, queue: JobQueue[str], handler: Any) -> None:
    """Run ``handler`` over ok-0..2 and bad: bad is dead-lettered as a processing failure, the
    three others complete at their first attempt (none was cancelled and run again)."""
    options = fast_options(delivery_limit=1, visibility_timeout=60)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 3 and stats.dead_lettered == 1)
        assert stats.failed == 1 and stats.leases_lost == 0
    ((_, fields),) = await queue.read_dead_letters()
    assert fields["_respire.job.id"] == b"bad"
    assert fields["_respire.reason"] == b"processing-failed"
    completed = [e for e in await all_events(client, queue.keys) if e.kind == "completed"]
    assert sorted(e.job_id for e in completed) == ["ok-0", "ok-1", "ok-2"]
    assert {e.attempt for e in completed} == {1}
    assert await pending_rows(client, queue.keys) == []


async def test_a_handlers_own_cancelled_error_is_its_failure_and_spares_the_others(
    client: RedisClient, queue: JobQueue[str], anyio_backend: str
) -> None:
    """An ``asyncio.CancelledError`` a handler lets escape (it awaited a task that was
    cancelled, or raised one) used to end the runners' task group on asyncio: every other
    running handler was cancelled and lost an attempt. It is that handler's failure now, on
    both backends; the others finish their first attempt."""
    import asyncio

    await queue.enqueue_many([(f"ok-{i}", "slow") for i in range(3)] + [("bad", "cancel")])
    started: set[str] = set()

    async def handler(job: Job[str]) -> Any:
        started.add(job.id)
        if job.payload == "cancel":
            await wait_until(lambda: len(started) == 4)  # the others are running
            if anyio_backend == "asyncio":
                inner = asyncio.ensure_future(asyncio.sleep(10))
                inner.cancel()
                await inner  # raises the inner task's CancelledError
            raise asyncio.CancelledError("raised by the handler")
        await wait_until(lambda: len(started) == 4)
        await anyio.sleep(0.3)  # still running when the bad handler fails
        return ACK

    await _only_the_bad_job_fails(client, queue, handler)


async def test_a_handler_cancelling_its_own_task_fails_only_itself(
    client: RedisClient, queue: JobQueue[str], anyio_backend: str
) -> None:
    """Found by review: a handler that cancels its own task (``current_task().cancel()`` on
    asyncio; a hand-made ``trio.Cancelled`` under trio) ended the runners' task group, so the
    jobs running beside it were cancelled and charged an attempt. No cancel scope asked for
    that cancellation: it is that job's failure, and the others finish their first attempt."""
    import asyncio

    await queue.enqueue_many([(f"ok-{i}", "slow") for i in range(3)] + [("bad", "cancel")])
    started: set[str] = set()

    async def handler(job: Job[str]) -> Any:
        started.add(job.id)
        if job.payload == "cancel":
            await wait_until(lambda: len(started) == 4)  # the others are running
            if anyio_backend == "asyncio":
                task = asyncio.current_task()
                assert task is not None
                task.cancel()
                await asyncio.sleep(1)
            import trio

            raise trio.Cancelled._create()  # type: ignore[attr-defined]
        await wait_until(lambda: len(started) == 4)
        await anyio.sleep(0.3)  # still running when the bad handler fails
        return ACK

    await _only_the_bad_job_fails(client, queue, handler)


async def test_a_coroutine_returned_without_await_is_a_failure(
    client: RedisClient, queue: JobQueue[str]
) -> None:
    """``return do_work(job)`` without await: the work never ran. Found by review: it was a
    success (a completed event, the job gone) with only a RuntimeWarning to show for it."""
    await queue.enqueue("j", "x")
    ran: list[str] = []

    async def do_work(job: Job[str]) -> None:
        ran.append(job.id)

    async def handler(job: Job[str]) -> Any:
        return do_work(job)  # the missing await

    options = fast_options(delivery_limit=1)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.dead_lettered == 1)
        assert stats.acked == 0 and stats.failed == 1 and stats.invalid_outcomes == 1
    assert ran == []
    ((_, fields),) = await queue.read_dead_letters()
    assert fields["_respire.reason"] == b"processing-failed"


# -- a handler raising what is not an Exception ------------------------------------------------


class Poison(BaseException):
    """A BaseException of the handler's own (not an Exception)."""


def _group_of_poison() -> BaseException:
    return BaseExceptionGroup("several", [Poison("a"), ValueError("b")])


@pytest.mark.parametrize(
    "make",
    [lambda: Poison("odd"), lambda: GeneratorExit(), _group_of_poison],
    ids=["base-exception", "generator-exit", "base-exception-group"],
)
async def test_a_base_exception_is_that_jobs_failure_and_spares_the_others(
    client: RedisClient, queue: JobQueue[str], make: Callable[[], BaseException]
) -> None:
    """It used to escape the runners' task group: every handler beside it was cancelled, the
    worker crashed, and each of its jobs was charged a delivery (a poison job then dead-lettered
    its healthy neighbours at the delivery limit)."""
    await queue.enqueue_many([(f"ok-{i}", "fine") for i in range(4)] + [("bad", "raise")])
    started = anyio.Event()
    running = 0

    async def handler(job: Job[str]) -> Any:
        nonlocal running
        if job.payload == "raise":
            with anyio.fail_after(5):
                await started.wait()  # the others are running beside it
            raise make()
        running += 1
        if running == 4:
            started.set()
        await anyio.sleep(0.3)
        return ACK

    options = fast_options(consumer_count=5, delivery_limit=1, visibility_timeout=60)
    async with running_worker(client, queue.name, handler, options=options) as worker:
        stats = worker.statistics(queue.name)
        await wait_until(lambda: stats.acked == 4 and stats.dead_lettered == 1)
        assert stats.failed == 1 and stats.started == 5
    ((_, fields),) = await queue.read_dead_letters()
    assert fields["_respire.job.id"] == b"bad"
    assert fields["_respire.reason"] == b"processing-failed"
    assert await pending_rows(client, queue.keys) == []


@pytest.mark.parametrize("exit_exc", [SystemExit(3), KeyboardInterrupt()], ids=["exit", "ki"])
async def test_a_handler_asking_the_process_to_exit_stops_the_worker_gracefully(
    client: RedisClient, queue: JobQueue[str], exit_exc: BaseException
) -> None:
    """SystemExit or KeyboardInterrupt from a handler: that job fails (nack policy), the jobs
    beside it finish and commit within the shutdown grace, and ``run`` raises it."""
    await queue.enqueue_many([(f"ok-{i}", "fine") for i in range(3)] + [("bad", "exit")])
    started = anyio.Event()
    running = 0

    async def handler(job: Job[str]) -> Any:
        nonlocal running
        if job.payload == "exit":
            with anyio.fail_after(5):
                await started.wait()
            raise exit_exc
        running += 1
        if running == 3:
            started.set()
        await anyio.sleep(0.3)
        return ACK

    worker = Worker()
    worker.register(
        queue.name, handler, queue.codec, fast_options(consumer_count=4, delivery_limit=1)
    )
    with anyio.fail_after(15), pytest.raises(type(exit_exc)):
        await worker.run(client)
    stats = worker.statistics(queue.name)
    assert (stats.acked, stats.dead_lettered, stats.failed) == (3, 1, 1)
    assert await pending_rows(client, queue.keys) == []
