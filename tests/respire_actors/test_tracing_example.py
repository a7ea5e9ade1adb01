"""The tracing demo runs under ``serve`` on the embedded server: each attempt's ``job
process`` span is a root linked to its ``job enqueue`` span, including the durable retry."""

from __future__ import annotations

import re
from pathlib import Path

from helpers.cli import run_cli


def test_tracing_demo_runs_under_serve(tmp_path: Path) -> None:
    result = run_cli(
        "serve", "examples.tracing_app:app", "--data-dir", str(tmp_path / "data"), timeout=90
    )
    assert result.returncode == 0, result.stderr
    assert "3 of 3 jobs completed" in result.stdout
    enqueues = dict(re.findall(r"span job enqueue +id=(\w+) .* job=(\S+)", result.stdout))
    processes = re.findall(
        r"span job process +id=\w+ parent=root +links=\[(\w+)\] job=(\S+) outcome=(\w+)",
        result.stdout,
    )
    assert len(enqueues) == 3 and len(processes) == 4  # one job was retried
    for link, job, _outcome in processes:
        assert enqueues[link] == job
    assert sorted(o for _, _, o in processes) == ["ack", "ack", "ack", "nack"]
    assert "metric respire.outcomes {'respire.outcome': 'retry'} 1" in result.stdout
