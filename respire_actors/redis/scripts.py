"""Lua scripts shipped as package files, loaded once and run by SHA.

Scripts live in ``respire_actors/scripts/<name>-<number of keys>.lua``. A line
``--!include lib/<helper>.lua`` is replaced by that helper's text (cycles are an error), and
the included top-level helpers the script cannot reach are then dropped
(:mod:`respire_actors.redis.lua_prune`): Lua defines every one of them again on every call.
A script runs by EVALSHA; a ``NOSCRIPT`` reply (the server lost its cache, or failed over)
is answered with a full EVAL, which is safe because NOSCRIPT means nothing ran. Inside
MULTI/EXEC a script is always queued as a full EVAL so a cache miss cannot abort the
transaction half-way.

Scripts report expected outcomes as return values and broken invariants as error replies
whose first word starts with ``RESPIRE_``; :func:`respire_actors.redis.client.map_error`
turns those into typed exceptions.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from functools import cache
from importlib import resources
from typing import Any

from ..errors import ServerError
from .client import Arg, Pending, RedisClient, Transaction
from .lua_prune import prune
from .script_lines import register

_INCLUDE = re.compile(r"^--!include\s+(\S+)\s*$", re.MULTILINE)
_NAME = re.compile(r"^(?P<name>[a-z0-9_]+)-(?P<keys>\d+)\.lua$")


class Script:
    """One Lua script: its name, the number of keys it takes, its source and SHA-1.

    A script from :func:`load` reads, resolves and prunes its file on first use, not at
    import: a process (a CLI command, say) pays only for the scripts it runs."""

    __slots__ = ("_file", "_sha", "_source", "name", "numkeys")

    def __init__(
        self,
        name: str,
        numkeys: int,
        source: str | None = None,
        sha: str | None = None,
        *,
        file: str | None = None,
    ) -> None:
        if source is None and file is None:
            raise ValueError("a Script needs its source or its file")
        self.name = name
        self.numkeys = numkeys
        self._source = source
        self._sha = sha
        self._file = file

    @property
    def source(self) -> str:
        if self._source is None:
            self._materialise()
        assert self._source is not None
        return self._source

    @property
    def sha(self) -> str:
        if self._sha is None:
            self._materialise()
        assert self._sha is not None
        return self._sha

    def _materialise(self) -> None:
        source = self._source
        if source is None:
            assert self._file is not None
            source = prune(_resolve(self._file, ()))
        sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
        register(sha, source)
        self._source, self._sha = source, sha

    def __repr__(self) -> str:
        return f"Script({self.name!r}, {self.numkeys})"

    def _check(self, keys: Sequence[str]) -> None:
        if len(keys) != self.numkeys:
            raise TypeError(f"script {self.name} takes {self.numkeys} keys, got {len(keys)}")

    def evalsha_args(self, keys: Sequence[str], args: Sequence[Arg]) -> tuple[Arg, ...]:
        self._check(keys)
        return ("EVALSHA", self.sha, self.numkeys, *keys, *args)

    def eval_args(self, keys: Sequence[str], args: Sequence[Arg]) -> tuple[Arg, ...]:
        self._check(keys)
        return ("EVAL", self.source, self.numkeys, *keys, *args)

    async def __call__(self, client: RedisClient, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        """Run the script (EVALSHA, then EVAL on NOSCRIPT). Raises mapped errors.

        If cancelled, the script may still run on the server; every respire_actors script is
        written so that running it again is harmless.
        """
        try:
            return await client.execute(*self.evalsha_args(keys, args))
        except ServerError as exc:
            if exc.code != "NOSCRIPT":
                raise
        return await client.execute(*self.eval_args(keys, args))

    def queue_in(
        self,
        tx: Transaction,
        keys: Sequence[str],
        args: Sequence[Arg],
        convert: Any = None,
        on_done: Any = None,
    ) -> Pending[Any]:
        """Queue the script in a transaction, as a full EVAL."""
        return tx.queue(*self.eval_args(keys, args), convert=convert, on_done=on_done)


async def run_many(
    client: RedisClient,
    calls: Sequence[tuple[Script, Sequence[str], Sequence[Arg]]],
    *,
    per_node_errors: bool = False,
) -> list[Any]:
    """Run many script calls in one pipelined round trip (not atomic as a whole).

    Returns each reply, or the mapped exception for that call. Calls answered NOSCRIPT did not
    run and are sent again: the first of each script per node as a full EVAL (which loads it
    there), the others after it as EVALSHA, so a page of 500 calls of a script the server
    lost sends its source once, not 500 times; any still answered NOSCRIPT (the cache
    flushed in between) go once more as full EVALs. ``per_node_errors``: see
    :meth:`RedisClient.pipeline` (on a cluster, an unreachable node fails only its calls).
    """
    replies = await client.pipeline(
        [s.evalsha_args(k, a) for s, k, a in calls], per_node_errors=per_node_errors
    )
    missing = _noscript(replies, range(len(calls)))
    if missing:
        loaded: set[tuple[str, str | None]] = set()
        again_args = []
        for i in missing:
            script, keys, args = calls[i]
            where = (script.sha, client.node_of(keys[0]) if keys else None)
            if where in loaded:
                again_args.append(script.evalsha_args(keys, args))
            else:
                loaded.add(where)
                again_args.append(script.eval_args(keys, args))
        again = await client.pipeline(again_args, per_node_errors=per_node_errors)
        for i, reply in zip(missing, again, strict=True):
            replies[i] = reply
        last = _noscript(replies, missing)
        if last:
            final = await client.pipeline(
                [calls[i][0].eval_args(calls[i][1], calls[i][2]) for i in last],
                per_node_errors=per_node_errors,
            )
            for i, reply in zip(last, final, strict=True):
                replies[i] = reply
    return replies


def _noscript(replies: Sequence[Any], among: Iterable[int]) -> list[int]:
    """The indices among ``among`` whose reply is NOSCRIPT (the call did not run)."""
    return [
        i for i in among if isinstance(replies[i], ServerError) and replies[i].code == "NOSCRIPT"
    ]


def _read(path: str) -> str:
    return resources.files("respire_actors").joinpath("scripts", path).read_text("utf-8")


def _resolve(path: str, seen: tuple[str, ...]) -> str:
    if path in seen:
        chain = " -> ".join((*seen, path))
        raise RuntimeError(f"Lua include cycle: {chain}")
    text = _read(path)
    return _INCLUDE.sub(lambda m: _resolve(m.group(1), (*seen, path)).rstrip("\n"), text)


@cache
def _files() -> dict[str, tuple[str, int]]:
    """Every shipped script's file and key count, by name (one directory listing)."""
    folder = resources.files("respire_actors").joinpath("scripts")
    found = {}
    for entry in folder.iterdir():
        match = _NAME.match(entry.name)
        if match:
            found[match.group("name")] = (entry.name, int(match.group("keys")))
    return found


@cache
def load(name: str) -> Script:
    """The script ``scripts/<name>-<n>.lua`` (``name`` without the key count); its source,
    includes resolved and pruned, is read on first use. Raises LookupError for an unknown
    name."""
    try:
        file, numkeys = _files()[name]
    except KeyError:
        raise LookupError(f"no Lua script named {name!r} in respire_actors/scripts") from None
    return Script(name, numkeys, file=file)


def all_scripts() -> list[Script]:
    """Every shipped script (used by tests and ``respire_actors scripts``)."""
    folder = resources.files("respire_actors").joinpath("scripts")
    names = sorted(m.group("name") for e in folder.iterdir() if (m := _NAME.match(e.name)))
    return [load(n) for n in names]
