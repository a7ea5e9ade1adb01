"""``python -m respire_actors chaos``: a real subprocess for a scenario, --list, an unknown
name, and a failing verdict's exit code."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import anyio
import pytest
from helpers.chaos import check_trim_verdicts
from helpers.keyspace import delete_matching

from respire_actors.chaos.model import ChaosContext, Verdict
from respire_actors.chaos.runner import run_scenarios
from respire_actors.chaos.scenarios import SCENARIOS, load_all, register
from respire_actors.cli import main
from respire_actors.redis.client import connect

TRIM_CASES = [
    "sigkill:oldest-pending/ready",
    "lagging-second-group/ready",
    "staged:durable-retries/ready",
    "staged:delayed/ready",
    "staged:job-groups/ready",
]


def chaos(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "respire_actors", "chaos", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "COLUMNS": "200"},  # rich wraps at 80 columns without a terminal
    )


def test_list_names_every_scenario_in_seed_order() -> None:
    done = chaos("--list")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if re.match(r"\d+\. ", line)]
    registry = load_all()
    assert len(lines) == len(registry)
    numbers = [int(line.split(".", 1)[0]) for line in lines]
    assert numbers == sorted(numbers)
    for name in ("group-bootstrap", "failures", "trim"):
        assert any(line.split(" ")[1] == name for line in lines), lines
    # the marker of scenarios that start their own servers (rich markup must not eat it)
    own = {line.split(" ")[1] for line in lines if "[own servers]" in line}
    assert own == {name for name, cls in registry.items() if cls.own_servers}, lines


def test_an_unknown_scenario_is_a_clear_error(tmp_path: Path) -> None:
    done = chaos("--only", "no-such-scenario", "--out", str(tmp_path))
    assert done.returncode == 2  # a usage error (found by review: it exited 1, as a failure)
    assert done.stderr.startswith("error: unknown scenario no-such-scenario")
    assert "trim" in done.stderr  # the message lists the known names
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "results.json").exists()


@pytest.mark.parametrize("budget", ["-5", "0", "nan", "inf", "soon"])
def test_a_budget_that_is_not_a_positive_number_is_a_usage_error(budget: str) -> None:
    done = chaos("--only", "trim", "--budget", budget)
    assert done.returncode == 2
    assert "--budget: must be a number of seconds above 0" in done.stderr


def test_an_unreachable_server_is_one_start_up_error(tmp_path: Path) -> None:
    """Found by review: each queue-only scenario printed a traceback and a FAIL verdict, and
    the run exited 1; now one 'error:' line and exit 3 before anything runs."""
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = chaos("--ci", "--redis-url", f"redis://127.0.0.1:{port}", "--out", str(tmp_path))
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stderr.startswith("error: cannot reach Redis"), done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "results.json").exists()


def test_one_scenario_runs_in_a_subprocess_and_writes_its_results(
    valkey_url: str, tmp_path: Path
) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    try:
        done = chaos("--only", "trim", "--redis-url", valkey_url, "--out", str(out),
                     "--work-dir", str(work))  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        results = json.loads((out / "results.json").read_text())
        assert [r["case"] for r in results] == TRIM_CASES
        check_trim_verdicts(results)  # the scenario's checks, on Valkey with asyncio workers
        markdown = (out / "results.md").read_text()
        assert markdown.startswith("| scenario | case | accepted | completed | duplicates |")
        for case in TRIM_CASES:
            assert f"| trim | {case} |" in markdown
        assert "Details:" in markdown and "Violations:" not in markdown
        assert "failure contract" in done.stdout  # the terminal table
    finally:
        names = [p.name for p in work.iterdir() if p.is_dir()] if work.exists() else []
        anyio.run(_cleanup, valkey_url, names)


async def _cleanup(url: str, names: list[str]) -> None:
    async with connect(url) as client:
        for name in names:
            await delete_matching(client, f"*{name}*")


class Broken:
    number: ClassVar[int] = 99
    name: ClassVar[str] = "test-only-broken"
    title: ClassVar[str] = "a scenario that raises (test only)"
    ci: ClassVar[bool] = False
    own_servers: ClassVar[bool] = False

    async def run(self, ctx: ChaosContext) -> list[Verdict]:
        raise RuntimeError("boom")


@pytest.fixture
def broken() -> Iterator[str]:
    register(Broken)
    try:
        yield Broken.name
    finally:
        del SCENARIOS[Broken.name]


def test_a_scenario_that_raises_is_a_failed_verdict_and_a_failing_exit(
    broken: str, valkey_url: str, tmp_path: Path
) -> None:
    ctx = ChaosContext(work_dir=tmp_path / "direct", redis_url=valkey_url)
    verdicts = anyio.run(run_scenarios, ctx, [broken])
    assert len(verdicts) == 1
    (verdict,) = verdicts
    assert (verdict.scenario, verdict.case, verdict.passed) == (broken, "(scenario error)", False)
    assert verdict.violations == ("RuntimeError: boom",)
    # the same through the command (in this process: the class is registered only here)
    out = tmp_path / "out"
    code = main(["chaos", "--only", broken, "--redis-url", valkey_url, "--out", str(out)])
    assert code == 1
    (row,) = json.loads((out / "results.json").read_text())
    assert row["passed"] is False and row["violations"] == ["RuntimeError: boom"]
    assert f"| {broken} | (scenario error) |" in (out / "results.md").read_text()
    assert "FAIL" in (out / "results.md").read_text()
