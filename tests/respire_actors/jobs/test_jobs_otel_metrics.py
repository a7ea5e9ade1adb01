"""OpenTelemetry metrics of a job worker: counters observed from the worker's statistics, the
handler duration histogram, and gauges the sampler reads from Redis when a collection asks."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import anyio
import pytest
from helpers.otel import Otel
from jobs_helpers import deliver, fast_options, running_worker, wait_until
from sched_helpers import sched_options, scheduling_worker

from respire_actors.actors import metrics as worker_metrics
from respire_actors.actors.messages import Completion, Delivery
from respire_actors.actors.sampler import parse_sample
from respire_actors.actors.telemetry import observe_commits
from respire_actors.codecs import BytesCodec, JsonValueCodec
from respire_actors.jobs import ACK, DeadLetter, Job, JobQueue, RetryAfter
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


async def eventually(otel: Otel, check: Callable[[], bool], *, timeout: float = 10.0) -> None:
    """Collect until ``check`` holds: each collection asks the sampler for a fresh sample."""
    with anyio.fail_after(timeout):
        while not check():  # noqa: ASYNC110 - collections are what we wait on
            await anyio.sleep(0.05)


async def test_counters_and_durations_after_a_known_mix_of_outcomes(
    otel: Otel, client: RedisClient, unique_name: str
) -> None:
    raw = JobQueue(client, unique_name, BytesCodec())
    tries: dict[str, int] = {}

    async def handler(job: Job[Any]) -> object:
        tries[job.id] = tries.get(job.id, 0) + 1
        if job.payload == "explicit":
            return DeadLetter()
        if job.payload == "raise":
            raise RuntimeError("boom")
        if job.payload == "later" and tries[job.id] == 1:
            return RetryAfter(1)
        return ACK

    jobs = [("ok1", b'"ok"'), ("ok2", b'"ok"'), ("ok3", b'"ok"'), ("explicit", b'"explicit"')]
    jobs += [("raise", b'"raise"'), ("later", b'"later"'), ("bad", b"{not json")]
    await raw.enqueue_many(jobs)
    name = f"{unique_name}-m"
    options = fast_options(delivery_limit=2, telemetry_name=name)
    qo = sched_options(retry_backoff=timedelta(milliseconds=1))
    async with scheduling_worker(
        client, unique_name, handler, options=options, queue_options=qo, codec=JsonValueCodec()
    ) as worker:
        stats = worker.statistics(unique_name)
        await wait_until(lambda: stats.acked == 4 and stats.dead_lettered == 3)
        outcomes = otel.values("respire.outcomes", name)
        dead = {
            dict(k)["respire.dead_letter.reason"]: v
            for k, v in outcomes.items()
            if dict(k)["respire.outcome"] == "dead-letter"
        }
        plain = {dict(k)["respire.outcome"]: v for k, v in outcomes.items() if len(k) == 1}
        assert plain == {"completed": 4, "nack": 5, "retry": 3, "expired": 0, "cancelled": 0}
        assert sum(dead.values()) == 3 and dead["recovery-limit"] == 0
        assert otel.values("respire.decode.failures", name) == {(): 2}
        assert otel.values("respire.lease.losses", name) == {(): 0}
        assert otel.values("respire.recovery.lost_payloads", name) == {(): 0}
        assert otel.values("respire.rate_limit.hits", name) == {(): 0}
        claims = otel.values("respire.recovery.claims", name)
        assert claims == {
            (("respire.recovery.mode", "recover"),): 0,
            (("respire.recovery.mode", "replay"),): 0,
        }
        durations = {
            attrs["respire.handler.result"]: point
            for attrs, point in otel.points("respire.handler.duration", name)
        }
        assert durations["returned"].count == 6
        assert durations["raised"].count == 2
        assert 0 <= durations["returned"].min <= durations["returned"].max < 5
        assert tries == {"ok1": 1, "ok2": 1, "ok3": 1, "explicit": 1, "raise": 2, "later": 2}
    # a stopped worker is no longer observed
    assert otel.values("respire.outcomes", name) == {}


async def test_gauges_are_sampled_from_redis_when_collected(
    otel: Otel, client: RedisClient, unique_name: str
) -> None:
    queue = JobQueue(client, unique_name, BytesCodec())
    release = anyio.Event()
    running = 0

    async def handler(job: Job[bytes]) -> object:
        nonlocal running
        running += 1
        await release.wait()
        return ACK

    name = f"{unique_name}-g"
    options = fast_options(consumer_count=2, read_batch=2, telemetry_name=name)
    await queue.enqueue_many([("a", b"1"), ("b", b"2")])
    async with scheduling_worker(
        client, unique_name, handler, options=options, codec=BytesCodec()
    ) as worker:
        await wait_until(lambda: running == 2)
        await anyio.sleep(0.01)  # the third job is a little younger than the clock's tick
        await queue.enqueue("c", b"3")
        await queue.pause()

        def state() -> bool:
            values = {
                metric: otel.values(metric, name).get(())
                for metric in (
                    "respire.pending.count",
                    "respire.consumer_group.lag",
                    "respire.queue.paused",
                    "respire.admission.in_use",
                    "respire.backlog.oldest_age",
                    "respire.pending.oldest_age",
                )
            }
            return (
                values["respire.pending.count"] == 2
                and values["respire.consumer_group.lag"] == 1
                and values["respire.queue.paused"] == 1
                and values["respire.admission.in_use"] == 2
                and (values["respire.backlog.oldest_age"] or 0) > 0
                and (values["respire.pending.oldest_age"] or 0) > 0
            )

        await eventually(otel, state)
        await queue.resume()
        release.set()
        await wait_until(lambda: worker.statistics(unique_name).acked == 3)
        await eventually(
            otel,
            lambda: (
                otel.values("respire.pending.count", name).get(()) == 0
                and otel.values("respire.queue.paused", name).get(()) == 0
                and otel.values("respire.backlog.oldest_age", name).get(()) == 0
                and otel.values("respire.consumer_group.lag", name).get(()) == 0
            ),
        )


async def test_overdue_counts_what_recovery_should_have_reclaimed_not_long_handlers(
    otel: Otel, client: RedisClient, unique_name: str
) -> None:
    """Found by review: the documented "deliveries are stuck" alert used the age of the oldest
    pending entry since it was appended, so a job that had waited in the backlog, or a long
    handler whose lease was renewed, tripped it. respire.pending.overdue counts only entries
    idle past the visibility timeout plus a recovery interval: here a crashed consumer's
    entry that recovery may not take while the queue is paused, and not the handler that has
    been running for several visibility timeouts."""
    queue = JobQueue(client, unique_name, BytesCodec())
    started = anyio.Event()
    release = anyio.Event()

    async def handler(job: Job[bytes]) -> object:
        started.set()
        await release.wait()
        return ACK

    name = f"{unique_name}-o"
    options = fast_options(visibility_timeout=timedelta(milliseconds=300), telemetry_name=name)
    async with scheduling_worker(
        client, unique_name, handler, options=options, codec=BytesCodec()
    ) as worker:
        await queue.enqueue("long", b"2")
        await started.wait()
        await queue.pause()  # no more reads and no recovery: the crashed entry stays put
        await queue.enqueue("crashed", b"1")
        assert len(await deliver(client, queue.keys, "ghost")) == 1
        await anyio.sleep(1.0)  # the handler runs past three visibility timeouts

        def state() -> bool:
            return (
                otel.values("respire.pending.count", name).get(()) == 2
                and otel.values("respire.pending.overdue", name).get(()) == 1
            )

        await eventually(otel, state)
        assert worker.statistics(unique_name).leases_lost == 0
        release.set()
        await queue.resume()
        await wait_until(lambda: worker.statistics(unique_name).acked == 2)
        await eventually(otel, lambda: otel.values("respire.pending.overdue", name).get(()) == 0)


async def test_nothing_reads_redis_while_nobody_collects(
    client: RedisClient, unique_name: str
) -> None:
    queue = JobQueue(client, unique_name, BytesCodec())

    async def handler(job: Job[bytes]) -> object:
        return ACK

    options = fast_options(telemetry_name=f"{unique_name}-q")
    async with scheduling_worker(client, unique_name, handler, options=options) as worker:
        await queue.enqueue("a", b"1")
        await wait_until(lambda: worker.statistics(unique_name).acked == 1)
        rt = worker._runtimes[unique_name]
        observed = worker_metrics._observed[id(rt)]
        await anyio.sleep(0.6)  # two sampler polls
        assert observed.samples_taken == 0


def test_parse_sample_handles_missing_and_null_values() -> None:
    empty = parse_sample(10_000, [0, None, None, None], [], "respire", None, [])
    assert (empty.pending, empty.oldest_pending_age_s, empty.lag) == (0, 0.0, None)
    assert empty.paused is False and empty.oldest_backlog_age_s is None
    group = [[b"name", b"respire", b"lag", None, b"last-delivered-id", b"5-0"]]
    sample = parse_sample(10_000, [3, b"4000-0", b"9000-1", []], group, "respire", b"1", [])
    assert (sample.pending, sample.oldest_pending_age_s) == (3, 6.0)
    assert sample.lag is None  # Redis could not tell: not reported
    assert sample.paused is True and sample.oldest_backlog_age_s == 0.0
    backlog = parse_sample(10_000, [0, None, None, None], group, "respire", None, [[b"7500-0", []]])
    assert backlog.oldest_backlog_age_s == 2.5


async def test_dead_letters_are_counted_by_fixed_reason_when_commits_are_observed(
    make_runtime: Callable[..., Any], unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    rt = make_runtime(unique_name)
    d = Delivery("1-0", {b"_respire.job.id": b"j"}, 1)
    batch = [
        Completion(d, "dead", "explicit"),
        Completion(d, "dead", "nack"),
        Completion(d, "dead", "explicit"),
        Completion(d, "dead", "made-up"),
        Completion(d, "dead", "nack"),  # stale: not counted
        Completion(d, "ack"),
        Completion(d, "retry", "nack", 5),
    ]
    with caplog.at_level("INFO", logger="respire_actors.telemetry"):
        observe_commits(rt, batch, [1, 1, 1, 1, 0, 1, 1])
    assert rt.stats.dead_letter_reasons == {"explicit": 2, "nack": 1}
    events = [getattr(r, "event", None) for r in caplog.records]
    assert events == ["dead-lettered"] * 4 + ["retry-scheduled"]  # the ack is DEBUG
    rt.stats.dead_lettered = 5
    rt.stats.dead_lettered_by_recovery = 2
    by_reason = {
        a["respire.dead_letter.reason"]: v
        for a, v in worker_metrics._outcomes(rt.stats)
        if a["respire.outcome"] == "dead-letter"
    }
    assert by_reason == {"explicit": 2, "nack": 1, "recovery-limit": 2, "unclassified": 2}


async def test_gauges_and_spans_on_a_cluster(
    otel: Otel, cluster_client: RedisClient, unique_name: str
) -> None:
    """The sampler's pipeline touches only the queue's slot (TIME goes to any node), and the
    producer context travels through a cluster enqueue."""
    queue = JobQueue(cluster_client, unique_name, BytesCodec())
    release = anyio.Event()

    async def handler(job: Job[bytes]) -> object:
        await release.wait()
        return ACK

    name = f"{unique_name}-c"
    await queue.enqueue("a", b"1")
    options = fast_options(consumer_count=1, read_batch=1, telemetry_name=name)
    async with running_worker(cluster_client, unique_name, handler, options=options) as worker:
        await queue.enqueue("b", b"2")
        await eventually(
            otel,
            lambda: (
                otel.values("respire.pending.count", name).get(()) == 1
                and otel.values("respire.consumer_group.lag", name).get(()) == 1
                and otel.values("respire.queue.paused", name).get(()) == 0
            ),
        )
        release.set()
        await wait_until(lambda: worker.statistics(unique_name).acked == 2)
    producers = {(s.attributes or {})["respire.job.id"]: s for s in otel.spans("job enqueue")}
    for span in otel.spans("job process"):
        [link] = span.links
        job_id = (span.attributes or {})["respire.job.id"]
        assert link.context.span_id == producers[job_id].context.span_id
