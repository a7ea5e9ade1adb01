"""The chaos harness itself: a producer ledger, a real worker process, reconciliation."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from respire_actors.chaos.ledger import Ledger, read_ledger
from respire_actors.chaos.processes import start_worker, stop_leftover_workers
from respire_actors.chaos.producer import produce
from respire_actors.chaos.reconcile import Outcomes, accepted_jobs, read_outcomes, reconcile
from respire_actors.codecs import JsonValueCodec
from respire_actors.jobs import JobQueue
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    with Ledger(path) as ledger:
        ledger.record(kind="accepted", job="a")
    with path.open("ab") as raw:
        raw.write(b'{"kind":"accepted","jo')
    assert [line["job"] for line in read_ledger(path)] == ["a"]


def test_reconcile_flags_double_completion_and_counts_loss() -> None:
    outcomes = Outcomes()
    outcomes.completed.update({"a": 1, "b": 2})
    outcomes.executions.update({"a": 2, "b": 1})
    verdict = reconcile("s", "c", ["a", "b", "c"], outcomes, 1.0)
    assert (verdict.completed, verdict.lost, verdict.duplicates) == (2, 1, 1)
    assert verdict.violations == ("b: 2 completed events",)
    assert not verdict.passed


async def test_a_worker_process_runs_produced_jobs_to_completion(
    client: RedisClient, server_url: str, unique_name: str, tmp_path: Path
) -> None:
    queue = JobQueue(client, unique_name, JsonValueCodec())
    producer_path, effects = tmp_path / "producer.jsonl", tmp_path / "effects.jsonl"
    worker = start_worker(server_url, unique_name, effects, tmp_path / "w", "--consumers", "4")
    try:
        with Ledger(producer_path) as ledger:
            specs = [(f"j{i}", {"sleep": 0.01}) for i in range(20)]
            specs.append(("dead", {"fail": "permanent"}))
            assert await produce(queue, specs, ledger) == (21, 0)
        deadline = time.monotonic() + 20
        while True:
            outcomes = await read_outcomes(queue, effects)
            if len(outcomes.completed) + len(outcomes.dead) >= 21 or time.monotonic() > deadline:
                break
            await anyio.sleep(0.1)
    finally:
        assert worker.stop() == 0, worker.tail()
    verdict = reconcile("harness", "plain", accepted_jobs(producer_path), outcomes, 0.0,
                        expect_dead=["dead"])  # fmt: skip
    assert verdict.passed, repr(verdict)
    assert (verdict.accepted, verdict.completed, verdict.dead_lettered) == (21, 20, 1)
    assert verdict.duplicates == 0


def _gone(pid: int) -> bool:
    """The process has exited (no /proc entry, or a zombie waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def test_leftover_workers_are_killed(server_url: str, unique_name: str, tmp_path: Path) -> None:
    worker = start_worker(server_url, unique_name, tmp_path / "effects.jsonl", tmp_path / "w")
    assert worker.alive()
    assert stop_leftover_workers() == 1
    assert not worker.alive()
    assert stop_leftover_workers() == 0


def test_a_worker_stops_when_the_process_that_started_it_is_killed(
    server_url: str, unique_name: str, tmp_path: Path
) -> None:
    """The suite SIGKILLed without cleanup: its worker processes notice and stop by themselves
    instead of serving the queue forever."""
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path;"
            "from respire_actors.chaos.processes import start_worker;"
            "w = start_worker(sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]));"
            "print(w.pid, flush=True); time.sleep(120)",
            server_url,
            unique_name,
            str(tmp_path / "effects.jsonl"),
            str(tmp_path / "w"),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        assert not _gone(pid)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 20
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(pid), "the orphaned chaos worker kept running"
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
