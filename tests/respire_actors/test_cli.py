"""The command line, run as a real process: exit codes, one-line errors, the demo on the
embedded server, and graceful stop on SIGINT."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "RESPIRE_REDIS_URL"}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "respire_actors", *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("respire_actors ")


def test_ping_prints_a_table(server_url: str) -> None:
    result = run_cli("ping", "--redis-url", server_url)
    assert result.returncode == 0, result.stderr
    assert "version" in result.stdout and "flavor" in result.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("ping", "--redis-url", "foo://x"), "unsupported Redis URL scheme"),
        (("ping", "--redis-url", "redis://127.0.0.1:1"), "cannot reach Redis"),
        (
            ("serve", "no_such_module_xyz:app", "--redis-url", "redis://127.0.0.1:6379"),
            "cannot import module",
        ),
        (
            ("serve", "examples.email_app:nothing", "--redis-url", "redis://127.0.0.1:6379"),
            "has no attribute",
        ),
        (("serve", "badpath", "--redis-url", "redis://127.0.0.1:6379"), "must look like"),
    ],
)
def test_startup_errors_are_one_line_with_exit_3(args: tuple[str, ...], needle: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 3
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and needle in lines[0], result.stderr


def test_usage_error_exit_2() -> None:
    assert run_cli().returncode == 2


def test_demo_runs_to_completion_on_the_embedded_server(tmp_path: Path) -> None:
    result = run_cli(
        "serve",
        "examples.email_app:app",
        "--data-dir",
        str(tmp_path / "data"),
        env={"DEMO_JOBS": "5"},
    )
    assert result.returncode == 0, result.stderr
    assert "5 of 5 jobs completed" in result.stdout
    assert (tmp_path / "data" / "appendonlydir").exists()  # AOF persistence was on


def test_sigint_stops_gracefully(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RESPIRE_REDIS_URL"}
    env["DEMO_JOBS"] = "400"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "respire_actors",
            "serve",
            "examples.email_app:app",
            "--data-dir",
            str(tmp_path / "data"),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if "progress" in line:
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "stopping gracefully" in err
    assert "of 400 jobs completed" in out
