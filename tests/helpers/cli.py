"""Running ``python -m respire_actors`` as a real process, in the foreground or background."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cli_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The test's environment without the variables that change the CLI's defaults."""
    full = {
        k: v
        for k, v in os.environ.items()
        if k not in {"RESPIRE_REDIS_URL", "RESPIRE_DATA_DIR", "RESPIRE_LOG_LEVEL"}
    }
    full.update(env or {})
    return full


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "respire_actors", *args],
        cwd=ROOT,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class Served:
    """A background ``serve``: stdout is read line by line, stderr goes to a file."""

    def __init__(self, proc: subprocess.Popen[str], stderr_path: Path) -> None:
        self.proc = proc
        self.stderr_path = stderr_path
        self.lines: list[str] = []

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def wait_for_line(self, needle: str) -> str:
        """Read stdout until a line contains ``needle`` (the test's timeout bounds it)."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if needle in line:
                return line
        raise AssertionError(
            f"serve exited ({self.proc.wait()}) before printing {needle!r}; "
            f"stdout: {''.join(self.lines)!r}; stderr: {self.stderr()!r}"
        )

    def wait_for_stderr(self, needle: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.stderr().splitlines():
                if needle in line:
                    return line
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no {needle!r} on serve's stderr: {self.stderr()!r}")

    def wait_for_stderr_count(self, needle: str, count: int, timeout: float = 60) -> None:
        """Wait until ``needle`` occurs on at least ``count`` lines of stderr."""
        deadline = time.monotonic() + timeout
        while sum(needle in line for line in self.stderr().splitlines()) < count:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"not {count} x {needle!r} on stderr: {self.stderr()!r}")
            time.sleep(0.05)

    def signal(self, signum: signal.Signals) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout)


@contextlib.contextmanager
def serving(*args: str, stderr_path: Path, env: dict[str, str] | None = None) -> Iterator[Served]:
    """``python -m respire_actors serve *args`` in the background; killed if still running."""
    with (
        open(stderr_path, "w") as err,
        subprocess.Popen(
            [sys.executable, "-m", "respire_actors", "serve", *args],
            cwd=ROOT,
            env=cli_env(env),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        ) as proc,
    ):
        try:
            yield Served(proc, stderr_path)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
