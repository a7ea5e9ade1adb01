"""Scenario 8: the queue's slot migrated under running workers; credentials rotated under them.

* ``reshard:migrate-slot`` - on a 3-master cluster of its own, the queue's slot is moved to
  another master the way an operator does (SETSLOT IMPORTING/MIGRATING, MIGRATE of every key,
  SETSLOT NODE), its streams last, so the slot stays half-migrated for the hold (CI: a few
  seconds; ``--full``: 30 s) while workers block in reads and an outbox producer enqueues
  (refused with ``ClusterReconfiguring`` meanwhile, and repeated). During the hold one worker is
  SIGKILLed (its leases must be claimed by another), another is stopped gracefully and a fresh
  one started. Verdict: 0 lost, no second completion, processing resumes by itself.
* ``credentials:password-rotation`` - ACL users for the workers (``--password-file``, read by a
  credential provider on every connection) and the producer rotate their passwords twice while
  they run: once the documented way (add the new password, switch, ``CLIENT KILL USER``, remove
  the old one), once server first (the old password stops working before the files change, so
  reconnects are refused meanwhile). Verdict: 0 lost, no second completion, nothing pending.

Certificate rotation is not covered: the embedded server has no TLS (docs/failure-contract/
8-reshard.md says how to rotate certificates and why the same reconnect path applies).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.to_thread

from ...acl import acl_rules
from ...codecs import JsonValueCodec
from ...jobs import JobQueue
from ...keys import JobQueueKeys
from ...redis.client import connect
from ..cluster import key_slot, migrate_slot, owner_of
from ..ledger import Ledger, read_ledger
from ..model import ChaosContext, Verdict
from ..outbox import OutboxProducer, pending_count, settle
from ..processes import WorkerProcess, start_worker
from ..reconcile import reconcile
from ..servers import spawn_server, start_cluster
from . import register

SPEC = {"sleep": 0.05}
WORKER_ARGS = ("--consumers", "4", "--visibility-ms", "1500", "--recovery-ms", "200")


async def _thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await anyio.to_thread.run_sync(fn, *args)


def _stop(worker: WorkerProcess) -> int:
    code = worker.stop()
    return code


def _kill_all(workers: list[WorkerProcess]) -> None:
    for worker in workers:
        if worker.alive():
            worker.kill()


async def _reshard(ctx: ChaosContext) -> Verdict:
    case = "reshard:migrate-slot"
    started = time.monotonic()
    name = ctx.name("reshard")
    effects, ledger_path = ctx.path(name, "effects.jsonl"), ctx.path(name, "producer.jsonl")
    hold = 30.0 if ctx.full else 3.0
    keys = JobQueueKeys(name)
    slot = key_slot(keys.ready)
    cluster = await _thread(
        lambda: start_cluster(ctx.path(name, "cluster", "x").parent, 3, binary=ctx.server_binary)
    )
    workers: list[WorkerProcess] = []
    evidence: dict[str, Any] = {"hold_s": hold}

    def spawn_worker(wait: bool = True) -> WorkerProcess:
        worker = start_worker(
            cluster.url, name, effects, ctx.path(name, "w"), *WORKER_ARGS,
            backend=ctx.backend, wait=wait,
        )  # fmt: skip
        workers.append(worker)
        return worker

    try:
        first, second = spawn_worker(wait=False), spawn_worker(wait=False)
        await _thread(first.wait_ready)
        await _thread(second.wait_ready)
        source = owner_of(cluster.masters, slot)
        target = next(n for n in cluster.masters if n.port != source.port)
        async with connect(cluster.url, cluster_retry_timeout=0.5) as client:
            queue = JobQueue(client, name, JsonValueCodec())
            done = anyio.Event()
            with Ledger(ledger_path) as ledger:
                producer = OutboxProducer(queue, ledger, retry_for=hold + 30)
                for i in range(100):  # history in the slot before the move
                    await producer.send(f"before-{i}", SPEC)

                async def migrate() -> None:
                    evidence["keys_moved"] = await _thread(
                        lambda: migrate_slot(
                            cluster.masters, slot, target, hold=hold,
                            last=[keys.ready, keys.events],
                        )
                    )  # fmt: skip
                    evidence["moved_at"] = time.time()

                async def faults() -> None:
                    await anyio.sleep(hold * 0.25)
                    await _thread(first.kill)
                    evidence["killed_at"] = time.time()
                    evidence["killed_worker_exit"] = first.process.returncode
                    await anyio.sleep(hold * 0.25)
                    fresh = spawn_worker(wait=False)  # started mid-move: it waits for it
                    evidence["graceful_stop_requested_at"] = time.time()
                    evidence["graceful_exit_mid_move"] = await _thread(_stop, second)
                    evidence["graceful_stop_ms"] = round(
                        (time.time() - evidence["graceful_stop_requested_at"]) * 1000
                    )
                    await _thread(lambda: fresh.wait_ready(timeout=hold + 30))
                    evidence["fresh_worker_ready_at"] = time.time()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(_produce_until, producer, done, "during-")
                    await anyio.sleep(0.5)
                    evidence["move_started_at"] = time.time()
                    tg.start_soon(faults)
                    await migrate()
                    await anyio.sleep(1.0)  # some enqueues after the move
                    done.set()
            accepted = list(producer.accepted)
            outcomes = await settle(queue, accepted, effects, timeout=30.0 + hold)
            pending_left = await pending_count(queue)
            stats = client.statistics()
        still_running = [w for w in workers if w.alive()]
        exits = [await _thread(_stop, w) for w in still_running]
    finally:
        await _thread(_kill_all, workers)
        await _thread(cluster.stop)
    violations = []
    if evidence.get("killed_worker_exit") != -signal.SIGKILL:
        violations.append(f"the worker was not SIGKILLed: {evidence.get('killed_worker_exit')}")
    if evidence.get("graceful_exit_mid_move") != 0:
        violations.append(f"graceful stop mid-move exited {evidence.get('graceful_exit_mid_move')}")
    if any(code != 0 for code in exits):
        violations.append(f"worker exit codes {exits}")
    if pending_left:
        violations.append(f"{pending_left} deliveries still pending")
    if not evidence.get("graceful_stop_requested_at", 1e18) < evidence.get("moved_at", 0):
        violations.append("the graceful stop did not happen during the move")
    if not evidence.get("keys_moved"):
        violations.append("no key was migrated")
    rerun_at = _reexecution_times(effects, evidence.get("killed_at", 0.0))
    moved_at = evidence.get("moved_at", 0.0)
    recovered_in_move = sum(1 for at in rerun_at if at <= moved_at)
    return reconcile(
        "reshard", case, accepted, outcomes, time.monotonic() - started,
        violations=violations,
        details={
            **evidence,
            "slot": slot,
            "producer_refused_during_move": producer.errors,
            "producer_retries": producer.retries,
            "client_cluster_retries": stats.cluster_retries,
            "client_moved": stats.moved,
            "client_asked": stats.asked,
            "reexecuted_in_move": recovered_in_move,
            "reexecuted_after_move": len(rerun_at) - recovered_in_move,
            "first_reexecution_after_move_ms": (
                round((min(rerun_at) - moved_at) * 1000) if rerun_at else None
            ),
            "worker_exit_codes": exits,
        },
    )  # fmt: skip


def _reexecution_times(effects: Path, since: float) -> list[float]:
    """When second-or-later handler runs (a claimed lease re-run) happened after ``since``."""
    seen: set[str] = set()
    times = []
    for line in read_ledger(effects):
        if line.get("kind") != "effect":
            continue
        job, at = str(line["job"]), float(line.get("at", 0))
        if job in seen and at >= since:
            times.append(at)
        seen.add(job)
    return times


async def _rotation(ctx: ChaosContext) -> Verdict:
    case = "credentials:password-rotation"
    started = time.monotonic()
    name = ctx.name("rotation")
    effects, ledger_path = ctx.path(name, "effects.jsonl"), ctx.path(name, "producer.jsonl")
    password_file = ctx.path(name, "worker.password")
    server = await _thread(lambda: spawn_server(ctx.path(name, "server"), binary=ctx.server_binary))
    workers: list[WorkerProcess] = []
    evidence: dict[str, Any] = {}
    producer_password = {"value": "producer-0"}
    try:
        server.execute("ACL", "SETUSER", "chaos-worker", "reset", "on", ">worker-0",
                       *acl_rules("worker", (name,)))  # fmt: skip
        server.execute("ACL", "SETUSER", "chaos-producer", "reset", "on", ">producer-0",
                       *acl_rules("producer", (name,)))  # fmt: skip
        password_file.write_text("worker-0")
        # leases outlive the refused window: a completion delayed by it is not re-run
        extra = ("--consumers", "4", "--visibility-ms", "5000", "--recovery-ms", "200",
                 "--username", "chaos-worker", "--password-file", str(password_file))  # fmt: skip
        for _ in range(2):
            workers.append(
                start_worker(
                    server.url,
                    name,
                    effects,
                    ctx.path(name, "w"),
                    *extra,
                    backend=ctx.backend,
                    wait=False,
                )
            )
        for worker in workers:
            await _thread(worker.wait_ready)

        def producer_credentials() -> tuple[str, str]:
            return "chaos-producer", producer_password["value"]

        per_phase = 200 if ctx.full else 60
        async with (
            connect(server.url) as admin,
            connect(server.url, credential_provider=producer_credentials) as client,
        ):
            queue = JobQueue(client, name, JsonValueCodec())
            with Ledger(ledger_path) as ledger:
                producer = OutboxProducer(queue, ledger)
                done = anyio.Event()

                async def kill_connections() -> int:
                    killed = 0
                    for user in ("chaos-worker", "chaos-producer"):
                        killed += int(await admin.execute("CLIENT", "KILL", "USER", user))
                    return killed

                async with anyio.create_task_group() as tg:
                    tg.start_soon(_produce_until, producer, done, "j")
                    await _wait_accepted(producer, per_phase)
                    # 1. the documented way: both passwords valid while the clients move
                    await admin.execute("ACL", "SETUSER", "chaos-worker", ">worker-1")
                    await admin.execute("ACL", "SETUSER", "chaos-producer", ">producer-1")
                    password_file.write_text("worker-1")
                    producer_password["value"] = "producer-1"
                    evidence["killed_overlapping"] = await kill_connections()
                    await admin.execute("ACL", "SETUSER", "chaos-worker", "<worker-0")
                    await admin.execute("ACL", "SETUSER", "chaos-producer", "<producer-0")
                    evidence["killed_after_removal"] = await kill_connections()
                    await _wait_accepted(producer, 2 * per_phase)
                    # 2. server first: reconnects are refused until the secrets catch up
                    await admin.execute("ACL", "LOG", "RESET")
                    await admin.execute("ACL", "SETUSER", "chaos-worker", "resetpass", ">worker-2")
                    await admin.execute(
                        "ACL", "SETUSER", "chaos-producer", "resetpass", ">producer-2"
                    )
                    evidence["killed_server_first"] = await kill_connections()
                    await anyio.sleep(1.0)
                    log = await admin.execute("ACL", "LOG")
                    evidence["auth_refusals"] = sum(1 for entry in log if b"auth" in _flat(entry))
                    password_file.write_text("worker-2")
                    producer_password["value"] = "producer-2"
                    await _wait_accepted(producer, 3 * per_phase)
                    done.set()
            accepted = list(producer.accepted)
            observed = JobQueue(admin, name, JsonValueCodec())  # the producer may not read
            outcomes = await settle(observed, accepted, effects, timeout=30.0)
            pending_left = await pending_count(observed)
            info = await admin.execute("ACL", "GETUSER", "chaos-worker")
            evidence["worker_passwords_at_end"] = len(_field(info, b"passwords"))
        exits = []
        for worker in workers:
            exits.append(await _thread(_stop, worker))
    finally:
        await _thread(_kill_all, workers)
        await _thread(server.stop)
    violations = []
    if any(code != 0 for code in exits):
        violations.append(f"worker exit codes {exits}")
    if pending_left:
        violations.append(f"{pending_left} deliveries still pending")
    if not evidence.get("killed_overlapping") or not evidence.get("killed_server_first"):
        violations.append("no connection was killed: the rotation was not felt")
    if not evidence.get("auth_refusals"):
        violations.append("no reconnect was refused in the server-first rotation")
    return reconcile(
        "reshard", case, accepted, outcomes, time.monotonic() - started,
        violations=violations,
        details={**evidence, "producer_retries": producer.retries,
                 "producer_errors": producer.errors, "worker_exit_codes": exits},
    )  # fmt: skip


async def _produce_until(producer: OutboxProducer, done: anyio.Event, prefix: str) -> None:
    """Send job ``<prefix>0``, ``<prefix>1``, ... every 10 ms until ``done`` is set."""
    i = 0
    while not done.is_set():
        await producer.send(f"{prefix}{i}", SPEC)
        i += 1
        await anyio.sleep(0.01)


async def _wait_accepted(producer: OutboxProducer, count: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while len(producer.accepted) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(producer.accepted)} of {count} jobs accepted in {timeout} s")
        await anyio.sleep(0.05)


def _flat(entry: Any) -> bytes:
    if isinstance(entry, dict):
        return b" ".join(_flat(k) + b" " + _flat(v) for k, v in entry.items())
    if isinstance(entry, list | tuple):
        return b" ".join(_flat(x) for x in entry)
    return entry if isinstance(entry, bytes) else str(entry).encode()


def _field(reply: Any, key: bytes) -> Any:
    if isinstance(reply, dict):
        return reply.get(key, [])
    pairs = dict(zip(reply[0::2], reply[1::2], strict=True))
    return pairs.get(key, [])


@register
class Reshard:
    number: ClassVar[int] = 8
    name: ClassVar[str] = "reshard"
    title: ClassVar[str] = "the queue's slot migrated and credentials rotated under workers"
    ci: ClassVar[bool] = True
    own_servers: ClassVar[bool] = True

    async def run(self, ctx: ChaosContext) -> list[Verdict]:
        return [await _reshard(ctx), await _rotation(ctx)]
