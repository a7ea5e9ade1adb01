"""``python -m respire_actors dashboard`` as a real process on both backends: it serves, it
stops on SIGINT with exit code 0, it refuses to listen beyond loopback without auth, and token
auth from the environment guards it."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.cli import ROOT, cli_env, run_cli

pytestmark = pytest.mark.slow

TOKEN = "cli-token-0123456789"


@contextlib.contextmanager
def dashboard(*args: str, stderr_path: Path, env: dict[str, str] | None = None) -> Iterator[
    tuple[subprocess.Popen[str], str]
]:  # fmt: skip
    """The dashboard command in the background; yields the process and its base URL."""
    with (
        open(stderr_path, "w") as err,
        subprocess.Popen(
            [sys.executable, "-m", "respire_actors", "dashboard", "--port", "0", *args],
            cwd=ROOT,
            env=cli_env(env),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        ) as proc,
    ):
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("dashboard on "), (line, stderr_path.read_text())
            yield proc, line.removeprefix("dashboard on ").strip().rstrip("/")
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def get(url: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"accept": "text/html"})
    if token:
        request.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_serves_and_stops_on_sigint(
    server_url: str, unique_name: str, tmp_path: Path, backend: str
) -> None:
    args = ("--redis-url", server_url, "--queue", unique_name, "--backend", backend)
    with dashboard(*args, stderr_path=tmp_path / "err") as (proc, url):
        status, body = get(url + "/")
        assert status == 200 and f'data-queue="{unique_name}"' in body
        status, body = get(url + f"/queue?queue={unique_name}")
        assert status == 200 and "Pause queue" in body
        assert get(url + "/queue?queue=other-queue")[0] == 400  # not in --queue
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0


def test_read_only_flag(server_url: str, unique_name: str, tmp_path: Path) -> None:
    args = ("--redis-url", server_url, "--queue", unique_name, "--read-only")
    with dashboard(*args, stderr_path=tmp_path / "err") as (_, url):
        status, body = get(url + f"/queue?queue={unique_name}")
        assert status == 200 and "Pause queue" not in body and "read-only" in body


def test_refuses_to_listen_beyond_loopback_without_auth(server_url: str) -> None:
    result = run_cli("dashboard", "--redis-url", server_url, "--host", "0.0.0.0", "--port", "0")
    assert result.returncode == 3, result
    assert result.stderr.strip().startswith("error: refusing to serve the dashboard")
    assert "RESPIRE_DASHBOARD_TOKEN" in result.stderr


def test_needs_a_redis_url() -> None:
    result = run_cli("dashboard")
    assert result.returncode == 3
    assert "--redis-url" in result.stderr


def test_token_from_the_environment(server_url: str, tmp_path: Path) -> None:
    args = ("--redis-url", server_url, "--host", "0.0.0.0")
    env = {"RESPIRE_DASHBOARD_TOKEN": TOKEN}
    with dashboard(*args, stderr_path=tmp_path / "err", env=env) as (proc, url):
        local = url.replace("0.0.0.0", "127.0.0.1")
        status, body = get(local + "/")
        assert status == 401 and 'name="token"' in body
        assert get(local + "/", token="wrong-token-0123456789")[0] == 401
        assert get(local + "/", token=TOKEN)[0] == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
