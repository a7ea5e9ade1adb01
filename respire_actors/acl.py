"""Least-privilege ACL rules for each role that uses a job queue (docs/security.md).

Each role gets the commands its whole path runs (in Python and inside the scripts, whose
preflight checks them with ``redis.acl_check_cmd`` before writing), the keys of the queues it
serves and no Pub/Sub channels. The lists were measured by running every role's path on Redis
7.0 and Valkey 9 and are checked by ``tests/respire_actors/security``: a user holding exactly
these rules runs its role, and one missing any command fails before writing anything with
:class:`~respire_actors.errors.PermissionDenied` naming it.

Connecting needs no command of its own: the server, version, mode and role come from the
handshake (``HELLO``, always allowed). ``COMMAND INFO`` discovers optional commands; every role
is granted it so that nothing lands in the ACL log, but a user denied it still connects (the
optional commands then count as absent).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from .errors import ValidationError
from .keys import job_queue_key_pattern, queue_registry_pattern

Role = Literal["producer", "worker", "scheduler", "observer", "operator"]

ROLES: tuple[Role, ...] = ("producer", "worker", "scheduler", "observer", "operator")

CONNECT_COMMANDS: tuple[str, ...] = ("command|info",)
"""What connecting sends beyond the handshake (optional: a denial is tolerated)."""

_SCRIPTS = ("evalsha", "eval")

ROLE_COMMANDS: Mapping[Role, tuple[str, ...]] = {
    # enqueue, enqueue_many, enqueue_scheduled(_many) (delays, priorities, TTLs, groups), the
    # transactional *_in variants (MULTI/EXEC), enqueue_flow, and batches (create_batch,
    # add_to_batch, add_many_to_batch, seal_batch); the backlog bound's check (HGET, and
    # under a bound XLEN, XINFO GROUPS, XRANGE)
    "producer": (
        *_SCRIPTS,
        "multi",
        "exec",
        "type",
        "exists",
        "time",
        "get",
        "set",
        "xadd",
        "xdel",
        "zadd",
        "zrem",
        "zscore",
        "hget",
        "hdel",
        "hincrby",
        "xlen",
        "xinfo|groups",
        "xrange",
    ),
    # a Worker registration with QueueOptions (promotion, durable retries, rate limit,
    # metrics, deletion of acknowledged entries), groups, the recurring ticker, kept results,
    # the lease renewer, recovery, the consumer sweeper and the retention keeper (which also
    # adds the queue to the queue registry)
    "worker": (
        *_SCRIPTS,
        "type",
        "exists",
        "time",
        "get",
        "set",
        "del",
        "pexpire",
        "pexpireat",
        "pexpiretime",
        "rpush",
        "ltrim",
        "hget",
        "hmget",
        "hset",
        "hdel",
        "hexists",
        "hincrby",
        "zadd",
        "zrem",
        "zscore",
        "zrange",
        "zrangebyscore",
        "zrangebylex",
        "zlexcount",
        "xadd",
        "xdel",
        "xack",
        "xrange",
        "xrevrange",
        "xread",
        "xreadgroup",
        "xpending",
        "xclaim",
        "xautoclaim",
        "xgroup|create",
        "xgroup|delconsumer",
        "xinfo|groups",
        "xinfo|consumers",
        "xlen",
        "xtrim",
        "sadd",
    ),
    # RecurringScheduler: upsert, get, list, remove
    "scheduler": (
        *_SCRIPTS,
        "type",
        "hget",
        "hset",
        "hdel",
        "zadd",
        "zrem",
        "zscore",
        "zrangebylex",
    ),
    # read_events, get_state, get_logs, status, result, read_metrics, flow_results,
    # batch_status; backlog() (a plain queue's exact count reads the group's lag or, when the
    # server does not know it, counts the entries; a partitioned queue's is XLEN per partition)
    "observer": (
        *_SCRIPTS,
        "type",
        "time",
        "get",
        "hget",
        "hmget",
        "hgetall",
        "lrange",
        "xread",
        "xrange",
        "xrevrange",
        "xlen",
        "xinfo|groups",
    ),
    # pause / resume, set_rate_limit, group options and pause, get_group, list_groups,
    # read_dead_letters, get_state; the operator API (respire_actors.admin) and the operator
    # commands of the CLI: queue registry, summaries, pending / scheduled / dead-letter pages,
    # job detail, dead-letter retry and removal, safe trims; flows and batches: flow_results,
    # remove_flow, batch_status, cancel_batch, remove_batch; events --follow (XREAD)
    "operator": (
        *_SCRIPTS,
        "type",
        "time",
        "get",
        "set",
        "del",
        "hget",
        "hmget",
        "hset",
        "hdel",
        "zadd",
        "zrem",
        "zscore",
        "zrange",
        "zrangebylex",
        "zlexcount",
        "xadd",
        "xrange",
        "exists",
        "lrange",
        "zcard",
        "zrank",
        "zcount",
        "xlen",
        "xdel",
        "xtrim",
        "xrevrange",
        "xpending",
        "xinfo|groups",
        "smembers",
        "sadd",
        "srem",
        "xread",
    ),
}

REGISTRY_ROLES: frozenset[Role] = frozenset({"worker", "operator"})
"""Roles that also get the queue registry key (workers register their queues, operators list
them)."""


def acl_rules(
    role: Role, queues: tuple[str, ...] | None = None, *, key_prefix: str = ""
) -> list[str]:
    """The ``ACL SETUSER`` rules of ``role`` for ``queues`` (None: every job queue).

    Start from nothing (``resetkeys resetchannels -@all``), then allow the role's commands and
    the queues' keys. Add the user's own ``on >password``::

        await admin.execute("ACL", "SETUSER", "mailer", "on", ">secret", *acl_rules("worker"))

    On Redis 8.2+ workers may also be granted ``+xackdel`` (used when present and allowed).
    Raises :class:`ValidationError` for an unknown role or a bad queue name.
    """
    if role not in ROLE_COMMANDS:
        raise ValidationError(f"unknown role {role!r}; one of {', '.join(ROLES)}")
    if queues is not None and not queues:
        raise ValidationError("queues must name at least one queue (None: every queue)")
    patterns = ["~" + job_queue_key_pattern(q, key_prefix) for q in (queues if queues else (None,))]
    if role in REGISTRY_ROLES:
        patterns.append("~" + queue_registry_pattern(key_prefix))
    commands = [*CONNECT_COMMANDS, *ROLE_COMMANDS[role]]
    return ["resetkeys", "resetchannels", "-@all", *patterns, *(f"+{c}" for c in commands)]


__all__ = ["CONNECT_COMMANDS", "REGISTRY_ROLES", "ROLES", "ROLE_COMMANDS", "Role", "acl_rules"]
