"""benchmarks/bench_lua_prologue.py, small, against the test server: it runs and the pruned
helpers never cost more than every included one (a generous bound: the figures are timings
on a busy shared server, where a small prologue can even read below a bare EVALSHA's)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers.cli import ROOT, cli_env


@pytest.mark.timeout(120)
def test_the_prologue_benchmark_reports_each_script(server_url: str) -> None:
    result = subprocess.run(
        [sys.executable, "benchmarks/bench_lua_prologue.py", "--redis-url", server_url,
         "--calls", "2000", "--rounds", "3", "--scripts", "job_complete,job_lease_renew"],
        cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=110, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    line = re.compile(
        r"^(\w+): prologue +(-?[\d.]+) µs/call with all (\d+) helpers, +(-?[\d.]+) with the (\d+) "
        r"kept",
        re.M,
    )
    found = {m.group(1): m.groups()[1:] for m in line.finditer(result.stdout)}
    assert set(found) == {"job_complete", "job_lease_renew"}, result.stdout
    for every_us, every, kept_us, kept in found.values():
        assert int(kept) < int(every)
        assert float(kept_us) < float(every_us) * 1.5 + 0.5, result.stdout
