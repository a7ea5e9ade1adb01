"""The soak: 50,000 jobs through a worker whose retention keeper has a one-second window, on a
throwaway valkey-server (so ``used_memory`` is this run's alone), sampled by
benchmarks/soak_retention.py. Once the window is reached Redis memory stops growing, and when
the work stops everything processed is trimmed away."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest
from helpers.cli import ROOT, cli_env
from helpers.servers import ValkeyProcess

# one heavy test at a time under xdist (see tests/conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("heavy")]

JOBS = 50_000
MB = 1024 * 1024


def run_soak(url: str, backend: str, *extra: str) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "benchmarks/soak_retention.py", "--redis-url", url, "--backend",
         backend, "--jobs", str(JOBS), "--json", "--settle", "2", "--sample", "0.25", *extra],
        cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=110, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_memory_is_flat_once_the_window_is_reached(
    spawn_valkey: Callable[..., ValkeyProcess], backend: str
) -> None:
    server = spawn_valkey()
    report = run_soak(server.url, backend, "--max-age", "1")
    samples = report["samples"]
    assert isinstance(samples, list)
    first = [s for s in samples if s["processed"] <= JOBS / 2]
    second = [s for s in samples if JOBS / 2 < s["processed"] < JOBS]
    assert first and second, samples
    # bounded streams while jobs flow: what a stream keeps beyond the unprocessed backlog was
    # processed within the window (1 s, a keeper pass every 0.2 s, 1 s of slack for a loaded
    # machine), so it is at most what was processed in that time; without retention both
    # streams keep all 50,000 (a fixed count would depend on this machine's speed)
    window = 1.0 + 0.2 + 1.0
    checked = 0
    for s in samples:
        earlier = [e for e in samples if e["seconds"] <= s["seconds"] - window]
        if not earlier:
            continue
        recent = s["processed"] - earlier[-1]["processed"]
        backlog = s["enqueued"] - s["processed"]
        assert s["ready"] - backlog <= recent, (s, earlier[-1])
        assert s["events"] <= recent + 64, (s, earlier[-1])  # + completions in flight
        checked += 1
    assert checked >= 3, samples
    assert report["oldest_entry_ms_max_second_half"] < window * 1000 + 2000, report
    # and memory is what those bounded streams hold, nothing else accumulating per job: about
    # 130-210 bytes per retained entry (deduplication records included), whatever the rate (a
    # bound on the first half's peak depended on the second half's rate, which varies by machine)
    start = samples[0]["used_memory"]
    for s in second:
        assert s["used_memory"] - start <= 300 * (s["ready"] + s["events"]) + MB, s
    # and once the work stops, what was processed is trimmed away
    end = samples[-1]
    assert (end["ready"], end["events"]) == (0, 0), end
    assert end["used_memory"] - samples[0]["used_memory"] < MB, report
