"""Drop the included Lua helpers a script never calls.

A script's ``--!include``\\ d libraries define every helper as a top-level ``local function``.
Lua runs a script's whole text on every call, so each definition costs a closure (and later
its garbage) on every EVALSHA even when the script never calls it: ``job_complete`` includes
75 helpers and reaches 44. :func:`prune` keeps the statements that are not top-level local
functions, and the top-level local functions reachable from them by name; it removes the
others' text and nothing else, so the kept code is byte for byte the included text.

Reachability is by identifier, over a tokenizer that knows Lua's comments and strings (a name
in either does not count, as a local function cannot be reached through text). Any identifier
in code counts, a table field's name included, which errs on the side of keeping. A helper
defined any other way (``local f = function``, a table of functions) is a plain statement and
always kept, and so is everything it names.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

_TOKEN = re.compile(
    r"""
     (?P<long_comment>--\[(?P<ceq>=*)\[.*?\](?P=ceq)\])
    |(?P<comment>--[^\n]*)
    |(?P<long_string>\[(?P<seq>=*)\[.*?\](?P=seq)\])
    |(?P<string>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
    |(?P<number>\d[\w.]*)
    |(?P<name>[A-Za-z_]\w*)
    |(?P<space>\s+)
    |(?P<other>.)
    """,
    re.S | re.X,
)
_KINDS = ("long_comment", "comment", "long_string", "string", "number", "name", "space", "other")
_OPENS = frozenset({"function", "do", "if", "repeat"})
_CLOSES = frozenset({"end", "until"})


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str
    text: str
    start: int
    end: int


def _tokens(source: str) -> Iterator[_Token]:
    pos = 0
    while pos < len(source):
        match = _TOKEN.match(source, pos)
        if match is None:  # pragma: no cover - '.' with re.S matches any character
            raise ValueError(f"cannot tokenize Lua at offset {pos}")
        kind = next(k for k in _KINDS if match.group(k) is not None)
        yield _Token(kind, match.group(0), match.start(), match.end())
        pos = match.end()


def _names(tokens: list[_Token]) -> set[str]:
    return {t.text for t in tokens if t.kind == "name"}


def _pieces(source: str) -> list[tuple[str | None, list[_Token]]]:
    """The source cut into top-level ``local function`` definitions (their name) and the text
    between them (None), each with its tokens; concatenated they are the source."""
    code = list(_tokens(source))
    pieces: list[tuple[str | None, list[_Token]]] = []
    depth, start, i = 0, 0, 0
    while i < len(code):
        tok = code[i]
        if tok.kind != "name":
            i += 1
            continue
        if depth == 0 and tok.text == "local":
            after = [j for j in range(i + 1, min(i + 6, len(code))) if code[j].kind != "space"]
            if len(after) >= 2 and code[after[0]].text == "function":
                name = code[after[1]].text
                j, inner = after[0], 0
                while True:  # to the 'end' closing this function
                    t = code[j]
                    if t.kind == "name" and t.text in _OPENS:
                        inner += 1
                    elif t.kind == "name" and t.text in _CLOSES:
                        inner -= 1
                        if inner == 0:
                            break
                    j += 1
                    if j == len(code):
                        raise ValueError(f"Lua function {name!r} has no closing 'end'")
                pieces.append((None, code[start:i]))
                pieces.append((name, code[i : j + 1]))
                start = i = j + 1
                continue
        if tok.text in _OPENS:
            depth += 1
        elif tok.text in _CLOSES:
            depth -= 1
        i += 1
    pieces.append((None, code[start:]))
    return pieces


def prune(source: str) -> str:
    """``source`` without the top-level local functions nothing else in it can call."""
    pieces = _pieces(source)
    functions: dict[str, set[str]] = {}
    for name, tokens in pieces:
        if name is not None:  # a name defined twice keeps whatever either definition calls
            functions.setdefault(name, set()).update(_names(tokens))
    wanted = [n for name, tokens in pieces if name is None for n in _names(tokens)]
    reachable: set[str] = set()
    while wanted:
        name = wanted.pop()
        if name in functions and name not in reachable:
            reachable.add(name)
            wanted.extend(functions[name])
    kept = [tokens for name, tokens in pieces if name is None or name in reachable]
    return "".join(t.text for tokens in kept for t in tokens)
