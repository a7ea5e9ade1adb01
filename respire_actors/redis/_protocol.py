"""RESP on the wire: command encoding, reply parsing (hiredis), hash slots, command classes.

Commands are encoded with ``hiredis.pack_command`` (C) and replies parsed with
``hiredis.Reader`` (C, RESP2 and RESP3). Error replies come back as :class:`ReplyError`
*values* (not raised), so one bad command in a pipeline never disturbs the others; they are
mapped to typed errors by :func:`respire_actors.redis.client.map_error`. RESP3 push frames
come back as :class:`PushNotification` (a ``list`` subclass) and are never a command's reply.
"""

from __future__ import annotations

import binascii
from collections.abc import Iterable, Sequence

import hiredis
from hiredis import ProtocolError, PushNotification, ReplyError

Arg = str | bytes | int | float

CLUSTER_SLOTS = 16384


def encode(args: Sequence[Arg]) -> bytes:
    """One command as RESP bytes (an array of bulk strings)."""
    packed: bytes = hiredis.pack_command(tuple(args))  # type: ignore[arg-type]
    return packed


def encode_many(commands: Iterable[Sequence[Arg]]) -> bytes:
    return b"".join(hiredis.pack_command(tuple(c)) for c in commands)  # type: ignore[arg-type]


def new_reader() -> hiredis.Reader:
    """A reply parser: ``gets()`` returns False when it needs more bytes."""
    return hiredis.Reader(notEnoughData=False)


_NAMES: dict[Arg, bytes] = {}


def command_name(value: Arg) -> bytes:
    """The upper-case command name (cached: the same few names are sent all the time)."""
    name = _NAMES.get(value)
    if name is None:
        name = value.upper() if isinstance(value, bytes) else str(value).upper().encode()
        if len(_NAMES) < 512:
            _NAMES[value] = name
    return name


def key_slot(key: Arg) -> int:
    """The Redis Cluster slot of ``key``: CRC16 (XMODEM) of its hash tag, mod 16384."""
    data = key if isinstance(key, bytes) else str(key).encode()
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    return binascii.crc_hqx(data, 0) % CLUSTER_SLOTS


# Commands that block the connection they run on: they need a dedicated connection, or every
# other task's reply would queue behind them.
_BLOCKING = frozenset(
    b"""BLPOP BRPOP BRPOPLPUSH BLMOVE BLMPOP BZPOPMIN BZPOPMAX BZMPOP WAIT WAITAOF""".split()
)
# Commands that change the state of the connection they run on (or its reply stream): they
# cannot run on a connection shared by many tasks.
STATEFUL = frozenset(
    b"""AUTH HELLO SELECT MULTI EXEC DISCARD WATCH UNWATCH SUBSCRIBE PSUBSCRIBE SSUBSCRIBE
    UNSUBSCRIBE PUNSUBSCRIBE SUNSUBSCRIBE MONITOR RESET QUIT SYNC PSYNC READONLY READWRITE
    ASKING""".split()
)


def is_blocking(name: bytes, args: Sequence[Arg]) -> bool:
    """True for commands that may block their connection (``XREAD ... BLOCK`` included)."""
    if name in _BLOCKING:
        return True
    if name in (b"XREAD", b"XREADGROUP"):
        return any(command_name(a) == b"BLOCK" for a in args if isinstance(a, str | bytes))
    return False


def is_stateful(name: bytes, args: Sequence[Arg]) -> bool:
    if name in STATEFUL:
        return True
    return name == b"CLIENT" and bool(args) and command_name(args[0]) == b"REPLY"


__all__ = [
    "CLUSTER_SLOTS",
    "Arg",
    "ProtocolError",
    "PushNotification",
    "ReplyError",
    "command_name",
    "encode",
    "encode_many",
    "is_blocking",
    "is_stateful",
    "key_slot",
    "new_reader",
]
