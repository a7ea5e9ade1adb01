"""Append-only JSON-lines ledgers: the producer's accepted intents and the handlers' effects.

A ledger line is written (and, by default, fsynced) before the writer goes on, so a process
SIGKILLed right after a write leaves it on disk; a torn last line (killed mid-write) is skipped
when reading. One file may have several writers if each opens it in append mode and writes whole
lines of at most PIPE_BUF bytes (POSIX appends of that size do not interleave).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


class Ledger:
    """``Ledger(path).record(kind="accepted", job="j1")`` appends ``{"kind": ..., "job": ...}``."""

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fsync = fsync
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def record(self, **fields: Any) -> None:
        line = (json.dumps(fields, separators=(",", ":")) + "\n").encode()
        if len(line) > 4096:
            raise ValueError("a ledger line must stay under 4096 bytes to append atomically")
        os.write(self._fd, line)
        if self._fsync:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_ledger(path: Path) -> Iterator[dict[str, Any]]:
    """Every whole line of a ledger (none when the file does not exist)."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return
    for raw in text.split(b"\n"):
        if not raw.strip():
            continue
        try:
            yield json.loads(raw)
        except ValueError:
            continue  # a line torn by a kill mid-write


def effect_lines(effects: Path | Iterable[Path]) -> Iterator[dict[str, Any]]:
    """The ``effect`` lines of one effects ledger or of several, in file order."""
    for path in [effects] if isinstance(effects, Path) else effects:
        for line in read_ledger(path):
            if line.get("kind") == "effect":
                yield line
