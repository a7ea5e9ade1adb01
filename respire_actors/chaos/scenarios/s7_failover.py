"""Scenario 7: a replica promoted with enqueues and completions in flight.

Four cases, each on servers of its own, with worker processes and an outbox producer running:

* ``replicaof-no-one:graceful`` - a primary/replica pair behind a switchable proxy (the stand-in
  for a virtual IP or a DNS name): the primary's writes are paused (``CLIENT PAUSE WRITE``), the
  replica catches up, ``REPLICAOF NO ONE``, the proxy moves, the old primary is killed. Nothing
  may be lost.
* ``replicaof-no-one:sigkill-lagging`` - the replication link is partitioned (its proxy drops
  the stream) while writes go on, then the primary is SIGKILLed and the replica promoted: the
  writes after the partition are lost. The loss must stay inside the measured lag (bytes of
  replication stream the replica never got, and the window in ms), and the outbox's re-send of
  that window must complete every lost job without completing any job twice.
* ``cluster-failover:graceful`` - ``CLUSTER FAILOVER`` on the queue's master's replica (the master
  pauses its clients until the replica has caught up): nothing lost; the clients follow MOVED.
* ``cluster-failover:force-after-sigkill`` - the queue's master is SIGKILLed, its replica takes
  over (``CLUSTER FAILOVER FORCE``, ``TAKEOVER`` if no majority answers); loss bounded by the
  lag measured at the kill.

Classified per job: ``lost`` (accepted, absent from the new primary), ``reexecuted`` (a second
handler run - allowed: a completion or a delivery lost with the old primary, or a lost enqueue
re-sent by the outbox), a second completed event on the new primary (a violation).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.to_thread

from ...codecs import JsonValueCodec
from ...jobs import JobQueue
from ...keys import JobQueueKeys
from ...redis.client import connect
from ..cluster import (
    failover,
    key_slot,
    replication,
    replication_lag,
    slot_ranges,
    wait_replica_synced,
)
from ..ledger import Ledger, read_ledger
from ..model import ChaosContext, Verdict
from ..outbox import OutboxProducer, accepted_between, pending_count, resend, settle
from ..processes import WorkerProcess, start_worker
from ..proxy import SwitchProxy
from ..reconcile import reconcile
from ..servers import ServerProcess, spawn_replica, spawn_server, start_cluster
from . import register

SPEC = {"sleep": 0.02}
Fault = Callable[[], Awaitable[dict[str, Any]]]


def _sizes(ctx: ChaosContext) -> tuple[int, int, float]:
    """(jobs before the fault, jobs after it, seconds between enqueues)."""
    return (500, 500, 0.005) if ctx.full else (60, 60, 0.005)


async def _thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await anyio.to_thread.run_sync(fn, *args)


def _start_workers(
    ctx: ChaosContext, url: str, queue: str, effects: Path, n: int = 2
) -> list[WorkerProcess]:
    extra = ("--consumers", "4", "--visibility-ms", "1500", "--recovery-ms", "200")
    workers = [
        start_worker(
            url, queue, effects, ctx.path(queue, "w"), *extra, backend=ctx.backend, wait=False
        )
        for _ in range(n)
    ]
    for worker in workers:
        worker.wait_ready()
    return workers


def _stop_all(workers: list[WorkerProcess]) -> list[int]:
    for worker in workers:
        worker.signal(signal.SIGTERM)  # all stop at once (a second SIGTERM would kill)
    codes = []
    for worker in workers:
        code = worker.wait_exit(15.0)
        if code is None:
            worker.kill()
            code = worker.process.returncode
        codes.append(code)
    return codes


def _kill_all(workers: list[WorkerProcess]) -> None:
    for worker in workers:
        if worker.alive():
            worker.kill()


def _sync_point(primary: ServerProcess, replica: ServerProcess, timeout: float = 10.0) -> float:
    """A wall-clock time before which every write is on the replica: sample the primary's
    offset, wait until the replica has processed that much."""
    at = time.time()
    offset = int(replication(primary)["master_repl_offset"])
    deadline = time.monotonic() + timeout
    while int(replication(replica).get("slave_repl_offset", 0)) < offset:
        if time.monotonic() > deadline:
            raise TimeoutError("the replica did not catch up before the fault")
        time.sleep(0.005)
    return at


async def _exercise(
    ctx: ChaosContext, case: str, url: str, fault: Fault, *, graceful: bool, queue_name: str = ""
) -> Verdict:
    """Workers and an outbox producer on ``url``; ``fault`` runs once half the jobs are
    accepted and returns its evidence (``sync_at``: writes before it are on the new primary;
    ``killed_at``; ``lag_bytes``...). Then settle, re-send the loss window, reconcile."""
    started = time.monotonic()
    name = queue_name or ctx.name(case.replace(":", "-"))
    effects = ctx.path(name, "effects.jsonl")
    ledger_path = ctx.path(name, "producer.jsonl")
    before, after, interval = _sizes(ctx)
    workers = await _thread(_start_workers, ctx, url, name, effects, 2 if ctx.full else 1)
    exits: list[int] = []
    try:
        async with connect(url, command_timeout=2.0) as client:
            queue = JobQueue(client, name, JsonValueCodec())
            halfway = anyio.Event()
            evidence: dict[str, Any] = {}
            with Ledger(ledger_path) as ledger:
                producer = OutboxProducer(queue, ledger)
                jobs = [(f"j{i}", SPEC) for i in range(before + after)]
                async with anyio.create_task_group() as tg:
                    tg.start_soon(
                        lambda: producer.run(jobs, interval=interval, milestone=(before, halfway))
                    )
                    await halfway.wait()
                    ctx.progress(f"failover: {case}: injecting the fault")
                    evidence = await fault()
            accepted = list(producer.accepted)
            outcomes = await settle(queue, accepted, effects, timeout=30.0)
            missing = [j for j in accepted if not (outcomes.completed[j] or outcomes.dead[j])]
            pending_left = await pending_count(queue)
            # the loss window: from the last moment the replica was known to have every write
            # to the promotion (the outbox re-sends what it accepted inside it)
            window = accepted_between(ledger_path, evidence["sync_at"], evidence["switched_at"])
            resent = await resend(queue, window, SPEC)
            outcomes = await settle(queue, accepted, effects, timeout=30.0)
            pending_after = await pending_count(queue)
            moved = client.statistics().moved
        exits = await _thread(_stop_all, workers)
    finally:
        await _thread(_kill_all, workers)
    violations = []
    outside = [j for j in missing if j not in set(window)]
    if outside:
        violations.append(
            f"{len(outside)} lost jobs were accepted before the sync point: {outside[:5]}"
        )
    if graceful and missing:
        violations.append(f"a graceful failover lost {len(missing)} jobs: {missing[:5]}")
    if resent != len(missing):
        violations.append(f"the outbox re-enqueued {resent} jobs, {len(missing)} were lost")
    if pending_after:
        violations.append(f"{pending_after} deliveries still pending at the end")
    if any(code != 0 for code in exits):
        violations.append(f"worker exit codes {exits}")
    if not evidence.get("switched_at"):
        violations.append("the fault was not injected")
    reexecuted = _classify_reexecutions(effects, evidence.get("switched_at", 0.0), set(missing))
    verdict = reconcile(
        "failover", case, accepted, outcomes, time.monotonic() - started,
        violations=violations,
        details={
            **evidence,
            "lost_at_failover": len(missing),
            "lost_window_jobs": len(window),
            "outbox_reenqueued": resent,
            "pending_before_outbox": pending_left,
            "producer_retries": producer.retries,
            "producer_moved": moved,
            "producer_errors": producer.errors,
            **reexecuted,
            "worker_exit_codes": exits,
        },
    )  # fmt: skip
    # ``lost`` reports what the failover lost (the outbox then completed it: reconcile's own
    # count after the re-send must be 0, or the case fails)
    return replace(verdict, lost=len(missing), passed=verdict.passed and verdict.lost == 0)


def _classify_reexecutions(effects: Path, switched_at: float, lost: set[str]) -> dict[str, int]:
    """Jobs run more than once: across the failover because their enqueue was lost and the
    outbox re-sent it, across it for another reason (a completion or a delivery lost with the
    old primary), or both runs on one side (a lease broken by the switch's reconnects)."""
    runs: dict[str, list[float]] = {}
    for line in read_ledger(effects):
        if line.get("kind") == "effect":
            runs.setdefault(str(line["job"]), []).append(float(line.get("at", 0)))
    counts = {
        "reexecuted_lost_enqueue": 0,
        "reexecuted_across_failover": 0,
        "reexecuted_same_side": 0,
    }
    for job, times in runs.items():
        if len(times) < 2:
            continue
        across = min(times) < switched_at <= max(times)
        if job in lost:
            counts["reexecuted_lost_enqueue"] += 1
        elif across:
            counts["reexecuted_across_failover"] += 1
        else:
            counts["reexecuted_same_side"] += 1
    return counts


async def _single_server(ctx: ChaosContext, graceful: bool) -> Verdict:
    case = "replicaof-no-one:" + ("graceful" if graceful else "sigkill-lagging")
    base = ctx.path(ctx.name(case.replace(":", "-")), "servers")
    primary: ServerProcess = await _thread(
        lambda: spawn_server(base / "primary", binary=ctx.server_binary)
    )
    link = SwitchProxy(primary.port)  # the replication link, partitioned in the sigkill case
    clients = SwitchProxy(primary.port)  # what the applications connect to
    replica: ServerProcess | None = None
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(link.serve)
            await tg.start(clients.serve)
            replica = await _thread(
                lambda: spawn_replica(base / "replica", _via(primary, link.port))
            )
            assert replica is not None
            promoted = replica

            async def graceful_switch() -> dict[str, Any]:
                def steps() -> dict[str, Any]:
                    primary.execute("CLIENT", "PAUSE", 10000, "WRITE")
                    sync_at = _sync_point(primary, promoted)
                    lag = replication_lag(primary, promoted)
                    promoted.execute("REPLICAOF", "NO", "ONE")
                    return {"sync_at": sync_at, "lag_bytes": lag}

                evidence: dict[str, Any] = await _thread(steps)
                evidence["switched_at"] = time.time()
                evidence["connections_moved"] = clients.switch(promoted.port)
                await _thread(primary.kill)
                evidence["killed_at"] = time.time()
                return evidence

            async def sigkill_lagging() -> dict[str, Any]:
                sync_at = await _thread(_sync_point, primary, promoted)
                link.partition()
                partitioned_at = time.time()
                await anyio.sleep(0.4)  # writes the replica never receives
                offset = int(replication(primary)["master_repl_offset"])
                await _thread(primary.kill)
                killed_at = time.time()
                received = int(replication(promoted).get("slave_repl_offset", 0))
                promoted.execute("REPLICAOF", "NO", "ONE")
                switched_at = time.time()
                moved = clients.switch(promoted.port)
                return {
                    "sync_at": sync_at,
                    "killed_at": killed_at,
                    "switched_at": switched_at,
                    "lag_bytes": offset - received,
                    "lag_window_ms": round((killed_at - partitioned_at) * 1000),
                    "connections_moved": moved,
                    "stream_dropped_bytes": link.dropped,
                }

            fault = graceful_switch if graceful else sigkill_lagging
            try:
                verdict = await _exercise(ctx, case, clients.url, fault, graceful=graceful)
            finally:
                tg.cancel_scope.cancel()
        return verdict
    finally:
        primary.stop()
        if replica is not None:
            replica.stop()


def _via(primary: ServerProcess, port: int) -> ServerProcess:
    """``primary`` as seen through a proxy on ``port`` (for ``--replicaof``)."""
    return replace(primary, port=port)


def _queue_in_range(ctx: ChaosContext, label: str, first: int, last: int) -> str:
    """A queue name for ``label`` whose slot lies in [first, last]."""
    for i in range(100000):
        name = ctx.name(f"{label}-{i}")
        if first <= key_slot(JobQueueKeys(name).ready) <= last:
            return name
    raise RuntimeError("no queue name found for the slot range")


async def _cluster(ctx: ChaosContext) -> list[Verdict]:
    """Both cluster cases on one cluster: a graceful failover swaps the queue's master and its
    replica; then the new master is SIGKILLed and the old one, its replica now, takes over."""
    first, last = slot_ranges(3)[0]
    graceful_queue = _queue_in_range(ctx, "cluster-failover-graceful", first, last)
    killed_queue = _queue_in_range(ctx, "cluster-failover-force-after-sigkill", first, last)
    cluster = await _thread(
        lambda: start_cluster(
            ctx.path(graceful_queue, "cluster", "x").parent,
            3,
            binary=ctx.server_binary,
            replicas_of=[0],
        )
    )
    master, (replica,) = cluster.masters[0], cluster.replicas
    try:

        async def graceful_failover() -> dict[str, Any]:
            sync_at = time.time()  # a graceful failover waits for the replica: nothing after
            took = await _thread(lambda: failover(replica, "graceful", cluster=cluster.nodes))
            return {"sync_at": sync_at, "switched_at": time.time(), "lag_bytes": 0,
                    "promotion_ms": round(took * 1000)}  # fmt: skip

        graceful = await _exercise(
            ctx, "cluster-failover:graceful", cluster.url, graceful_failover, graceful=True,
            queue_name=graceful_queue,
        )  # fmt: skip
        # the roles are swapped now: the old master follows the promoted replica
        primary, standby = replica, master
        await _thread(wait_replica_synced, standby)

        async def force_after_sigkill() -> dict[str, Any]:
            sync_at = await _thread(_sync_point, primary, standby)
            offset = int(replication(primary)["master_repl_offset"])  # a lower bound
            await _thread(primary.kill)
            killed_at = time.time()
            received = int(replication(standby).get("slave_repl_offset", 0))
            mode = "FORCE"
            try:
                took = await _thread(
                    lambda: failover(standby, "FORCE", cluster=cluster.live(), timeout=8.0)
                )
            except Exception:
                mode = "TAKEOVER"
                took = await _thread(lambda: failover(standby, "TAKEOVER", cluster=cluster.live()))
            return {
                "sync_at": sync_at,
                "killed_at": killed_at,
                "switched_at": time.time(),
                "lag_bytes": max(0, offset - received),
                "lag_window_ms": round((killed_at - sync_at) * 1000),
                "failover_mode": mode,
                "promotion_ms": round(took * 1000),
            }

        killed = await _exercise(
            ctx, "cluster-failover:force-after-sigkill", cluster.url, force_after_sigkill,
            graceful=False, queue_name=killed_queue,
        )  # fmt: skip
        return [graceful, killed]
    finally:
        await _thread(cluster.stop)


@register
class Failover:
    number: ClassVar[int] = 7
    name: ClassVar[str] = "failover"
    title: ClassVar[str] = "a replica promoted with enqueues and completions in flight"
    ci: ClassVar[bool] = True
    own_servers: ClassVar[bool] = True

    async def run(self, ctx: ChaosContext) -> list[Verdict]:
        return [
            await _single_server(ctx, graceful=True),
            await _single_server(ctx, graceful=False),
            *await _cluster(ctx),
        ]
