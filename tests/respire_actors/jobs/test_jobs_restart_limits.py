"""The restart policy of a worker's tree (docs/architecture.md, "Restart policy"): one
registration whose actors keep failing on a transient error (an outage) backs off and starts
again forever without counting against the root, so the other queues keep working; a permanent
error still stops the worker. The failing actor is injected in place of queue A's retention
keeper (a real worker, real servers): it stands for any actor an outage makes fail."""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio
import anyio.abc
import pytest
from helpers.running import run_catching
from jobs_helpers import fast_options, pending_count, wait_until, wait_until_async

from respire_actors import RestartLimits
from respire_actors.actors.restarts import is_transient, root_cause
from respire_actors.codecs import StrCodec
from respire_actors.errors import (
    ClusterReconfiguring,
    ConfigurationError,
    PermissionDenied,
    RedisUnavailable,
    ServerError,
    ServerLoading,
    ValidationError,
)
from respire_actors.jobs import ACK, Job, JobQueue, Outcome, Worker
from respire_actors.jobs.worker import Registration
from respire_actors.redis.client import RedisClient
from respire_actors.streams import StreamWorker
from supervisors import Backoff, ChildSpec, RestartIntensityExceeded, current_child

pytestmark = pytest.mark.anyio

LIMITS = RestartLimits(
    actor_max_restarts=2,
    actor_period=5.0,
    actor_backoff=Backoff(initial=0.01, maximum=0.05),
    outage_backoff=Backoff(initial=0.1, maximum=0.3),
    root_max_restarts=0,  # a single escalation stops the worker
    root_period=60.0,
)


class Breakage:
    error: BaseException | None = None
    start_error: BaseException | None = None


async def fragile(breakage: Breakage, *, task_status: anyio.abc.TaskStatus[None]) -> None:
    """An actor that fails with ``breakage.error`` while it is set (and fails to start with
    ``breakage.start_error``)."""
    ctx = current_child()
    if breakage.start_error is not None:
        await anyio.sleep(0.01)
        raise breakage.start_error
    task_status.started()
    with ctx.stop_scope():
        while breakage.error is None:  # noqa: ASYNC110 - a test actor polling a flag
            await anyio.sleep(0.01)
    if not ctx.stop_requested and breakage.error is not None:
        raise breakage.error


class FragileWorker(Worker):
    """A worker whose ``fragile_queue`` runs :func:`fragile` instead of its keeper."""

    def __init__(
        self, fragile_queue: str, breakage: Breakage, limits: RestartLimits = LIMITS
    ) -> None:
        super().__init__(restart_limits=limits)
        self.fragile_queue = fragile_queue
        self.breakage = breakage

    def _keeper(self, client: RedisClient, reg: Registration) -> ChildSpec:
        if reg.queue == self.fragile_queue:
            return ChildSpec("fragile", fragile, self.breakage, shutdown=1)
        return super()._keeper(client, reg)


def worker_for(
    a: str, b: str, runs: Counter[str], breakage: Breakage, limits: RestartLimits = LIMITS
) -> FragileWorker:
    async def handler(job: Job[str]) -> Outcome:
        runs[f"{job.queue}:{job.id}"] += 1
        return ACK

    worker = FragileWorker(a, breakage, limits)
    for name in (a, b):
        worker.register(name, handler, StrCodec(), fast_options())
    return worker


async def test_an_outage_of_one_queue_never_stops_the_others(
    client: RedisClient, unique_name: str
) -> None:
    a_name, b_name = f"{unique_name}-a", f"{unique_name}-b"
    a, b = JobQueue(client, a_name, StrCodec()), JobQueue(client, b_name, StrCodec())
    runs: Counter[str] = Counter()
    breakage = Breakage()
    worker = worker_for(a_name, b_name, runs, breakage)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        await a.enqueue("a0", "x")
        await wait_until(lambda: runs[f"{a_name}:a0"] == 1)
        breakage.error = RedisUnavailable("simulated outage")
        stats = worker.statistics(a_name)
        await wait_until(lambda: stats.outages >= 3)  # gave up three times: no escalation
        for i in range(5):
            await b.enqueue(f"b{i}", "x")
        await wait_until(lambda: all(runs[f"{b_name}:b{i}"] == 1 for i in range(5)))
        await a.enqueue("a1", "x")  # waits for the registration to come back
        breakage.error = None
        await wait_until(lambda: runs[f"{a_name}:a1"] == 1)
        await wait_until_async(lambda: _drained(client, a))
        snapshot = worker.snapshot()
        await worker.stop()
    assert snapshot is not None and snapshot.restarts_in_period == 0
    assert {k: v for k, v in runs.items() if v != 1} == {}


async def _drained(client: RedisClient, queue: JobQueue[str]) -> bool:
    return await pending_count(client, queue.keys) == 0


async def test_a_permanent_error_still_stops_the_worker(
    client: RedisClient, unique_name: str
) -> None:
    runs: Counter[str] = Counter()
    breakage = Breakage()
    worker = worker_for(f"{unique_name}-a", f"{unique_name}-b", runs, breakage)
    failures: list[BaseException] = []

    run_worker = run_catching(worker, client, RestartIntensityExceeded, failures)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(run_worker)
            breakage.error = ConfigurationError("not an outage")
    (failure,) = failures  # the worker stopped, queue B with it
    assert isinstance(root_cause(failure), ConfigurationError)
    assert worker.statistics(f"{unique_name}-a").outages == 0


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (RedisUnavailable("down"), True),
        (ClusterReconfiguring("slot moving"), True),
        (ServerLoading("LOADING loading"), True),
        (ServerError("CLUSTERDOWN The cluster is down"), True),
        (ServerError("TRYAGAIN Multiple keys request during rehashing of slot"), True),
        (ServerError("WRONGTYPE Operation against a key holding the wrong kind of value"), False),
        (PermissionDenied("NOPERM no", command="xadd"), False),
        (ConfigurationError("bad"), False),
        (RuntimeError("a bug"), False),
    ],
)
def test_which_errors_are_outages(error: BaseException, transient: bool) -> None:
    wrapped = RestartIntensityExceeded(
        supervisor="queue:x", child="reader", max_restarts=2, period=5
    )
    wrapped.__cause__ = error
    assert is_transient(wrapped) is transient


@pytest.mark.parametrize(
    "changes",
    [
        {"actor_max_restarts": -1},
        {"root_max_restarts": True},
        {"actor_period": 0},
        {"root_period": float("inf")},
        {"outage_backoff": 5},
    ],
)
def test_restart_limits_are_checked(changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        RestartLimits(**changes)
    with pytest.raises(ValidationError):
        Worker(restart_limits=object())  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        StreamWorker(restart_limits=object())  # type: ignore[arg-type]


async def test_jobs_in_flight_when_a_registration_gives_up_run_once(
    client: RedisClient, unique_name: str
) -> None:
    """The registration gives up while its runners are busy and deliveries wait in its
    mailbox: after the outage each job runs exactly once (nothing buffered is run a second
    time by the new run's replay)."""
    a_name, b_name = f"{unique_name}-a", f"{unique_name}-b"
    a = JobQueue(client, a_name, StrCodec())
    runs: Counter[str] = Counter()
    breakage = Breakage()

    async def handler(job: Job[str]) -> Outcome:
        runs[job.id] += 1
        await anyio.sleep(0.05)
        return ACK

    worker = FragileWorker(a_name, breakage)
    for name in (a_name, b_name):
        worker.register(name, handler, StrCodec(), fast_options(read_batch=8))
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        await a.enqueue_many([(f"j{i}", "x") for i in range(40)])
        await wait_until(lambda: len(runs) >= 6)
        breakage.error = RedisUnavailable("simulated outage")
        stats = worker.statistics(a_name)
        await wait_until(lambda: stats.outages >= 1)
        breakage.error = None
        await wait_until(lambda: len(runs) == 40, timeout=20)
        await wait_until_async(lambda: _drained(client, a))
        await worker.stop()
    assert {k: v for k, v in runs.items() if v != 1} == {}


async def test_an_outage_while_the_root_restarts_a_queue_is_waited_out(
    client: RedisClient, unique_name: str
) -> None:
    """Queue A escalates one fault to the root (allowed: one root restart), and while the root
    restarts it, A's server is down for a second: its start-up failures are an outage like
    any other, not more faults (each used to count against the root, which stopped the whole
    worker with RestartIntensityExceeded, queue B with it)."""
    limits = RestartLimits(
        actor_max_restarts=0,
        actor_backoff=Backoff(initial=0.01, maximum=0.05),
        outage_backoff=Backoff(initial=0.1, maximum=0.3),
        root_max_restarts=1,
        root_period=60.0,
    )
    a_name, b_name = f"{unique_name}-a", f"{unique_name}-b"
    a, b = JobQueue(client, a_name, StrCodec()), JobQueue(client, b_name, StrCodec())
    runs: Counter[str] = Counter()
    breakage = Breakage()
    worker = worker_for(a_name, b_name, runs, breakage, limits)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run, client)
        breakage.start_error = RedisUnavailable("queue A's server is down (simulated)")
        breakage.error = ConfigurationError("a one-off fault")
        stats = worker.statistics(a_name)
        await wait_until(lambda: stats.outages >= 2)  # restarted by the root, then outages
        for i in range(3):
            await b.enqueue(f"b{i}", "x")
        await wait_until(lambda: all(runs[f"{b_name}:b{i}"] == 1 for i in range(3)))
        breakage.start_error = breakage.error = None
        await a.enqueue("a0", "x")
        await wait_until(lambda: runs[f"{a_name}:a0"] == 1, timeout=15)
        snapshot = worker.snapshot()
        await worker.stop()
    assert snapshot is not None and snapshot.restarts_in_period == 1  # the one fault
