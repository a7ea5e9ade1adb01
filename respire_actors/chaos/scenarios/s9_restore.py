"""Scenario 9: restore (seed 004: restart a server from its persistence after a crash and
reconcile every accepted intent against what came back).

A throwaway server runs with one persistence mode; a producer keeps enqueueing (an fsynced
ledger line with the wall-clock time of every accepted job) and a worker process completes jobs
while the server is SIGKILLed. The server is started again in the same directory, the worker
reconnects by itself, and once it has drained what was restored the scenario reconciles:

* **missing** jobs: accepted, but neither their entry nor their deduplication record (written
  by the same script) came back;
* the **loss window**: from the first missing acceptance to the kill, in ms. It must stay within
  the persistence mode's bound: ``appendfsync everysec`` loses at most about a second (2 s is
  the documented worst case) on a machine crash; on a process kill, as here, normally nothing
  (the AOF is written to the kernel before each reply), but while a background fsync is slow
  the server postpones that write for up to 2 s and replies anyway, so 2 s is the bound
  checked here too; an RDB restore loses what came after the last completed snapshot
  (the scenario takes one each second with BGSAVE, as a ``save 1 1`` policy would, and knows
  when each began);
* no job completed twice in the restored state (re-executions of jobs whose completion was not
  persisted are the at-least-once contract, and are counted as duplicates);
* then the application republishes the missing ids from its outbox (same job ids: their
  deduplication records were lost with them, so nothing blocks it) and they complete.
"""

from __future__ import annotations

import signal
import time
from typing import Any, ClassVar

import anyio

from ...codecs import JsonValueCodec
from ...errors import RespireError
from ...jobs import JobQueue
from ...redis.client import RedisClient, connect
from ..ledger import Ledger, read_ledger
from ..model import ChaosContext, Verdict
from ..processes import start_worker
from ..reconcile import read_outcomes, reconcile, wait_for_outcomes
from ..servers import spawn_server
from . import register

NAME = "restore"

MODES: dict[str, tuple[str, ...]] = {
    "aof-everysec": ("--appendonly", "yes", "--appendfsync", "everysec"),
    "rdb": ("--appendonly", "no", "--save", ""),  # snapshots: BGSAVE each second, below
}
AOF_BOUND_MS = 2000.0
"""everysec's worst case: Redis documents up to two seconds when an fsync is slow."""


def _info(text: Any) -> dict[str, str]:
    raw = text.decode() if isinstance(text, bytes) else str(text)
    return dict(line.split(":", 1) for line in raw.splitlines() if ":" in line)


async def _persistence(client: RedisClient) -> dict[str, str]:
    return _info(await client.execute("INFO", "persistence"))


async def _wait_loaded(url: str, timeout: float = 30.0) -> None:
    """Wait until a restarted server has loaded its data set (INFO answers while loading)."""
    deadline = time.monotonic() + timeout
    async with connect(url) as client:
        while time.monotonic() < deadline:
            try:
                if (await _persistence(client)).get("loading") == "0":
                    return
            except RespireError:
                pass
            await anyio.sleep(0.05)
    raise TimeoutError(f"the restarted server at {url} did not finish loading")


@register
class Restore:
    number: ClassVar[int] = 9
    name: ClassVar[str] = NAME
    title: ClassVar[str] = "SIGKILL a server, restart it from AOF / RDB, reconcile the ledger"
    ci: ClassVar[bool] = True
    own_servers: ClassVar[bool] = True

    async def run(self, ctx: ChaosContext) -> list[Verdict]:
        return [await self.restore(ctx, mode) for mode in MODES]

    async def restore(self, ctx: ChaosContext, mode: str) -> Verdict:
        case = f"sigkill-restore:{mode}"
        produce_for = 8.0 if ctx.full else 2.5
        started = time.monotonic()
        work = ctx.path("s9", mode, "x").parent
        server = spawn_server(work / "server", *MODES[mode], binary=ctx.server_binary)
        queue_name = ctx.name(f"restore-{mode}")
        ledger_path, effects = work / "producer.jsonl", work / "effects.jsonl"
        violations: list[str] = []
        details: dict[str, Any] = {"mode": mode, "server": server.binary.name}
        worker = None
        try:
            worker = start_worker(
                server.url, queue_name, effects, work / "workers",
                "--consumers", "8", "--visibility-ms", "2000", "--recovery-ms", "250",
                backend=ctx.backend,
            )  # fmt: skip
            snapshot_at: float | None = None
            async with connect(server.url) as client:
                queue = JobQueue(client, queue_name, JsonValueCodec())
                with Ledger(ledger_path) as ledger:
                    stop = anyio.Event()
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._produce, queue, ledger, stop)
                        if mode == "rdb":
                            snapshot_at = await self._snapshots(client, produce_for)
                        else:
                            await anyio.sleep(produce_for)
                        killed_at = time.time()
                        server.kill()
                        stop.set()
            details["server_exit"] = server.process.returncode if server.process else None
            if details["server_exit"] != -signal.SIGKILL:
                violations.append(f"the server exited with {details['server_exit']}")
            server.start()
            await _wait_loaded(server.url)
            async with connect(server.url) as client:
                queue = JobQueue(client, queue_name, JsonValueCodec())
                accepted = {
                    str(line["job"]): float(line["t"])
                    for line in read_ledger(ledger_path)
                    if line["kind"] == "accepted"
                }
                missing = await self._missing(client, queue, accepted)
                present = set(accepted) - set(missing)
                outcomes = await wait_for_outcomes(queue, effects, present, 60.0)
                window_ms = (
                    (killed_at - min(accepted[j] for j in missing)) * 1000 if missing else 0.0
                )
                bound_ms = AOF_BOUND_MS if snapshot_at is None else (killed_at - snapshot_at) * 1000
                if window_ms > bound_ms:
                    violations.append(
                        f"{len(missing)} jobs lost over {window_ms:.0f} ms; the bound is "
                        f"{bound_ms:.0f} ms"
                    )
                verdict = reconcile(
                    NAME, case, accepted, outcomes, 0.0,
                    allowed_loss=len(missing), violations=violations,
                )  # fmt: skip
                # the outbox republishes what the restore lost, under the same job ids
                republished = [await queue.enqueue(job, {"sleep": 0.002}) for job in missing]
                if not all(r.enqueued for r in republished):
                    violations.append("a republished job was refused as a duplicate")
                after = await wait_for_outcomes(queue, effects, set(missing), 60.0)
                unfinished = [j for j in missing if not after.completed[j]]
                if unfinished:
                    violations.append(f"republished jobs did not complete: {unfinished[:5]}")
                final = await read_outcomes(queue, effects)
                doubles = [j for j in accepted if final.completed[j] > 1]
                if doubles:
                    violations.append(f"completed twice: {doubles[:5]}")
                details.update(
                    {
                        "accepted_before_kill": len(accepted),
                        "lost_at_restore": len(missing),
                        "loss_window_ms": round(window_ms, 1),
                        "loss_bound_ms": round(bound_ms, 1),
                        "republished_and_completed": len(missing) - len(unfinished),
                    }
                )
        finally:
            if worker is not None:
                details["worker_exit"] = worker.stop()
            server.stop()
        return Verdict(
            scenario=NAME,
            case=case,
            accepted=verdict.accepted,
            completed=verdict.completed,
            duplicates=verdict.duplicates,
            lost=verdict.lost,
            dead_lettered=verdict.dead_lettered,
            seconds=round(time.monotonic() - started, 2),
            passed=verdict.passed and not violations,
            violations=tuple(dict.fromkeys((*verdict.violations, *violations))),
            details=details,
        )

    @staticmethod
    async def _produce(queue: JobQueue[Any], ledger: Ledger, stop: anyio.Event) -> None:
        """Enqueue until ``stop`` or the first failure (the kill); each acceptance is an
        fsynced ledger line with its wall-clock time."""
        i = 0
        while not stop.is_set():
            job = f"j{i}"
            ledger.record(kind="intent", job=job)
            try:
                await queue.enqueue(job, {"sleep": 0.002})
            except RespireError as exc:
                ledger.record(kind="failed", job=job, error=repr(exc)[:300])
                return
            ledger.record(kind="accepted", job=job, t=time.time())
            i += 1
            await anyio.sleep(0.002)

    @staticmethod
    async def _snapshots(client: RedisClient, seconds: float) -> float:
        """BGSAVE once a second for ``seconds``; returns when the last completed snapshot was
        requested (its fork, so its point in time, is later)."""
        completed_at = 0.0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            requested = time.time()
            await client.execute("BGSAVE")
            info = await _persistence(client)
            for _ in range(1000):  # a small data set: a snapshot takes milliseconds
                if info.get("rdb_bgsave_in_progress") != "1":
                    break
                await anyio.sleep(0.01)
                info = await _persistence(client)
            if info.get("rdb_bgsave_in_progress") == "0" and (
                info.get("rdb_last_bgsave_status") == "ok"
            ):
                completed_at = requested
            await anyio.sleep(max(0.0, min(1.0, deadline - time.monotonic())))
        if not completed_at:
            raise RuntimeError("no snapshot completed before the kill")
        return completed_at

    @staticmethod
    async def _missing(
        client: RedisClient, queue: JobQueue[Any], accepted: dict[str, float]
    ) -> list[str]:
        """Accepted jobs the restored server has no trace of: their deduplication record
        (written in the same script as the entry, kept a day) did not come back."""
        jobs = sorted(accepted, key=accepted.__getitem__)
        missing: list[str] = []
        for start in range(0, len(jobs), 500):
            chunk = jobs[start : start + 500]
            found = await client.execute("MGET", *[queue.keys.dedup(j) for j in chunk])
            missing += [j for j, value in zip(chunk, found, strict=True) if value is None]
        return missing
