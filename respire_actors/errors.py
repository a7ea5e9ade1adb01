"""Every exception respire_actors raises, in one tree.

::

    RespireError
    ├── ValidationError (also ValueError)   bad input, raised before anything is sent to Redis
    │   ├── InvalidSchedule                 a recurring schedule that can never run as asked
    │   ├── ResultTooLarge                  a flow node's result (Job.complete) is over 4 KiB
    │   └── CodecError                      (codecs) a payload could not be encoded or decoded
    │       ├── EncodeError                 a value could not be serialised; nothing was sent
    │       │   └── PayloadTooLarge         over the client's max_payload_bytes; nothing was sent
    │       └── DecodeError                 stored bytes are not a valid payload
    ├── ConfigurationError                  a setting that cannot work (bad URL, mismatched policy)
    │   ├── CredentialsRefused (also RedisUnavailable)  the server refused user / password
    │   ├── ConsumerGroupMissing            a queue's consumer group vanished (never recreated at 0)
    │   └── PartitionCountMismatch          a partitioned queue's count differs from the stored one
    ├── RedisUnavailable                    cannot reach the server, or the connection dropped
    │   ├── CommandTimeout (also TimeoutError)  no reply within the command timeout
    │   └── ClusterReconfiguring            a slot is migrating / the cluster is down for it;
    │                                       the command did NOT run (safe to repeat)
    ├── UnsupportedServer                   the server is older than Redis 7.0
    ├── QueueFull                           the queue's backlog bound is reached; nothing was
    │                                       enqueued (the command did not run its writes)
    ├── FlowError                           a parent/child job flow operation was refused
    │   ├── InvalidFlow (also ValidationError)  a tree or flow argument refused before sending
    │   │   ├── FlowCycle                   a node is its own ancestor
    │   │   ├── FlowSharedNode              one node object appears under two parents
    │   │   ├── FlowDuplicateJob            two nodes of one tree have the same job id
    │   │   └── FlowTooLarge                over 256 nodes or over the size limits
    │   ├── FlowActive                      remove_flow while a node is waiting or ready
    │   └── FlowNotFound                    a handler asked for child results of a removed flow
    ├── JobResultError                      a job's retained result cannot be returned
    │   ├── JobResultTimeout (also TimeoutError)  no outcome within ``queue.result``'s timeout
    │   ├── JobDeadLettered                 the job ended in the dead-letter stream
    │   └── JobResultUnavailable            the job completed but no value was retained
    ├── BatchError                          a batch operation was refused (docs/batches.md)
    │   ├── UnknownBatch                    no batch with that id (never created, or removed)
    │   ├── BatchSealed                     a new member for a sealed (or cancelled) batch
    │   ├── BatchActive                     removal of a batch that has not completed
    │   └── BatchLimitExceeded (also ValidationError)  over 256 members or 256 KiB of data
    ├── ServerError                         the server refused a command
    │   ├── ServerLoading                   the server is still loading its data set (LOADING)
    │   ├── PermissionDenied                ACL refused a command (NOPERM or our preflight)
    │   ├── WrongKeyType                    a key holds another type than the queue expects
    │   ├── ScriptError                     a Lua script reported a broken invariant
    │   ├── UnsupportedSchema               flow or batch state of an unknown schema version
    │   └── TransactionAborted              WATCH saw a change; nothing in the transaction ran
    └── EmbeddedServerError                 the embedded valkey-server could not start or stopped

Server error replies and transport failures are mapped to this tree in
``respire_actors.redis.client`` and nowhere else. A ``ServerError`` keeps the server's code
(``WRONGTYPE``, ``NOPERM``, ``RESPIRE_STALE``...) in :attr:`ServerError.code`.
"""

from __future__ import annotations


class RespireError(Exception):
    """Base class of every error raised by respire_actors."""

    partial_results: list[object] | None = None
    """Set on the error a many-call raises (``JobQueue.enqueue_many``,
    ``JobQueue.enqueue_scheduled_many``, ``PartitionedJobQueue.enqueue_many``): one entry per
    job of the call, in input order: its ``EnqueueResult`` (enqueued or deduplicated), the
    exception that job got (``QueueFull``, ``WrongKeyType``...), or ``None`` when it was never
    sent (a connection lost on an earlier round trip stops the call). The error raised is the
    first one. ``None`` on every other error."""


class ValidationError(RespireError, ValueError):
    """An argument is invalid. Raised before any command is sent, so nothing was written."""


class ConfigurationError(RespireError):
    """A setting cannot work: a malformed Redis URL, a policy that disagrees with Redis, ..."""


class ConsumerGroupMissing(ConfigurationError):
    """The consumer group of a queue (or stream) that already had one is gone: someone deleted
    it (``XGROUP DESTROY``, a key rewrite, a restore of an older snapshot) under or between
    running workers.

    Recreating it at ``0`` would run every retained, already acknowledged entry again, so
    workers stop instead. Find out why the group vanished; then either recreate it yourself at
    the right id (``XGROUP CREATE <stream> <group> <id>``) or start the worker with
    ``WorkerOptions(recreate_missing_group="$")`` (only entries added from now on) or an
    explicit entry id. ``stream`` and ``group`` name what is missing.
    """

    def __init__(self, message: str, *, stream: str = "", group: str = "") -> None:
        super().__init__(message)
        self.stream = stream
        self.group = group


class PartitionCountMismatch(ConfigurationError):
    """A producer or worker uses a partitioned job queue with another partition count than the
    one recorded in Redis (``{respire-job:<name>}:partitions``): routing would send jobs to
    partitions the other side does not read, so nothing is sent. Changing the count is a
    migration (docs/partitions.md)."""

    def __init__(self, message: str, *, queue: str, configured: int, stored: int) -> None:
        super().__init__(message)
        self.queue = queue
        self.configured = configured
        self.stored = stored


class _Unset:
    """No value given (the class's own ``ran`` applies)."""


_UNSET = _Unset()


class RedisUnavailable(RespireError):
    """The server could not be reached, or the connection broke mid-command.

    ``ran`` tells what is known of the command: ``False`` when it certainly did not run
    (nothing was sent: the connection could not be opened or its handshake failed, the client
    was closed, a cluster slot was migrating or down), ``None`` when it may have run (the
    connection broke or timed out after the command was written). A command that may have run
    is retried only if it is safe to repeat (every respire_actors transition is; a job enqueue
    with the same id is deduplicated).
    """

    ran: bool | None = None

    def __init__(self, *args: object, ran: bool | _Unset | None = _UNSET) -> None:
        super().__init__(*args)
        if not isinstance(ran, _Unset):
            self.ran = ran


class CommandTimeout(RedisUnavailable, TimeoutError):
    """No reply arrived within the command timeout. The command may still have run."""


class CredentialsRefused(ConfigurationError, RedisUnavailable):
    """The server refused the connection's credentials (``WRONGPASS`` / ``NOAUTH``). Both a
    :class:`ConfigurationError` (a client that cannot connect at all fails with it, naming what
    to check) and a :class:`RedisUnavailable`: a running worker whose reconnects are refused
    for a while (a password rotated on the server before the credential provider caught up)
    waits and retries like during any outage, instead of dropping the outcomes in flight."""

    ran = False


class ClusterReconfiguring(RedisUnavailable):
    """The cluster could not serve the command's slot right now and the command did **not**
    run: the slot is being migrated (``TRYAGAIN``: a multi-key command during resharding), the
    cluster is down for it (``CLUSTERDOWN``), or redirections kept pointing elsewhere. The client
    retries such replies for ``ConnectionSettings.cluster_retry_timeout`` before raising this;
    the runtime's actors wait it out with backoff. A producer may repeat the call as is.

    Also raised, without retrying, when a script reaches a key it derives from its declared
    ones (flow or batch state, metrics) that the migrating node no longer holds ("attempted to
    access a non local key"): respire_actors' scripts reach such keys before their first
    write, except a completion of several jobs, whose jobs before that key stay committed (a
    repeat reports them stale); repeating the call is safe. ``ran`` is None in that case (a
    script is not rolled back), else False."""

    ran: bool | None = False


class QueueFull(RespireError):
    """A job queue's backlog bound (:meth:`JobQueue.set_max_backlog`) refused an enqueue:
    ``backlog`` jobs are accepted and not finished, the bound is ``limit``, and the call would
    have added ``adding`` (1, or the nodes of a flow). The script refused before its first
    write, so **nothing** was enqueued (``ran`` is False): repeat the call later, or pass
    ``wait=`` to the enqueue to retry with backoff until the backlog drains. Raised only for new
    jobs; a deduplicated repeat of an accepted job id succeeds even when the queue is full."""

    ran = False

    def __init__(self, message: str, backlog: int = 0, limit: int = 0, adding: int = 1) -> None:
        super().__init__(message)
        self.backlog = backlog
        self.limit = limit
        self.adding = adding


class UnsupportedServer(RespireError):
    """The server is older than the minimum supported version (Redis 7.0)."""


class ServerError(RespireError):
    """The server answered with an error.

    ``code`` is the first word of the server's message (for example ``WRONGTYPE`` or
    ``RESPIRE_STALE``); ``detail`` is the rest.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        code, _, detail = message.partition(" ")
        self.code = code if code.isupper() else ""
        self.detail = detail if self.code else message


class ServerLoading(ServerError, RedisUnavailable):
    """The server answered ``LOADING``: it is still reading its data set into memory (after a
    restart) and ran nothing. Both a :class:`ServerError` (the reply's code is ``LOADING``) and
    a :class:`RedisUnavailable` with ``ran = False``: code that waits out an outage waits this
    out too, and a retry after a short wait is always safe (start-up waits for it to finish)."""

    ran = False


class PermissionDenied(ServerError):
    """An ACL rule refused a command the operation needs. Grant it (see docs/security.md) and
    retry. Raised for ``NOPERM`` replies, for a script's own preflight (``RESPIRE_NOPERM``:
    nothing was written) and for a command refused inside a script.

    ``command`` is the refused command in lower case (``"type"``, ``"xgroup|create"``) when the
    server's text names it or, for Redis 7.0's text for a command refused inside a script
    (which names only the script and line), when that line of the script calls one command;
    else ``""`` (a refused key).
    """

    def __init__(self, message: str, command: str = "") -> None:
        super().__init__(message)
        self.command = command


class WrongKeyType(ServerError):
    """A key holds a different type than the queue expects. Reserve the queue's namespace."""


class ScriptError(ServerError):
    """A Lua script stopped on a broken invariant; it wrote nothing (scripts preflight first)."""


class TransactionAborted(ServerError):
    """A watched key changed before EXEC, so the transaction ran nothing. Retry it."""

    def __init__(self, message: str = "watched key changed; transaction discarded") -> None:
        super().__init__(message)


class JobResultError(RespireError):
    """Base of the errors :meth:`JobQueue.result <respire_actors.jobs.JobQueue.result>` raises
    for a job whose value cannot be returned. ``job_id`` names the job."""

    def __init__(self, message: str, job_id: str) -> None:
        super().__init__(message)
        self.job_id = job_id


class JobResultTimeout(JobResultError, TimeoutError):
    """No completed or dead-lettered outcome was seen within the timeout. The job may still be
    waiting, running, or retrying; waiting again is safe."""


class JobDeadLettered(JobResultError):
    """The job was dead-lettered. ``reason`` is its dead-letter reason (``explicit``,
    ``nack``, ``processing-failed`` or ``delivery-limit``), ``detail`` the handler's free text
    (empty when none)."""

    def __init__(self, message: str, job_id: str, reason: str, detail: str = "") -> None:
        super().__init__(message, job_id)
        self.reason = reason
        self.detail = detail


class JobResultUnavailable(JobResultError):
    """The job finished, but no value can be returned: the worker does not keep results, the
    retained record expired, the value was not stored, or the job was a batch member cancelled
    with its batch (``problem`` says why: ``"result-too-large"``, ``"result-unencodable"``,
    ``"not-retained"``, ``"cancelled"``)."""

    def __init__(self, message: str, job_id: str, problem: str) -> None:
        super().__init__(message, job_id)
        self.problem = problem


class ResultTooLarge(ValidationError):
    """A flow node's result (:meth:`Job.complete`) is over 4096 bytes. Raised in the handler,
    before anything is sent; the handler's failure then takes the nack path."""


class UnsupportedSchema(ServerError):
    """Redis holds flow or batch state written by a schema version this release does not know
    (``RESPIRE_SCHEMA``). Nothing was changed; upgrade the workers and clients, or remove the
    state with the release that wrote it."""


class EmbeddedServerError(RespireError):
    """The embedded valkey-server could not be started, or exited unexpectedly."""


class InvalidSchedule(ValidationError):
    """A recurring schedule was refused before anything was sent: not exactly one of interval
    and cron, an interval that is not a positive whole number of milliseconds, a cron
    expression that is not five UTC fields, or one with no future occurrence."""


class BatchError(RespireError):
    """Base of the errors batch operations raise (see docs/batches.md). ``batch_id`` names the
    batch. Nothing was written when one is raised."""

    def __init__(self, message: str, batch_id: str) -> None:
        super().__init__(message)
        self.batch_id = batch_id


class UnknownBatch(BatchError):
    """No batch with this id exists: it was never created, or it was removed."""


class BatchSealed(BatchError):
    """A new member was added to a sealed (or cancelled) batch. Adding an existing member is
    not an error: it returns False."""


class BatchActive(BatchError):
    """The batch cannot be removed: it has pending members, or it is not sealed yet."""


class BatchLimitExceeded(BatchError, ValidationError):
    """A batch would exceed a limit: ``limit`` is ``"members"`` (256 members) or ``"bytes"``
    (256 KiB of member and callback ids and serialized payloads). Raised before anything is
    sent when the call's own arguments exceed it, else by the script, which wrote nothing."""

    def __init__(self, message: str, batch_id: str, limit: str) -> None:
        super().__init__(message, batch_id)
        self.limit = limit


class FlowError(RespireError):
    """Base of the errors of parent/child job flows (see docs/flows.md)."""


class InvalidFlow(FlowError, ValidationError):
    """A flow tree or argument was refused before anything was sent to Redis: a bad flow id,
    job id, failure policy or node, or a node that belongs to another queue. The subclasses
    name the shape and size problems."""


class FlowCycle(InvalidFlow):
    """A node of the tree is its own ancestor (a child list leads back up the tree)."""


class FlowSharedNode(InvalidFlow):
    """The same node object is the child of two parents; a flow must be a tree."""


class FlowDuplicateJob(InvalidFlow):
    """Two nodes of one tree carry the same job id (ids are unique within a tree)."""


class FlowTooLarge(InvalidFlow):
    """The tree has more than 256 nodes, its job ids and encoded payloads exceed 256 KiB, or a
    result exceeds 4 KiB."""


class FlowActive(FlowError):
    """``remove_flow`` was refused because a node is still waiting or ready; nothing was
    deleted. Remove a flow once every node completed or failed."""


class FlowNotFound(FlowError):
    """A flow node's handler asked for its children's results, but the flow's state is gone
    (it was removed, e.g. while a dead-lettered node was replayed)."""
