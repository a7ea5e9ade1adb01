"""The fan-out/fan-in report flow demo runs under ``serve`` on the embedded server (issue 11)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from helpers.cli import run_cli


def test_report_flow_demo_runs_under_serve(tmp_path: Path) -> None:
    result = run_cli(
        "serve",
        "examples.report_flow_app:app",
        "--data-dir",
        str(tmp_path / "data"),
        env={"REPORT_REGIONS": "3", "REPORT_SHARDS": "3"},
        timeout=90,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "enqueued: True" in out and "root event: completed" in out
    rows = dict(
        (m.group(1), (m.group(2), m.group(3)))
        for m in re.finditer(r"^(\S+)\s+(completed|failed)\s+(.*)$", out, re.MULTILINE)
    )
    assert len(rows) == 1 + 3 + 9
    assert rows["shard:region-0:1"] == ("failed", "-")
    region0 = json.loads(rows["region:region-0"][1])
    assert region0["missing"] == ["shard:region-0:1"]
    report = json.loads(rows["report"][1])
    regions = [json.loads(rows[f"region:region-{r}"][1])["total"] for r in range(3)]
    assert report == {"total": sum(regions), "missing": []}
    assert "removed: True" in out
