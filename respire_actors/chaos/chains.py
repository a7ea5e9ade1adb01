"""Helpers for scenarios that crash or pause worker processes: waiting on outcomes without
blocking the event loop, reading a stopped worker's statistics, and the re-execution rule.

The re-execution rule (:func:`disallowed_reexecutions`) is what "the only duplicates are the
re-executions the contract allows" means for a case: a handler may run again only because an
earlier run's process died (or was fenced) before its outcome was committed. So per job, at
most one execution by a surviving process, and none at all when the committed completion
was the run of a process that was killed afterwards (a committed job is never delivered
again).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

import anyio

from ..jobs.queue import JobQueue
from .ledger import effect_lines
from .observe import read_events
from .processes import WorkerProcess, start_worker


async def start(*args: Any, **kwargs: Any) -> WorkerProcess:
    """:func:`start_worker` in a thread (it blocks until the worker is ready)."""
    return await anyio.to_thread.run_sync(lambda: start_worker(*args, **kwargs))


async def stop(worker: WorkerProcess, timeout: float = 15.0) -> int:
    """Graceful stop in a thread; returns the exit code."""
    return await anyio.to_thread.run_sync(lambda: worker.stop(timeout))


async def wait_for(condition: Callable[[], Any], timeout: float, interval: float = 0.1) -> bool:
    """Poll ``condition`` (a coroutine function or plain function) until it is true; False
    when ``timeout`` seconds passed first."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if hasattr(value, "__await__"):
            value = await value
        if value:
            return True
        if time.monotonic() >= deadline:
            return False
        await anyio.sleep(interval)


def process_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (``T`` stopped, ``Z`` zombie, ...); '' when
    unknown (no /proc, or the process is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rpartition(")")[2].split()[0]


def read_stats(path: Path) -> dict[str, int]:
    """The statistics a chaos worker wrote with ``--stats-file`` ({} if it wrote none)."""
    try:
        stats = json.loads(path.read_text())
        return {k: int(v) for k, v in stats.items() if isinstance(v, int | float)}
    except (OSError, ValueError):
        return {}


async def completions(queue: JobQueue[Any]) -> list[tuple[str, str, int]]:
    """``(job id, entry id, attempt)`` of every retained ``completed`` event of ``queue``."""
    return [
        (event.job_id, event.entry_id, event.attempt)
        for event in await read_events(queue)
        if event.kind == "completed"
    ]


async def count_events(queue: JobQueue[Any], kind: str) -> int:
    """How many retained events of ``queue`` have ``kind``."""
    return sum(event.kind == kind for event in await read_events(queue))


def disallowed_reexecutions(
    effects: Path | Iterable[Path],
    completed: Iterable[tuple[str, str, int]],
    killed: Collection[int],
) -> list[str]:
    """Violations of the re-execution rule (see the module docstring): ``effects`` are the
    handlers' effect ledgers, ``completed`` the queue's completed events, ``killed`` the pids
    of the processes that were killed (or fenced)."""
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in effect_lines(effects):
        runs[str(line["job"])].append(line)
    committed_by: dict[str, int | None] = {}
    for job, entry, attempt in completed:
        pid = next(
            (r["pid"] for r in runs[job] if r.get("entry") == entry and r["attempt"] == attempt),
            None,
        )
        committed_by[job] = pid
    found: list[str] = []
    for job, lines in runs.items():
        survivors = [r for r in lines if r["pid"] not in killed]
        if len(survivors) > 1:
            found.append(f"{job}: ran {len(survivors)} times in processes that were not killed")
        if survivors and committed_by.get(job) in killed:
            found.append(f"{job}: ran again after a killed process had committed its completion")
    return found
