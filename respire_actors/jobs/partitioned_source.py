"""The source of a partitioned job queue's worker: one registration reads every partition.

Each partition is an ordinary job queue with its own :class:`JobSource`; this source visits
them and tags every delivery with its partition (``Delivery.origin``), so completions, lease
renewals, progress and logs go to the partition the job came from, with the same scripts,
fencing, leases, retries and dead letters as a plain queue. Nothing uses a key outside the
partitions' own hash tags except the start-up check of the recorded partition count.

- **Reads** go round-robin with a small quantum: a read takes up to the admitted count from
  the first partition with work, starting where the last read left off; a partition stays
  first for at most :data:`STICKY_READS` consecutive full reads, so busy partitions share the
  worker while the jobs in flight come from few partitions at a time. A partition found
  empty, or read to its end (the read took fewer entries than it asked for), is skipped
  until a wait, or a check every :data:`REFRESH_MS` while others keep the reader busy,
  reports a new entry in it.
- **Waits** (nothing ready anywhere): on one server, one ``XREAD BLOCK`` over every
  partition's ready stream (and, with scheduling, its staging stream, bounded by the time the
  next parked group is due); on a cluster, where one command cannot name keys of several
  slots, a non-blocking probe of the same streams (pipelined per node) repeated at growing
  intervals (:data:`PROBE_MIN_MS` up to :data:`PROBE_MAX_MS`, or one ms per partition when
  there are more) until the wait ends. Paused or rate-denied partitions are not watched (their
  waiting entries would end every wait at once). A wait that times out makes them, and every
  :data:`RESCAN_EVERY` timeouts every partition, read candidates again.
- **Recovery** (startup replay and visibility recovery) visits the partitions in turn, one
  page (at most ``recovery_page_size`` entries) from one partition per visit, then moves on:
  a partition with a large stale pending list cannot starve the others, and each pass resumes
  where the last one stopped. A partition that is paused is skipped by the pass.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import anyio

from ..actors._util import text
from ..actors.messages import Completion, Delivery
from ..actors.runtime import log
from ..actors.source import (
    UNCONFIRMED,
    ClaimResult,
    PartlyUnavailable,
    PromotionResult,
    ReadResult,
    RenewItem,
    renew_item,
)
from ..errors import ClusterReconfiguring, RedisUnavailable, RespireError, ServerLoading
from ..redis.client import BlockingConnection, RedisClient
from .partitioning import run_all as _run_all
from .partitioning import verify_partition_count
from .source import JobSource

R = TypeVar("R")

PROBE_MIN_MS = 5
"""First probe interval of a cluster wait (doubles up to :data:`PROBE_MAX_MS`)."""
PROBE_MAX_MS = 100
"""Longest interval between two probes of a cluster wait (the added pickup latency when idle),
in ms; with more partitions than that, one ms per partition (an idle worker then probes at most
about 1000 partitions per second)."""
STICKY_READS = 8
"""Most consecutive full reads from one partition before the next read starts at the next
partition (round-robin with a small quantum: in-flight jobs then share few partitions, so the
completer commits them in few calls)."""
REFRESH_MS = 50
"""While some partitions keep the reader busy (so it never waits), the partitions found empty
are checked for new entries this often, in ms (one non-blocking XREAD over them on one server;
at least one ms per ten partitions), so a busy partition cannot starve a newly filled one."""
RESCAN_EVERY = 10
"""Every this many wait timeouts, every partition is read again (not only paused ones)."""


async def gather(calls: Sequence[Callable[[], Awaitable[R]]]) -> list[R]:
    """Run the calls concurrently; once every call has ended, raise the first failure (in
    call order), else return the results."""
    out, failures = await _run_all(calls)
    if failures:
        raise failures[min(failures)]
    return out


TRANSIENT = (RedisUnavailable, ServerLoading)
"""Failures of one partition's node that must not stop the others (a dead master, a failover,
a slot migration, a server loading its data)."""
NODE_PROBE_S = 0.5
"""How long a node that was down gets to answer a read-only probe before its partitions are
read again (at most the command timeout): the probe runs on the reader's path, so it is kept
short; a node slower than this counts as down a while longer."""
FRESH_PROBE_S = 1.0
"""Longest wait for one node's answer to a cluster wait's (read-only) probe: a node that takes
longer is passed over as down for a while, so it cannot hold up the waits of the others."""
NODE_RETRY_MIN = 0.2
NODE_RETRY_MAX = 5.0
"""A node that could not be reached is passed over by reads and recovery for this long
(doubling from the minimum while it stays unreachable), then one of its partitions is tried."""


async def gather_reachable(
    calls: Sequence[Callable[[], Awaitable[R]]],
) -> tuple[list[R | None], BaseException | None]:
    """Like :func:`gather`, but a transient failure (an unreachable node) of some calls is
    reported as None in their places with the first such error; any other failure is raised.
    Raises the first transient error when every call failed."""
    out, failures = await _run_all(calls)
    other = [i for i, exc in failures.items() if not isinstance(exc, TRANSIENT)]
    if other:
        raise failures[min(other)]
    if failures and len(failures) == len(calls):
        raise failures[min(failures)]
    return out, (failures[min(failures)] if failures else None)


def _slot_key(i: int) -> str:
    """The key under which partition ``i`` is passed over while its slot cannot be served."""
    return f"partition {i}"


def _tagged(deliveries: Sequence[Delivery], origin: int) -> Sequence[Delivery]:
    for d in deliveries:
        d.origin = origin
    return deliveries


@dataclass(slots=True)
class _Sweep:
    """One recovery (or replay) pass over the partitions: those still to visit, and the
    resume cursor of each one visited with more to go."""

    pending: deque[int]
    cursors: dict[int, str] = field(default_factory=dict)


class PartitionedSource:
    """The steps of a worker registration over ``parts`` (partition ``i`` at index ``i``)."""

    def __init__(
        self, client: RedisClient, name: str, parts: Sequence[JobSource], group: str
    ) -> None:
        if not parts:
            raise ValueError("a partitioned source needs at least one partition")
        self.client = client
        self.name = name
        self.parts = tuple(parts)
        self.group = group
        self.stream_key = parts[0].stream_key
        self.stream_keys = tuple(p.stream_key for p in parts)
        n = len(parts)
        self._next = 0  # the partition a read starts at
        self._streak = 0  # consecutive full reads from partition _next
        self._candidate = [True] * n  # may have unread entries
        self._held: set[int] = set()  # paused or denied at their last read
        self._last_ids = ["0-0"] * n  # newest entry each empty partition had
        # with scheduling (QueueOptions): each empty partition's newest staged entry, and the
        # earliest moment a delayed or parked group of any partition is due (monotonic s)
        self._staged_ids: list[str | None] = [None] * n
        self._wake_at: float | None = None
        self._timeouts = 0
        self._refresh_at = 0.0  # when read() next looks at partitions found empty
        self._probe_delay = PROBE_MIN_MS / 1000
        self._sweeps: dict[str, _Sweep] = {}
        # nodes that could not be reached (a cluster node's address, or "server"): when to try
        # one of their partitions again, and the current pause
        self._down: dict[str, float] = {}
        self._down_for: dict[str, float] = {}
        self._down_parts: dict[int, str] = {}  # partitions that failed, and on which node
        self._index = {key: i for i, key in enumerate(self.stream_keys)}
        self._index.update({p.keys.scheduled: i for i, p in enumerate(self.parts)})

    # -- start-up -----------------------------------------------------------------------------
    async def ensure_group(self, on_missing: str) -> None:
        """Check the recorded partition count first (nothing is created on a mismatch), then
        each partition's consumer group as for a plain queue."""
        await verify_partition_count(
            self.client, self.name, len(self.parts), copy=True, first="worker"
        )
        await gather([partial(p.ensure_group, on_missing) for p in self.parts])

    async def restore_group(self, on_missing: str) -> None:
        await gather([partial(p.restore_group, on_missing) for p in self.parts])

    async def prepare(self) -> None:
        await gather([p.prepare for p in self.parts])

    # -- reading ------------------------------------------------------------------------------
    async def read(self, consumer: str, count: int, min_idle_ms: int = 0) -> ReadResult:
        n = len(self.parts)
        expired = 0
        now = anyio.current_time()
        if now >= self._refresh_at and not all(self._candidate):
            # while busy partitions keep the reader from waiting, look at the others too
            self._refresh_at = now + max(REFRESH_MS, n / 10) / 1000
            for i in self._held:
                self._candidate[i] = True
            self._held.clear()
            idle = [i for i in range(n) if not self._candidate[i] and self._reachable(i, now)]
            for i in await self._fresh(idle):
                self._candidate[i] = True
        failure: BaseException | None = None
        reached = False
        for k in range(n):
            i = (self._next + k) % n
            if not self._candidate[i] or not self._reachable(i, now):
                continue
            if self._down_for and not await self._answers(i):
                continue  # its node was down and still does not answer: passed over again
            try:
                result = await self.parts[i].read(consumer, count, min_idle_ms)
            except TRANSIENT as exc:
                # its node is down (or failing over): read the other partitions meanwhile
                self._mark_down(i, exc)
                failure = failure or exc
                continue
            reached = True
            self._mark_up(i)
            expired += result.expired
            if result.status == "ok":
                # stay on a partition with more work for up to STICKY_READS reads (so a batch
                # of completions mostly commits in one call), then move on
                self._streak = self._streak + 1 if i == self._next else 1
                full = len(result.deliveries) >= count
                if not full or self._streak >= STICKY_READS:
                    self._next, self._streak = (i + 1) % n, 0
                else:
                    self._next = i
                if result.drained_id is not None:
                    # the read reached the partition's end: watch it for a newer entry
                    # instead of reading it again only to find it empty
                    self._candidate[i] = False
                    self._last_ids[i] = result.drained_id
                return ReadResult(
                    "ok",
                    _tagged(result.deliveries, i),
                    expired=expired,
                    pace_ms=result.pace_ms,
                )
            if result.status == "recover":
                self._next = (i + 1) % n
                return ReadResult(
                    "recover", last_id=f"{i}@{result.last_id}", pace_ms=result.pace_ms
                )
            self._candidate[i] = False
            if result.status == "empty":
                self._last_ids[i] = result.last_id
                self._staged_ids[i] = result.staged_last_id
                if result.wake_ms > 0:  # a delayed or parked group is due then
                    at = anyio.current_time() + result.wake_ms / 1000
                    self._wake_at = at if self._wake_at is None else min(self._wake_at, at)
            else:
                self._held.add(i)
        if failure is not None and not reached:
            now = anyio.current_time()
            if not any(self._reachable(j, now) for j in range(n)):
                raise failure  # every node is down: the reader's outage handling
        return ReadResult("empty", expired=expired)

    # -- unreachable nodes --------------------------------------------------------------------
    def _node(self, i: int) -> str:
        return self.client.node_of(self.stream_keys[i]) or "server"

    def _reachable(self, i: int, now: float) -> bool:
        if not self._down:
            return True
        return (
            self._down.get(self._node(i), 0.0) <= now and self._down.get(_slot_key(i), 0.0) <= now
        )

    def _probe_cap(self) -> float:
        return min(NODE_PROBE_S, self.client.settings.command_timeout)

    async def _answers(self, i: int) -> bool:
        """Whether partition ``i``'s node answers now, when it was down (a read-only XLEN,
        bounded by :data:`NODE_PROBE_S`): a partition read is not tried on a dead node, whose
        timeout would hold up the reader for every other partition."""
        node = self._node(i)
        if node not in self._down_for:
            return True  # up, or only its slot was passed over (that pause is simply waited out)
        with anyio.move_on_after(self._probe_cap()):
            try:
                await self.client.execute("XLEN", self.stream_keys[i])
            except TRANSIENT as exc:
                self._mark_down(i, exc)
                return False
            # the node answers: clear its mark even if this partition's last mark was its
            # slot's (else the node would be probed before every read of its partitions)
            self._down_parts[i] = node
            self._mark_up(i)
            return True
        self._mark_down(i, RedisUnavailable(f"no answer within {self._probe_cap()} s"))
        return False

    def _mark_down(self, i: int, exc: BaseException) -> None:
        # a slot being migrated (TRYAGAIN) or served by nobody (CLUSTERDOWN for it) holds up
        # its own partition only: the node answers for its other slots
        slot = isinstance(exc, ClusterReconfiguring)
        node = _slot_key(i) if slot else self._node(i)
        if self._down.get(node, 0.0) > anyio.current_time():
            return  # already passed over (another of its partitions failed at the same time)
        pause = min(self._down_for.get(node, NODE_RETRY_MIN / 2) * 2, NODE_RETRY_MAX)
        if node not in self._down_for:
            if slot:
                log.warning(
                    "%s: partition %d cannot be served right now (%s); serving the other "
                    "partitions meanwhile",
                    self.name,
                    i,
                    exc,
                )
            else:
                log.warning(
                    "%s: the node of partition %d (%s) cannot be reached (%s); serving the "
                    "other partitions meanwhile",
                    self.name,
                    i,
                    node,
                    exc,
                )
        self._down_for[node] = pause
        self._down[node] = anyio.current_time() + pause
        self._down_parts[i] = node

    def _mark_up(self, i: int) -> None:
        if self._down_parts:
            was = self._down_parts.pop(i, None)
            if was is None:
                return
            now_at = self._node(i)
            if self._down_for.pop(was, None) is not None:
                self._down.pop(was, None)
                if was == _slot_key(i):
                    log.warning("%s: partition %d is served again", self.name, i)
                    return
                if now_at == was:
                    log.warning("%s: the node of partition %d (%s) is back", self.name, i, was)
                else:  # a replica took the slot over (failover), or it moved
                    log.warning(
                        "%s: partition %d is served again, now by %s (%s could not be reached)",
                        self.name,
                        i,
                        now_at,
                        was,
                    )

    async def wait(self, blocking: BlockingConnection, wait_ms: int) -> None:
        """Wait for a new entry in any partition (see the module docstring); the partitions
        that got one become read candidates, and all held ones after a timeout."""
        # held partitions (paused, denied) are not watched: their waiting entries would wake
        # the wait at once; they are read again after it
        now = anyio.current_time()
        watched = [
            i for i in range(len(self.parts)) if i not in self._held and self._reachable(i, now)
        ]
        if self._wake_at is not None:  # a grouped read asked to be woken when a group is due
            wait_ms = max(1, min(wait_ms, int((self._wake_at - anyio.current_time()) * 1000)))
            self._wake_at = None
        if not watched:
            await anyio.sleep(wait_ms / 1000)
            woken: set[int] = set()
        elif self.client.is_cluster:
            woken = await self._probe(watched, wait_ms)
        else:
            keys, ids = self._watch(watched)
            reply = await blocking.execute(
                "XREAD", "COUNT", 1, "BLOCK", wait_ms, "STREAMS", *keys, *ids
            )
            woken = self._streams_in(reply)
        if woken:
            for i in woken:
                self._candidate[i] = True
            return
        self._timeouts += 1
        if self._timeouts % RESCAN_EVERY == 0:
            self._candidate = [True] * len(self.parts)
        for i in self._held:
            self._candidate[i] = True
        self._held.clear()

    async def _fresh(self, indices: Sequence[int]) -> set[int]:
        """The partitions among ``indices`` with an entry newer than the newest one their last
        empty read saw: one non-blocking XREAD on one server, one per partition (pipelined
        per node) on a cluster."""
        if not indices:
            return set()
        if not self.client.is_cluster:
            keys, ids = self._watch(indices)
            reply = await self.client.execute("XREAD", "COUNT", 1, "STREAMS", *keys, *ids)
            return self._streams_in(reply)
        # one pipeline per node, so a node that cannot be reached fails only its partitions
        by_node: dict[str, list[int]] = {}
        for i in indices:
            by_node.setdefault(self._node(i), []).append(i)
        nodes = list(by_node.values())
        woken: set[int] = set()

        async def probe(partitions: list[int]) -> bool:
            keys, ids = self._watch(partitions)
            commands = [
                ("XREAD", "COUNT", 1, "STREAMS", k, i) for k, i in zip(keys, ids, strict=True)
            ]
            # read only, so safe to give up on: a node that does not answer in time is down
            cap = min(FRESH_PROBE_S, self.client.settings.command_timeout)
            replies = await self.client.pipeline(commands, give_up_after=cap)
            for key, reply in zip(keys, replies, strict=True):
                if isinstance(reply, RespireError):
                    raise reply
                if reply:
                    woken.add(self._index[key])
            return True

        outcomes, failure = await gather_reachable([partial(probe, p) for p in nodes])
        for partitions, outcome in zip(nodes, outcomes, strict=True):
            if outcome is None and failure is not None:  # that node could not be reached
                self._mark_down(partitions[0], failure)
        return woken

    def _watch(self, indices: Sequence[int]) -> tuple[list[str], list[str]]:
        """The streams (and ids after which an entry is new) that say partitions ``indices``
        have work: the ready stream, and the staging stream of a scheduling registration
        (a newly staged grouped job)."""
        keys, ids = [], []
        for i in indices:
            keys.append(self.stream_keys[i])
            ids.append(self._last_ids[i])
            staged = self._staged_ids[i]
            if staged is not None:
                keys.append(self.parts[i].keys.scheduled)
                ids.append(staged)
        return keys, ids

    def _streams_in(self, reply: Any) -> set[int]:
        """The partitions an XREAD reply (RESP2 list or RESP3 map) has entries of."""
        streams = reply.keys() if isinstance(reply, dict) else [r[0] for r in reply or []]
        return {self._index[text(stream)] for stream in streams}

    async def _probe(self, watched: Sequence[int], wait_ms: int) -> set[int]:
        """Cluster wait: pipelined non-blocking reads after each partition's newest entry."""
        deadline = anyio.current_time() + wait_ms / 1000
        longest = max(PROBE_MAX_MS, len(self.parts)) / 1000
        while True:
            now = anyio.current_time()
            woken = await self._fresh([i for i in watched if self._reachable(i, now)])
            if woken:  # busy again: the next idle period starts probing quickly
                self._probe_delay = PROBE_MIN_MS / 1000
                return woken
            now = anyio.current_time()
            if now >= deadline:
                return woken
            await anyio.sleep(min(self._probe_delay, deadline - now))
            # the interval keeps growing across consecutive idle waits
            self._probe_delay = min(self._probe_delay * 2, longest)

    # -- recovery -----------------------------------------------------------------------------
    async def claim(
        self, consumer: str, mode: str, cursor: str, count: int, min_idle_ms: int, limit: int
    ) -> ClaimResult:
        """One recovery or replay page. A ``"<partition>@<id>"`` cursor (a read that answered
        ``recover``) claims from that partition. Otherwise ``"0-0"`` starts a pass over every
        partition and any other cursor continues it: partitions are visited in turn, each
        visit claims at most ``count`` entries from one partition and sends that partition to
        the back of the pass if it has more; a page returns at the first visit that claimed
        anything (``next_cursor`` is ``"0-0"`` once every partition is done)."""
        if "@" in cursor:
            index, _, entry = cursor.partition("@")
            i = int(index)
            page = await self.parts[i].claim(consumer, mode, entry, count, min_idle_ms, limit)
            _tagged(page.deliveries, i)
            return page
        sweep = self._sweeps.get(mode)
        if cursor == "0-0" or sweep is None:
            sweep = self._sweeps[mode] = _Sweep(deque(range(len(self.parts))))
        cleared = dead = expired = 0
        refused: list[tuple[str, str]] = []
        failure: BaseException | None = None
        reached = False
        while sweep.pending:
            i = sweep.pending.popleft()
            if not self._reachable(i, anyio.current_time()) or (
                self._down_for and not await self._answers(i)
            ):
                sweep.cursors.pop(i, None)  # its node is down: the next pass tries it again
                continue
            try:
                page = await self.parts[i].claim(
                    consumer, mode, sweep.cursors.get(i, "0-0"), count, min_idle_ms, limit
                )
            except TRANSIENT as exc:
                self._mark_down(i, exc)
                sweep.cursors.pop(i, None)
                failure = failure or exc
                continue
            reached = True
            self._mark_up(i)
            if page.denied:  # paused or rate limited: this pass skips the partition
                sweep.cursors.pop(i, None)
                continue
            if page.next_cursor != "0-0":
                sweep.cursors[i] = page.next_cursor
                sweep.pending.append(i)
            else:
                sweep.cursors.pop(i, None)
            cleared += page.cleared_deleted
            dead += page.dead_lettered
            expired += page.expired
            refused += page.refused
            if page.deliveries:
                return ClaimResult(
                    denied=False,
                    next_cursor=self._sweep_cursor(sweep),
                    deliveries=_tagged(page.deliveries, i),
                    cleared_deleted=cleared,
                    dead_lettered=dead,
                    expired=expired,
                    refused=refused,
                )
        if failure is not None and not reached:
            raise failure
        return ClaimResult(
            denied=False,
            next_cursor="0-0",
            cleared_deleted=cleared,
            dead_lettered=dead,
            expired=expired,
            refused=refused,
        )

    @staticmethod
    def _sweep_cursor(sweep: _Sweep) -> str:
        return f"pass:{len(sweep.pending)}" if sweep.pending else "0-0"

    # -- settling -----------------------------------------------------------------------------
    def _by_partition(self, deliveries: Sequence[Delivery]) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        for index, d in enumerate(deliveries):
            if not 0 <= d.origin < len(self.parts):
                raise ValueError(f"delivery {d.entry_id} has no partition {d.origin}")
            groups.setdefault(d.origin, []).append(index)
        return groups

    async def complete(self, consumer: str, batch: Sequence[Completion]) -> list[int]:
        """Each partition's completions in one call to its source, partitions concurrently;
        statuses in order. A failure is raised once every partition's call has ended (the
        completer then retries or splits the batch; fenced commits are safe to repeat). When
        some partitions' nodes cannot be reached, :class:`PartlyUnavailable` carries the
        others' statuses, so the completer retries only those, apart from later batches."""
        groups = self._by_partition([c.delivery for c in batch])
        items = list(groups.items())
        replies, failures = await _run_all(
            [partial(self.parts[i].complete, consumer, [batch[j] for j in idx]) for i, idx in items]
        )
        other = [k for k, exc in failures.items() if not isinstance(exc, TRANSIENT)]
        if other:
            raise failures[min(other)]
        failure = failures[min(failures)] if failures else None
        for k, exc in failures.items():
            if isinstance(exc, ClusterReconfiguring):
                # its slot is migrating: read no more of its jobs meanwhile (their outcomes
                # could not be committed either), the other partitions go on
                self._mark_down(items[k][0], exc)
        statuses: list[int | None] = [None] * len(batch)
        for (_, idx), reply in zip(items, replies, strict=True):
            if reply is not None:
                for j, status in zip(idx, reply, strict=True):
                    statuses[j] = status
        if failure is not None:
            raise PartlyUnavailable(str(failure), statuses)
        return [s if s is not None else 0 for s in statuses]

    async def renew(self, consumer: str, items: Sequence[RenewItem]) -> list[int]:
        raise NotImplementedError("a partitioned source renews deliveries (renew_deliveries)")

    async def renew_deliveries(
        self, consumer: str, deliveries: Sequence[Delivery], within: float
    ) -> list[int]:
        groups = self._by_partition(deliveries)
        items = list(groups.items())

        async def renew(i: int, idx: list[int]) -> list[int]:
            # each partition within the bound: a slow node leaves only its own unconfirmed
            with anyio.move_on_after(within):
                return await self.parts[i].renew(consumer, [renew_item(deliveries[j]) for j in idx])
            return [UNCONFIRMED] * len(idx)

        replies, _ = await gather_reachable([partial(renew, i, idx) for i, idx in items])
        # a partition whose node is unreachable: its leases are neither renewed nor lost
        statuses = [UNCONFIRMED] * len(deliveries)
        for (_, idx), reply in zip(items, replies, strict=True):
            if reply is not None:
                for j, status in zip(idx, reply, strict=True):
                    statuses[j] = status
        return statuses

    async def mark_leases(self, consumer: str, origins: Sequence[int] = ()) -> None:
        """:meth:`JobSource.mark_leases` on the partitions of ``origins`` (those whose
        deliveries run here), concurrently; a partition that cannot be reached is skipped
        (its node is down: nobody recovers from it meanwhile)."""
        parts = [self.parts[i] for i in sorted(set(origins)) if 0 <= i < len(self.parts)]
        await gather_reachable([partial(p.mark_leases, consumer) for p in parts])

    async def promote(self, batch_size: int) -> PromotionResult:
        """Every partition's promotion pass, concurrently; counts summed, the earliest next
        due time kept."""
        now = anyio.current_time()
        parts = [p for i, p in enumerate(self.parts) if self._reachable(i, now)]
        if not parts:
            return PromotionResult(promoted=0, expired=0, missing=0, next_due_ms=-1)
        reached, _ = await gather_reachable([partial(p.promote, batch_size) for p in parts])
        results = [r for r in reached if r is not None]  # an unreachable partition waits
        due = [r.next_due_ms for r in results if r.next_due_ms >= 0]
        return PromotionResult(
            promoted=sum(r.promoted for r in results),
            expired=sum(r.expired for r in results),
            missing=sum(r.missing for r in results),
            next_due_ms=min(due) if due else -1,
        )


__all__ = ["PROBE_MAX_MS", "PROBE_MIN_MS", "PartitionedSource", "gather"]
