"""The recurring demo runs under ``serve`` on the embedded server (issue 12)."""

from __future__ import annotations

from pathlib import Path

from helpers.cli import run_cli


def test_recurring_demo_runs_under_serve(tmp_path: Path) -> None:
    result = run_cli(
        "serve",
        "examples.recurring_app:app",
        "--data-dir",
        str(tmp_path / "data"),
        env={"DEMO_TICKS": "2"},
        timeout=90,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("heartbeat  tick") >= 2
    assert "recurring:" in result.stdout and "failed_passes=0" in result.stdout
