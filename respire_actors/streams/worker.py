"""Stream workers: supervised consumers of streams the application owns.

A stream worker runs the same actors as a job worker (admission-sized reads, a non-claiming
blocking wait, runners with lease-owned cancel scopes, a lease renewer, batched fenced
completion, startup replay and bounded recovery); only the atomic steps differ
(:class:`StreamSource`). Handlers receive raw entries and return ``ACK`` (or ``None``, or any
plain value), ``NACK`` or ``DeadLetter(reason, detail=...)``; the detail is validated but not
stored for stream workers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import anyio
import anyio.abc

from supervisors import Mailbox, Supervisor

from ..actors._util import text
from ..actors.admission import Admission
from ..actors.messages import Completion, Delivery
from ..actors.options import WorkerOptions, default_consumer_name, is_entry_id
from ..actors.restarts import RestartLimits
from ..actors.runtime import QueueRuntime, check_handler
from ..actors.source import (
    ClaimResult,
    ReadResult,
    RenewItem,
    claim_result,
    create_group,
    deliveries_from_read,
    recreate_group,
    renew_leases,
)
from ..actors.tree import ConsumerHost, consumer_supervisor
from ..codecs import BytesCodec
from ..errors import ConfigurationError, ValidationError, WrongKeyType
from ..keys import same_slot, validate_name
from ..redis.client import Arg, RedisClient
from ..redis.scripts import load
from ..tracing import STREAM_TRACE_FIELDS, ConsumerTelemetry

_READ = load("stream_read")
_CLAIM = load("stream_claim_pending")
_COMPLETE = load("stream_complete")


def validate_start_id(start_id: object) -> str:
    """``$`` (only new entries), ``0`` / ``0-0`` (the whole stream) or an entry id."""
    if not isinstance(start_id, str) or not (start_id == "$" or is_entry_id(start_id)):
        raise ValidationError(
            f"start_id must be '$', '0-0' or a stream entry id like '1700000000000-0', "
            f"got {start_id!r}"
        )
    return start_id


MAX_KEY_BYTES = 1024
"""Longest stream (or dead-letter stream) key a stream worker accepts, in UTF-8 bytes."""


def _key(name: object, what: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValidationError(f"{what} must be a nonblank str")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValidationError(f"{what} {name!r} is not valid Unicode") from None
    if size > MAX_KEY_BYTES:
        raise ValidationError(f"{what} is {size} bytes; the limit is {MAX_KEY_BYTES}")
    return name


@dataclass(frozen=True, slots=True)
class StreamWorkerOptions:
    """How a stream worker consumes one stream.

    group:               consumer group, created idempotently at ``start_id`` if missing
    start_id:            where a new group starts: ``$`` (new entries only, default), ``0-0``
                         (everything retained) or an entry id; ignored when the group exists
    consumer_name:       this process's consumer; default unique per process
    concurrency:         handlers running at once (admission permits)
    batch_size:          most entries one read admits (also bounded by free permits)
    block:               longest blocking wait for new entries
    visibility_timeout:  idle time after which another consumer may recover a delivery (running
                         deliveries are renewed, see ``renew_leases``)
    recovery:            run startup replay and periodic recovery (XAUTOCLAIM); turn it off only
                         when another process recovers this group's pending entries
    recovery_interval, recovery_page_size: cadence and page size of recovery passes
    delivery_limit:      deliveries before an entry is dead-lettered (None = unlimited)
    dead_letter_stream:  full key of the dead-letter stream (default ``<stream>:dead``); must
                         share the stream's cluster slot
    delete_acknowledged: XDEL entries once acknowledged; refused (ConfigurationError) at start
                         when the stream has another consumer group, whose unread entries it
                         would delete
    shutdown_grace:      time running handlers get to finish at shutdown
    recreate_missing_group: when the group vanishes under a running worker: ``"fail"``
                         (default: stop with ConsumerGroupMissing), ``"$"`` or an entry id
    recovery_max_pages:  most recovery pages per pass (then the pass yields to reads)
    consumer_idle_timeout: remove other consumers idle this long with nothing pending (None: never)
    renew_leases:        (default True) renew running deliveries' visibility so a handler may run
                         past the visibility timeout; it is cancelled only when its lease is
                         really lost. False: the visibility timeout is a fixed lease
    timeout:             execution budget of one handler call (None: none); when it runs out
                         the handler is cancelled and the nack policy applies
    telemetry_name:      bounded name for metrics and logs (default: the stream key); choose a
                         fixed role name, never a per-tenant one
    trace_fields:        the (traceparent, tracestate) entry fields the processing span links
                         to (see ``respire_actors.tracing.trace_fields``)
    """

    group: str = "respire"
    start_id: str = "$"
    consumer_name: str | None = None
    concurrency: int = 16
    batch_size: int = 64
    block: timedelta = timedelta(seconds=1)
    visibility_timeout: timedelta = timedelta(minutes=2)
    recovery: bool = True
    recovery_interval: timedelta = timedelta(seconds=5)
    recovery_page_size: int = 64
    delivery_limit: int | None = 5
    dead_letter_stream: str | None = None
    delete_acknowledged: bool = False
    shutdown_grace: timedelta = timedelta(seconds=10)
    recreate_missing_group: str = "fail"
    recovery_max_pages: int = 4
    consumer_idle_timeout: timedelta | None = timedelta(days=1)
    renew_leases: bool = True
    timeout: timedelta | float | None = None
    telemetry_name: str | None = None
    trace_fields: tuple[str, str] = STREAM_TRACE_FIELDS

    def __post_init__(self) -> None:
        validate_name(self.group, what="consumer group")
        if (
            not isinstance(self.trace_fields, tuple)
            or len(self.trace_fields) != 2
            or not all(isinstance(f, str) and f for f in self.trace_fields)
            or self.trace_fields[0] == self.trace_fields[1]
        ):
            raise ValidationError(
                "trace_fields must be two distinct nonblank field names (traceparent, tracestate)"
            )
        validate_start_id(self.start_id)
        for flag in ("recovery", "delete_acknowledged"):
            if not isinstance(getattr(self, flag), bool):
                raise ValidationError(f"{flag} must be a bool")
        if self.dead_letter_stream is not None:
            _key(self.dead_letter_stream, "dead_letter_stream")
        self.worker_options()  # validates the shared fields with their precise messages

    def worker_options(self) -> WorkerOptions:
        return WorkerOptions(
            consumer_count=self.concurrency,
            visibility_timeout=self.visibility_timeout,
            recovery_interval=self.recovery_interval,
            recovery_page_size=self.recovery_page_size,
            delivery_limit=self.delivery_limit,
            consumer_name=self.consumer_name,
            read_batch=self.batch_size,
            poll_interval=self.block,
            shutdown_grace=self.shutdown_grace,
            recreate_missing_group=self.recreate_missing_group,
            recovery_max_pages=self.recovery_max_pages,
            consumer_idle_timeout=self.consumer_idle_timeout,
            renew_leases=self.renew_leases,
            timeout=self.timeout,
            telemetry_name=self.telemetry_name,
            # crash-loop isolation needs recovery pages that hold one suspect alone, which only
            # the job queue's claim script makes
            isolate_suspects=False,
        )


class StreamEntry:
    """One delivery of a stream entry, as a stream handler sees it.

    ``id`` is the entry id, ``fields`` its field/value map (bytes), ``attempt`` its delivery
    count. The handler runs in :attr:`cancel_scope`, cancelled when the lease is lost or the
    execution budget ends (see docs/stream-workers.md).
    """

    __slots__ = ("cancel_scope", "delivery", "lease_lost", "stream")

    def __init__(self, stream: str, delivery: Delivery) -> None:
        self.stream = stream
        self.delivery = delivery
        self.cancel_scope: anyio.CancelScope | None = None
        self.lease_lost = False

    @property
    def id(self) -> str:
        return self.delivery.entry_id

    @property
    def fields(self) -> Mapping[bytes, bytes]:
        return self.delivery.fields

    @property
    def attempt(self) -> int:
        return self.delivery.attempt

    def __repr__(self) -> str:
        return f"StreamEntry(stream={self.stream!r}, id={self.id!r}, attempt={self.attempt})"


StreamHandler = Callable[[StreamEntry], Awaitable[Any]]
"""A stream handler: ``ACK`` / ``None`` / any plain value acknowledge, ``NACK`` and
``DeadLetter(reason, detail=...)`` fail (``RetryAfter`` behaves as ``NACK``)."""


class StreamSource:
    """The stream worker's atomic steps: ``stream_read``, ``stream_claim_pending``,
    ``stream_complete``."""

    def __init__(
        self,
        client: RedisClient,
        stream: str,
        dead: str,
        group: str,
        start_id: str,
        delete_acknowledged: bool,
    ) -> None:
        self.client = client
        self.name = stream
        self.stream_key = stream
        self.dead = dead
        self.group = group
        self.start_id = start_id
        self.delete_acknowledged = delete_acknowledged

    async def ensure_group(self, on_missing: str) -> None:
        """At start the group is created at ``start_id`` if missing (the stream is yours, and
        so is the choice of where a new group starts). The dead-letter key must be a stream
        (or absent): recovery moves entries there, and a key of another type would stop every
        recovery pass while new entries kept being read, so it is refused here."""
        kind = text(await self.client.execute("TYPE", self.dead))
        if kind not in ("none", "stream"):
            raise WrongKeyType(
                f"WRONGTYPE the dead-letter key {self.dead} of stream {self.stream_key} holds a "
                f"{kind}, not a stream: delete or rename it, or give the worker another "
                "dead_letter_stream"
            )
        await create_group(self.client, self.stream_key, self.group, self.start_id)
        if self.delete_acknowledged:
            others = [
                g for g in await _group_names(self.client, self.stream_key) if g != self.group
            ]
            if others:
                raise ConfigurationError(
                    f"delete_acknowledged would delete entries of stream {self.stream_key} that "
                    f"its other consumer group(s) {', '.join(repr(g) for g in others)} may not "
                    "have read yet: turn it off (trim the stream by its slowest group instead, "
                    "see docs/stream-workers.md), or remove the other groups"
                )

    async def restore_group(self, on_missing: str) -> None:
        await recreate_group(self.client, self.stream_key, self.group, on_missing)

    async def read(self, consumer: str, count: int, min_idle_ms: int = 0) -> ReadResult:
        reply = await _READ(self.client, (self.stream_key,), (self.group, consumer, count))
        if text(reply[0]) == "ok":
            return ReadResult("ok", deliveries_from_read(reply[1]))
        return ReadResult("empty", last_id=text(reply[1]))

    async def claim(
        self, consumer: str, mode: str, cursor: str, count: int, min_idle_ms: int, limit: int
    ) -> ClaimResult:
        reply = await _CLAIM(
            self.client,
            (self.stream_key, self.dead),
            (
                self.group,
                consumer,
                mode,
                min_idle_ms,
                cursor,
                count,
                limit,
                int(self.delete_acknowledged),
            ),
        )
        return claim_result(reply)

    async def complete(self, consumer: str, batch: Sequence[Completion]) -> list[int]:
        args: list[Arg] = [self.group, consumer, int(self.delete_acknowledged), len(batch)]
        for c in batch:
            args += [c.delivery.entry_id, c.delivery.attempt, c.kind, c.reason]
        reply = await _COMPLETE(self.client, (self.stream_key, self.dead), args)
        return [int(s) for s in reply]

    async def renew(self, consumer: str, items: Sequence[RenewItem]) -> list[int]:
        """Renew running deliveries' visibility (``lease_renew``), one call for the batch."""
        return await renew_leases(self.client, self.stream_key, self.group, consumer, items)


async def _group_names(client: RedisClient, stream: str) -> list[str]:
    """The names of the stream's consumer groups (XINFO GROUPS)."""
    names = []
    for info in await client.execute("XINFO", "GROUPS", stream):
        fields = dict(zip(info[::2], info[1::2], strict=True)) if isinstance(info, list) else info
        name = fields.get(b"name", fields.get("name"))
        names.append(text(name))
    return names


def bind_entry(rt: QueueRuntime, delivery: Delivery) -> StreamEntry:
    """The stream worker's handler argument: the raw entry (nothing to decode)."""
    return StreamEntry(rt.name, delivery)


@dataclass(frozen=True, slots=True)
class StreamRegistration:
    stream: str
    handler: StreamHandler
    options: StreamWorkerOptions


class StreamWorker(ConsumerHost):
    """Consumes application-owned streams with supervised actors.

    ::

        workers = StreamWorker()

        @workers.stream("orders", StreamWorkerOptions(group="billing", start_id="0-0"))
        async def bill(entry: StreamEntry):
            ...
            return ACK

        await workers.run(client)        # or: python -m respire_actors serve app:workers

    Stream keys are used exactly as given (no client key prefix: the stream is yours).
    """

    def __init__(
        self, name: str = "streams", *, restart_limits: RestartLimits | None = None
    ) -> None:
        validate_name(name, what="worker name")
        super().__init__(name, restart_limits)
        self._registrations: dict[str, StreamRegistration] = {}

    def register(
        self, stream: str, handler: StreamHandler, options: StreamWorkerOptions | None = None
    ) -> StreamRegistration:
        """Register ``handler`` for ``stream`` (once per stream).

        Raises :class:`ValidationError` for a bad stream key, a handler that is not an
        ``async def`` function or options that are not :class:`StreamWorkerOptions`, and
        :class:`ConfigurationError` for a dead-letter stream that equals the stream or hashes
        to another cluster slot (checked on every server, so a configuration that works on a
        single node also works on a cluster).
        """
        _key(stream, "stream")
        check_handler(handler)
        if options is None:
            options = StreamWorkerOptions()
        elif not isinstance(options, StreamWorkerOptions):
            raise ValidationError(
                f"options must be a StreamWorkerOptions or None, got {type(options).__name__}"
            )
        if options.dead_letter_stream is not None:
            if options.dead_letter_stream == stream:
                raise ConfigurationError("the dead-letter stream must differ from the stream")
            if not same_slot(stream, options.dead_letter_stream):
                raise ConfigurationError(
                    f"dead-letter stream {options.dead_letter_stream!r} is not in the cluster "
                    f"slot of {stream!r}: give both keys the same hash tag, e.g. '{{orders}}' "
                    "and '{orders}:dead'"
                )
        if stream in self._registrations:
            raise ValidationError(f"stream {stream!r} is already registered on this worker")
        if self._supervisor is not None:
            raise RuntimeError("register handlers before the worker runs")
        reg = StreamRegistration(stream, handler, options)
        self._registrations[stream] = reg
        return reg

    def stream(
        self, stream: str, options: StreamWorkerOptions | None = None
    ) -> Callable[[StreamHandler], StreamHandler]:
        """Decorator form of :meth:`register`."""
        if options is not None and not isinstance(options, StreamWorkerOptions):
            raise ValidationError(
                f"options must be a StreamWorkerOptions or None, got {type(options).__name__}"
            )

        def decorate(fn: StreamHandler) -> StreamHandler:
            self.register(stream, fn, options)
            return fn

        return decorate

    def _runtime(self, client: RedisClient, reg: StreamRegistration) -> QueueRuntime:
        o = reg.options
        dead = o.dead_letter_stream or f"{reg.stream}:dead"
        if dead == reg.stream:
            raise ConfigurationError("the dead-letter stream must differ from the stream")
        if client.is_cluster and not same_slot(reg.stream, dead):
            raise ConfigurationError(
                f"dead-letter stream {dead!r} is not in the cluster slot of {reg.stream!r}: "
                "give both keys the same hash tag, e.g. '{orders}' and '{orders}:dead'"
            )
        wo = o.worker_options()
        source = StreamSource(client, reg.stream, dead, o.group, o.start_id, o.delete_acknowledged)
        return QueueRuntime(
            client=client,
            keys=None,
            source=source,
            codec=BytesCodec(),
            handler=reg.handler,
            options=wo,
            consumer=o.consumer_name or default_consumer_name(),
            admission=Admission(o.concurrency),
            deliveries=Mailbox[Delivery](
                max(o.batch_size, o.recovery_page_size) + o.concurrency,
                name=f"{reg.stream}:deliveries",
            ),
            completions=Mailbox[Completion](
                max(64, 2 * o.concurrency), name=f"{reg.stream}:completions"
            ),
            group=o.group,
            bind=bind_entry,
            telemetry=ConsumerTelemetry(
                o.telemetry_name or reg.stream, reg.stream, "stream process", o.trace_fields
            ),
        )

    def build(self, client: RedisClient) -> Supervisor:
        """The supervision tree for ``client``, to run or compose into your own. Raises
        :class:`RuntimeError` while this worker is running. A composed tree belongs to this
        worker until it has stopped: use one worker per tree."""
        self._refuse_if_running()
        if not self._registrations:
            raise ValidationError("the stream worker has no registered handlers")
        sups = []
        for reg in self._registrations.values():
            rt = self._runtime(client, reg)
            rt.on_fatal = self._on_fatal
            self._runtimes[reg.stream] = rt
            sups.append(
                consumer_supervisor(
                    f"stream:{reg.stream}",
                    rt,
                    recovery=reg.options.recovery,
                    limits=self.restart_limits,
                )
            )
        return self._root(sups)

    async def run(
        self,
        client: RedisClient,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run until cancelled or stopped; ready once every actor has started."""
        await self._run_tree(self.build(client), task_status)
