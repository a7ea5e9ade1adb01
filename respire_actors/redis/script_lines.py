"""Which command a line of a loaded script calls, to name a command refused inside a script.

Redis 7.0 reports a command that ACL refuses inside a script as ``ERR The user executing the
script can't run this command or subcommand script: <sha>, on @user_script:<line>.``, naming
neither the command nor the key. Every script respire_actors sends is registered here by
:func:`respire_actors.redis.scripts.load` with the exact text the server runs, so the line
the server names can be read back: a line that calls one command (``redis.call('XPENDING',
...)``) names it. Kept free of imports from the client so the client can use it.
"""

from __future__ import annotations

import re

_CALL = re.compile(r"redis\.p?call\(\s*'([A-Za-z]+)'(?:\s*,\s*'([A-Za-z-]+)')?")
_CONTAINERS = frozenset({"xgroup", "xinfo", "object", "client", "config", "memory", "cluster"})
_LOCATION = re.compile(r"script: ([0-9a-f]{40}), on @user_script:(\d+)")

_lines: dict[str, list[str]] = {}


def register(sha: str, source: str) -> None:
    """Remember the text of a script the server will know by ``sha``."""
    _lines[sha] = source.split("\n")


def command_at(sha: str, line: int) -> str:
    """The one command line ``line`` (1-based) of script ``sha`` calls, in lower case with a
    subcommand as ``"xinfo|groups"``; ``""`` when the script is unknown, the line calls none
    or calls more than one."""
    lines = _lines.get(sha)
    if lines is None or not 1 <= line <= len(lines):
        return ""
    names = set()
    for command, sub in _CALL.findall(lines[line - 1]):
        name = command.lower()
        if name in _CONTAINERS and sub:
            name = f"{name}|{sub.lower()}"
        names.add(name)
    return names.pop() if len(names) == 1 else ""


def refused_in_script(message: str) -> str:
    """The command a Redis 7.0 script ACL refusal points at (see the module text), or ``""``."""
    found = _LOCATION.search(message)
    if found is None:
        return ""
    return command_at(found.group(1), int(found.group(2)))
