"""Every Redis key name respire_actors uses is built here, and nowhere else.

Each queue keeps all its keys under one hash tag, so every multi-key script touches a single
Redis Cluster slot. A client key prefix is prepended to every key: a prefix that carries its own
hash tag (``"{tenant-7}:"``) moves all of a tenant's queues into that one slot instead.

Job queue ``email`` (prefix ``P``)::

    P{respire-job:email}:ready            ready stream (consumer group "respire")
    P{respire-job:email}:dead             default dead-letter stream
    P{respire-job:email}:events           progress / completed / dead-letter / pause events
    P{respire-job:email}:control          control hash (pause flag, rate-limit policy and usage)
    P{respire-job:email}:dedup:<sha256>   deduplication record of one job id
    P{respire-job:email}:logs:<sha256>    capped per-job log list
    P{respire-job:email}:scheduled        staging stream of delayed jobs and durable retries
    P{respire-job:email}:due              due-time index of the staging stream
    P{respire-job:email}:result:<sha256>  retained outcome record of one job id (keep_results)
    P{respire-job:email}:flow:<sha1>      state of one flow (parent/child results, statuses)
    P{respire-job:email}:batch:<sha1>     state of one batch (members, counts, callbacks)
    P{respire-job:email}:coordinated      marker: the queue has (had) flows or batches
    P{respire-job:email}:ready:metrics        per-minute completed/failed counters
    P{respire-job:email}:ready:group-order    rotation of application groups with staged jobs
    P{respire-job:email}:ready:group-jobs     staged grouped jobs (encoded group + due + id)
    P{respire-job:email}:ready:group-cursor   the last group visited (shared rotation cursor)
    P{respire-job:email}:ready:group-policy   group policy, pause flag, GCRA state, park reason
    P{respire-job:email}:ready:group-owners   owner (attempt, expiry, consumer) of each lease
    P{respire-job:email}:ready:group-leases   concurrency leases (encoded group + entry id)
    P{respire-job:email}:ready:group-parked   parked groups scored by their wake deadline

Partitioned job queue ``orders`` with N partitions: partition ``i`` is the ordinary job queue
``orders:p<i>`` (its own hash tag, so partitions spread over cluster slots), and the partition
count is recorded once, under the tag of the queue's own name (read at start only)::

    P{respire-job:orders:p0}:ready ...    every key above, per partition
    P{respire-job:orders}:partitions      the partition count (a string), checked at start
    P{respire-job:orders:p0}:partitions   a copy of it per partition (read when the record's
                                          node cannot be reached)

The registry of job queue names (a set; workers add their queues at start, ``list_queues`` reads
it, never KEYS)::

    P{respire}:queues

Application group names never appear in a key: they are encoded into members and fields.

Reliable queue ``orders``::

    P{respire-queue:orders}:stream / :deadlines / :dead / :dedup:<sha256> / :receipts

Reliable topic ``events`` and its subscription ``billing``::

    P{respire-topic:events}:stream / :dedup:<sha256>
    P{respire-topic:events}:sub:billing:deadlines / :sub:billing:receipts / :sub:billing:dead
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from .errors import ConfigurationError, ValidationError

MAX_NAME_BYTES = 512
MAX_PREFIX_BYTES = 512


def validate_key_prefix(prefix: object) -> str:
    """Check a client key prefix: a str that cannot break a queue's hash tag.

    A prefix without braces is always fine. One with braces must carry a complete, non-empty
    hash tag first (``"{tenant-7}:"``): Redis Cluster hashes the first ``{...}`` of a key, so an
    empty ``{}`` would make every key hash as a whole (a queue's keys spread over many slots)
    and an unclosed ``{`` would swallow the queue's own tag. Raises
    :class:`ConfigurationError` naming the problem.
    """
    if not isinstance(prefix, str):
        raise ConfigurationError(f"key_prefix must be a str, got {type(prefix).__name__}")
    try:
        size = len(prefix.encode("utf-8"))
    except UnicodeEncodeError:
        raise ConfigurationError(f"key_prefix {prefix!r} is not valid Unicode") from None
    if size > MAX_PREFIX_BYTES:
        raise ConfigurationError(f"key_prefix is {size} bytes; the limit is {MAX_PREFIX_BYTES}")
    start = prefix.find("{")
    if start >= 0:
        end = prefix.find("}", start + 1)
        if end < 0:
            raise ConfigurationError(
                f"key_prefix {prefix!r} opens a hash tag it never closes "
                "(it would break every queue's hash tag)"
            )
        if end == start + 1:
            raise ConfigurationError(
                f"key_prefix {prefix!r} starts with an empty hash tag {{}}: Redis would hash "
                "every key whole and split each queue over many cluster slots"
            )
    return prefix


def validate_name(name: object, *, what: str = "queue name") -> str:
    """Check a queue, topic or subscription name: a nonblank str without braces.

    Raises :class:`ValidationError` (before anything is sent to Redis).
    """
    if not isinstance(name, str):
        raise ValidationError(f"{what} must be a str, got {type(name).__name__}")
    if not name.strip():
        raise ValidationError(f"{what} must not be blank")
    if "{" in name or "}" in name:
        raise ValidationError(
            f"{what} {name!r} must not contain braces (they would break the hash tag)"
        )
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(f"{what} {name!r} is not valid Unicode") from None
    if len(encoded) > MAX_NAME_BYTES:
        raise ValidationError(f"{what} is {len(encoded)} bytes; the limit is {MAX_NAME_BYTES}")
    return name


def job_queue_key_pattern(queue: str | None = None, prefix: str = "") -> str:
    """A glob matching every key of job queue ``queue`` (None: of every job queue) under
    ``prefix``, for ACL key patterns and SCAN. Glob characters of the prefix and name are
    escaped."""
    validate_key_prefix(prefix)
    name = "*" if queue is None else _glob_escape(validate_name(queue))
    return f"{_glob_escape(prefix)}{{respire-job:{name}}}:*"


def queue_registry_pattern(prefix: str = "") -> str:
    """:func:`queue_registry` as an ACL key pattern (glob characters of the prefix escaped)."""
    validate_key_prefix(prefix)
    return f"{_glob_escape(prefix)}{{respire}}:queues"


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def digest(identity: str) -> str:
    """The hex SHA-256 of an application identity, used inside key names."""
    return hashlib.sha256(identity.encode("utf-8")).hexdigest()


def _sha1(identity: str) -> str:
    """The hex SHA-1 of an identity, as Lua's ``redis.sha1hex`` computes it (flow and batch keys
    are derived inside the completion scripts, where SHA-256 is not available)."""
    return hashlib.sha1(identity.encode("utf-8"), usedforsecurity=False).hexdigest()


def hash_tag(key: str) -> str:
    """The part of ``key`` Redis Cluster hashes (the first non-empty ``{...}``, else all)."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def same_slot(*keys: str) -> bool:
    """True when all keys share one hash tag (so one cluster slot)."""
    return len({hash_tag(k) for k in keys}) <= 1


RESERVED_JOB_SUFFIXES = frozenset(
    {"ready", "events", "control", "scheduled", "due", "coordinated", "partitions",
     "recurring", "recurring-due", "recurring-order", "recurring-cursor"}
)  # fmt: skip
"""Key suffixes of a job queue's own keys (a caller-chosen suffix must not be one)."""
RESERVED_JOB_PREFIXES = ("ready:", "dedup:", "logs:", "result:", "flow:", "batch:")
"""Suffix beginnings of a job queue's per-job and per-feature keys."""


def validate_job_key_suffix(suffix: object, *, what: str) -> str:
    """Check a caller-chosen key suffix inside a job queue's slot (``JobQueueKeys.custom``):
    a valid name that is none of the queue's own keys. Raises :class:`ValidationError`."""
    name = validate_name(suffix, what=what)
    if name in RESERVED_JOB_SUFFIXES or name.startswith(RESERVED_JOB_PREFIXES):
        raise ValidationError(
            f"{what} {name!r} would reuse a key of the queue itself; the reserved names are "
            f"{', '.join(sorted(RESERVED_JOB_SUFFIXES))} and anything starting with "
            f"{', '.join(RESERVED_JOB_PREFIXES)}"
        )
    return name


MAX_PARTITIONS = 1024
"""Most partitions one partitioned job queue may have."""


def partition_name(name: str, index: int) -> str:
    """The job queue name of partition ``index`` of partitioned queue ``name``: ``name:p<i>``."""
    return f"{name}:p{index}"


def partitions_key(name: str, prefix: str = "") -> str:
    """Where a partitioned job queue records its partition count (a string)."""
    validate_name(name)
    validate_key_prefix(prefix)
    return f"{prefix}{{respire-job:{name}}}:partitions"


def queue_registry(prefix: str = "") -> str:
    """The set of known job queue names (``respire_actors.admin.list_queues``)."""
    return f"{prefix}{{respire}}:queues"


@dataclass(frozen=True, slots=True)
class JobQueueKeys:
    """Key names of one job queue."""

    name: str
    prefix: str = ""

    def __post_init__(self) -> None:
        validate_name(self.name)
        validate_key_prefix(self.prefix)

    @property
    def base(self) -> str:
        return f"{self.prefix}{{respire-job:{self.name}}}"

    @property
    def ready(self) -> str:
        return f"{self.base}:ready"

    @property
    def dead(self) -> str:
        return f"{self.base}:dead"

    @property
    def events(self) -> str:
        return f"{self.base}:events"

    @property
    def control(self) -> str:
        return f"{self.base}:control"

    @property
    def scheduled(self) -> str:
        return f"{self.base}:scheduled"

    @property
    def due(self) -> str:
        return f"{self.base}:due"

    @property
    def metrics(self) -> str:
        """Per-minute completion counters (a hash; QueueOptions.metrics_retention_minutes)."""
        return f"{self.ready}:metrics"

    @property
    def group_order(self) -> str:
        return f"{self.ready}:group-order"

    @property
    def group_jobs(self) -> str:
        return f"{self.ready}:group-jobs"

    @property
    def group_cursor(self) -> str:
        return f"{self.ready}:group-cursor"

    @property
    def group_policy(self) -> str:
        return f"{self.ready}:group-policy"

    @property
    def group_owners(self) -> str:
        return f"{self.ready}:group-owners"

    @property
    def group_leases(self) -> str:
        return f"{self.ready}:group-leases"

    @property
    def group_parked(self) -> str:
        return f"{self.ready}:group-parked"

    @property
    def lease_keys(self) -> tuple[str, str, str]:
        """The keys a lease release needs: leases, owners, parked (in that order)."""
        return (self.group_leases, self.group_owners, self.group_parked)

    def dedup(self, job_id: str) -> str:
        return f"{self.base}:dedup:{digest(job_id)}"

    def logs(self, job_id: str) -> str:
        return f"{self.base}:logs:{digest(job_id)}"

    def result(self, job_id: str) -> str:
        """The retained outcome record (a hash) of one job id."""
        return f"{self.base}:result:{digest(job_id)}"

    # -- flows and batches (jobs/flows.py, jobs/batches.py) ----------------------------------
    # The completion scripts derive these names from the ready key (scripts/lib/coordination.lua):
    # keep the two in step. SHA-1 because it is what Lua (redis.sha1hex) can compute.
    def flow(self, flow_id: str) -> str:
        """The state (a string) of one flow."""
        return f"{self.base}:flow:{_sha1(flow_id)}"

    def batch(self, batch_id: str) -> str:
        """The state (a string) of one batch."""
        return f"{self.base}:batch:{_sha1(batch_id)}"

    @property
    def coordinated(self) -> str:
        """Marker: the queue has (had) flows or batches, so completions read entry bodies."""
        return f"{self.base}:coordinated"

    def custom(self, suffix: str) -> str:
        """A caller-chosen key inside this queue's slot (e.g. a dead-letter override)."""
        return f"{self.base}:{suffix}"

    # -- recurring schedules (jobs/recurring.py) -------------------------------------------
    @property
    def recurring(self) -> str:
        """Definition hash of the recurring schedules (field = schedule id)."""
        return f"{self.base}:recurring"

    @property
    def recurring_due(self) -> str:
        """Due index of the recurring schedules (sorted set, score = next due unix ms)."""
        return f"{self.base}:recurring-due"

    @property
    def recurring_order(self) -> str:
        """Visiting order of the recurring schedules (sorted set, all scores 0, by id)."""
        return f"{self.base}:recurring-order"

    @property
    def recurring_cursor(self) -> str:
        """The shared round-robin cursor of scheduling passes (the last visited id)."""
        return f"{self.base}:recurring-cursor"


@dataclass(frozen=True, slots=True)
class ReliableQueueKeys:
    """Key names of one reliable message queue (or one topic subscription)."""

    name: str
    prefix: str = ""
    kind: str = "queue"

    def __post_init__(self) -> None:
        validate_name(self.name)
        validate_key_prefix(self.prefix)

    @property
    def base(self) -> str:
        return f"{self.prefix}{{respire-{self.kind}:{self.name}}}"

    @property
    def stream(self) -> str:
        return f"{self.base}:stream"

    @property
    def deadlines(self) -> str:
        return f"{self.base}:deadlines"

    @property
    def dead(self) -> str:
        return f"{self.base}:dead"

    @property
    def meta(self) -> str:
        return f"{self.base}:meta"

    @property
    def receipts(self) -> str:
        """Per-delivery receipt hash (entry id -> delivery count and fence)."""
        return f"{self.base}:receipts"

    def dedup(self, dedup_id: str) -> str:
        return f"{self.base}:dedup:{digest(dedup_id)}"

    def subscription(self, subscription: str, part: str) -> str:
        """A key of one topic subscription (``kind="topic"``): ``:sub:<subscription>:<part>``.

        ``part`` is ``deadlines``, ``receipts`` or ``dead``; no two (subscription, part) pairs
        can produce the same key, since no part name is a ``:``-suffix of another.
        """
        validate_name(subscription, what="subscription name")
        if part not in ("deadlines", "receipts", "dead"):
            raise ValueError(f"unknown subscription key part {part!r}")
        return f"{self.base}:sub:{subscription}:{part}"

    def custom(self, suffix: str) -> str:
        return f"{self.base}:{suffix}"
