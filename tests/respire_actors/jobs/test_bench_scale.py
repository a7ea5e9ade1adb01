"""benchmarks/bench_scale.py end to end, small: real producer and worker processes against a
server and a 3-master cluster it starts itself. Every job must be acknowledged exactly once (the
benchmark checks it and fails otherwise), each cluster queue must sit on its own master, and
every figure the performance notes rest on must be there and plausible."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers.cli import ROOT, cli_env

pytestmark = pytest.mark.slow

JOBS = 600


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_the_scale_benchmark_reports_every_layout(backend: str) -> None:
    result = subprocess.run(
        [sys.executable, "benchmarks/bench_scale.py", "--backend", backend, "--jobs", str(JOBS),
         "--processes", "2", "--repeat", "1", "--chunk", "50", "--topology", "single,cluster",
         "--settle", "0.2",
         "--no-pin", "--json"],
        cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=110, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    runs = {r["topology"]: r for r in json.loads(result.stdout.strip().splitlines()[-1])}
    assert set(runs) == {"single", "cluster"}
    for run in runs.values():
        assert run["jobs"] == JOBS
        assert run["process_rate"] > 0 and run["enqueue_rate"] > 0
        assert run["server_us"] > 0 and run["producer_us"] > 0 and run["worker_us"] > 0
        # pipelined enqueues and batched reads and completions: far below one round trip a job
        assert 0 < run["round_trips"] < 0.5
    assert len(runs["single"]["shard_us"]) == 1
    # one queue per master, each master did its share of the work
    assert len(runs["cluster"]["shard_us"]) == 3
    assert all(us > 0 for us in runs["cluster"]["shard_us"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_the_scale_benchmark_reports_a_partitioned_queue_per_shard(backend: str) -> None:
    """One partitioned queue over the 3-master cluster (and on one server): every job is
    acknowledged once (the benchmark fails on an acknowledgement count other than the jobs, on
    a partition with anything pending or unread, or on ready entries other than the jobs), and
    every master reports its jobs and CPU per job."""
    result = subprocess.run(
        [sys.executable, "benchmarks/bench_scale.py", "--backend", backend, "--jobs", str(JOBS),
         "--processes", "2", "--repeat", "1", "--chunk", "50", "--topology",
         "single-part,cluster1-part,cluster-part", "--partitioned", "12", "--settle", "0.2",
         "--no-pin", "--json"],
        cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=110, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    runs = {r["topology"]: r for r in json.loads(result.stdout.strip().splitlines()[-1])}
    assert set(runs) == {"single-part", "cluster1-part", "cluster-part"}
    for run in runs.values():
        assert run["jobs"] == JOBS and sum(run["shard_jobs"]) == JOBS
        assert run["process_rate"] > 0 and run["server_us"] > 0 and run["worker_us"] > 0
        # every command's µs per job: the scripts' (EVALSHA) and the streams' own
        assert run["usec_per_job"]["evalsha"] > 0 and run["usec_per_job"]["xadd"] > 0
    assert runs["single-part"]["shard_jobs"] == [JOBS]
    assert runs["cluster1-part"]["shard_jobs"] == [JOBS]  # one master holds every partition
    # the shard-scaling comparison: three masters against the one-master cluster, same queue
    assert "cluster-part: per-shard server CPU per job / cluster1-part's" in result.stdout
    cluster = runs["cluster-part"]
    # 12 partitions over three masters: each master holds some partitions and served their jobs
    assert len(cluster["shard_jobs"]) == 3 and all(j > 0 for j in cluster["shard_jobs"])
    assert len(cluster["shard_us"]) == 3 and all(us > 0 for us in cluster["shard_us"])


@pytest.mark.timeout(120)
def test_the_scale_benchmark_throttles_every_server_to_the_same_rate() -> None:
    """``--shard-rate R``: R jobs/s on one server, 3R on the 3-master cluster (so each server
    sees the same rate), and each node's socket reads are reported."""
    result = subprocess.run(
        [sys.executable, "benchmarks/bench_scale.py", "--jobs", str(JOBS), "--processes", "1",
         "--repeat", "1", "--chunk", "50", "--topology", "single,cluster", "--settle", "0.2",
         "--shard-rate", "200", "--no-pin", "--json"],
        cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=110, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    runs = {r["topology"]: r for r in json.loads(result.stdout.strip().splitlines()[-1])}
    # 600 jobs at 200/s take at least 2.75 s (the first chunk goes at once): never faster
    assert runs["single"]["enqueue_rate"] < 200 * 1.15
    assert runs["cluster"]["enqueue_rate"] < 600 * 1.15
    # the cluster's three masters take three times the rate: unthrottled, one producer enqueues
    # thousands of jobs per second, so even a loaded machine keeps up with 600/s (1,200/s did
    # not always: 838 against 424 on one CI run)
    assert runs["cluster"]["enqueue_rate"] > 2 * runs["single"]["enqueue_rate"]
    for run in runs.values():
        assert len(run["shard_reads"]) == len(run["shard_us"])
        assert all(reads > 0 for reads in run["shard_reads"])
