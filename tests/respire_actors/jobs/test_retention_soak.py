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
    # bounded streams while jobs flow (without retention both reach 50,000)
    assert max(s["ready"] for s in second) < JOBS * 0.4, samples
    assert max(s["events"] for s in second) < JOBS * 0.4, samples
    # no upward trend: the second half never exceeds the first half's peak by much (without
    # retention it grows by ~100 bytes per job, 2.5 MB over the second half)
    assert max(s["used_memory"] for s in second) < max(s["used_memory"] for s in first) + MB
    # and once the work stops, what was processed is trimmed away
    end = samples[-1]
    assert (end["ready"], end["events"]) == (0, 0), end
    assert end["used_memory"] - samples[0]["used_memory"] < MB, report
