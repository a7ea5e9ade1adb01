"""Which arguments of a raw command are keys (for Redis Cluster routing).

:class:`~respire_actors.redis.client.RedisClient` sends raw argument lists; on a cluster each
command goes to the node that owns the hash slot of its first key. The positions follow the key
specifications of ``COMMAND INFO`` for the commands that take keys anywhere but the first
argument; every other command not known to be keyless is routed by its first argument. A key
missed here still reaches the right node when the first key decides, and the server itself
refuses cross-slot arguments (``CROSSSLOT``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Commands with no key at all (administration, connection, server-wide).
_KEYLESS = frozenset(
    b"""ACL ASKING AUTH BGREWRITEAOF BGSAVE CLIENT CLUSTER COMMAND CONFIG DBSIZE DEBUG DISCARD
    ECHO EXEC FAILOVER FLUSHALL FLUSHDB FUNCTION HELLO INFO KEYS LASTSAVE LATENCY LOLWUT MODULE
    MONITOR MULTI PING PSUBSCRIBE PSYNC PUBLISH PUBSUB PUNSUBSCRIBE QUIT RANDOMKEY READONLY
    READWRITE REPLICAOF RESET ROLE SAVE SCAN SCRIPT SELECT SHUTDOWN SLAVEOF SLOWLOG SUBSCRIBE
    SWAPDB SYNC TIME UNSUBSCRIBE UNWATCH WAIT WAITAOF""".split()
)
# Every argument is a key.
_ALL_KEYS = frozenset(
    b"""DEL EXISTS MGET PFCOUNT PFMERGE SDIFF SDIFFSTORE SINTER SINTERSTORE SUNION SUNIONSTORE
    TOUCH UNLINK WATCH""".split()
)
# Keys and values alternate.
_PAIRS = frozenset({b"MSET", b"MSETNX"})
# Every argument but the last (a timeout) is a key.
_ALL_BUT_LAST = frozenset({b"BLPOP", b"BRPOP", b"BZPOPMIN", b"BZPOPMAX"})
# Source and destination keys.
_TWO_KEYS = frozenset(
    b"""BLMOVE BRPOPLPUSH COPY GEOSEARCHSTORE LCS LMOVE RENAME RENAMENX RPOPLPUSH SMOVE
    ZRANGESTORE""".split()
)
# A key count at this argument index (0 = first argument), the keys right after it.
_NUMKEYS_AT = {
    b"EVAL": 1,
    b"EVALSHA": 1,
    b"EVAL_RO": 1,
    b"EVALSHA_RO": 1,
    b"FCALL": 1,
    b"FCALL_RO": 1,
    b"SINTERCARD": 0,
    b"ZDIFF": 0,
    b"ZINTER": 0,
    b"ZINTERCARD": 0,
    b"ZUNION": 0,
    b"LMPOP": 0,
    b"ZMPOP": 0,
    b"BLMPOP": 1,
    b"BZMPOP": 1,
}
# A destination key, then a key count, then the keys.
_DEST_NUMKEYS = frozenset({b"ZDIFFSTORE", b"ZINTERSTORE", b"ZUNIONSTORE"})
# The key follows a subcommand (``XGROUP CREATE key ...``); HELP forms have none.
_SUBCOMMAND_KEY = frozenset({b"XGROUP", b"XINFO", b"OBJECT"})


def _upper(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value.upper()
    return str(value).upper().encode()


def _count(value: Any) -> int:
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0  # the server will refuse the command with a clear error


def key_indices(name: bytes, args: Sequence[Any]) -> list[int]:
    """Indices (into ``args``, the arguments after the command name) that hold keys."""
    n = len(args)
    if name in _KEYLESS or n == 0:
        return []
    if name in _ALL_KEYS:
        return list(range(n))
    if name in _PAIRS:
        return list(range(0, n, 2))
    if name in _ALL_BUT_LAST:
        return list(range(n - 1))
    if name in _TWO_KEYS:
        return list(range(min(2, n)))
    if name in _NUMKEYS_AT:
        at = _NUMKEYS_AT[name]
        if at >= n:
            return []
        return list(range(at + 1, min(n, at + 1 + _count(args[at]))))
    if name in _DEST_NUMKEYS:
        if n < 2:
            return [0]
        return [0, *range(2, min(n, 2 + _count(args[1])))]
    if name in {b"XREAD", b"XREADGROUP"}:
        for i, arg in enumerate(args):
            if _upper(arg) == b"STREAMS":
                rest = n - i - 1
                return list(range(i + 1, i + 1 + rest // 2))
        return []
    if name == b"BITOP":
        return list(range(1, n))
    if name in _SUBCOMMAND_KEY:
        return [1] if n > 1 and _upper(args[0]) != b"HELP" else []
    if name == b"MEMORY":
        return [1] if n > 1 and _upper(args[0]) == b"USAGE" else []
    if name == b"MIGRATE":
        if n > 2 and args[2] not in (b"", ""):
            return [2]
        for i, arg in enumerate(args):
            if _upper(arg) == b"KEYS":
                return list(range(i + 1, n))
        return []
    return [0]
