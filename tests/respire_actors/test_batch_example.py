"""The batch demo runs under ``serve`` on the embedded server (issue 11): callbacks on success,
and on failure when a part is dead-lettered."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.cli import run_cli

pytestmark = pytest.mark.slow


def test_batch_demo_publishes_its_success_callbacks(tmp_path: Path) -> None:
    result = run_cli(
        "serve",
        "examples.batch_app:app",
        "--data-dir",
        str(tmp_path / "data"),
        env={"DEMO_PARTS": "5", "DEMO_RUN": "ok"},
        timeout=90,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "batch 'report:ok': 5 new members, sealed" in out
    assert out.count("completed        report:ok:part-") == 5
    assert "batch-completed  {'outcome': 'succeeded'}" in out
    assert out.count("callback report:ok:publish: publish") == 1
    assert out.count("callback report:ok:finished: all parts done") == 1
    assert "alert" not in out
    assert "status: 5 succeeded, 0 failed, 0 cancelled, 0 pending, completed=True" in out
    assert "removed: True" in out


def test_batch_demo_publishes_its_failure_callbacks(tmp_path: Path) -> None:
    result = run_cli(
        "serve",
        "examples.batch_app:app",
        "--data-dir",
        str(tmp_path / "data"),
        env={"DEMO_PARTS": "3", "DEMO_FAIL_PART": "1", "DEMO_RUN": "bad"},
        timeout=90,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "dead-letter      report:bad:part-1" in out
    assert "callback report:bad:alert: alert" in out
    assert "callback report:bad:finished: all parts done" in out
    assert "publish" not in out
    assert "status: 2 succeeded, 1 failed, 0 cancelled, 0 pending, completed=True" in out
