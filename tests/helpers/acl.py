"""Temporary ACL users for tests: create, log in, read the ACL log, delete.

User names must be unique (build them from ``unique_name``): servers are shared.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from respire_actors.redis.client import RedisClient, connect


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@asynccontextmanager
async def acl_user(
    admin: RedisClient, url: str, user: str, rules: Sequence[str], **options: Any
) -> AsyncIterator[RedisClient]:
    """Create ``user`` with ``rules`` (after ``reset on >password``), yield an entered client
    logged in as it, and delete the user afterwards."""
    password = f"pw-{user}"
    await admin.execute("ACL", "SETUSER", user, "reset", "on", f">{password}", *rules)
    try:
        async with connect(url, username=user, password=password, **options) as client:
            yield client
    finally:
        await admin.execute("ACL", "DELUSER", user)


async def acl_denials(admin: RedisClient, user: str) -> list[tuple[str, str, str]]:
    """(reason, context, object) of every ACL log entry of ``user`` (the server keeps the
    newest 128 entries)."""
    entries = await admin.execute("ACL", "LOG", 128)
    found = []
    for entry in entries or []:
        fields = {_text(k): v for k, v in entry.items()}
        if _text(fields.get("username", "")) == user:
            found.append(
                (_text(fields["reason"]), _text(fields["context"]), _text(fields["object"]))
            )
    return found


async def key_dump(admin: RedisClient, pattern: str) -> dict[bytes, bytes]:
    """Every key matching ``pattern`` with its DUMP: two equal dumps mean nothing was written."""
    found: dict[bytes, bytes] = {}
    cursor: object = b"0"
    while True:
        cursor, keys = await admin.execute("SCAN", cursor, "MATCH", pattern, "COUNT", 10000)
        for key in keys:
            found[bytes(key)] = bytes(await admin.execute("DUMP", key) or b"")
        if _text(cursor) == "0":
            return found
