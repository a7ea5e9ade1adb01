"""Start, signal and stop chaos worker processes (see :mod:`respire_actors.chaos.worker`)."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PARENT_ENV = "RESPIRE_CHAOS_PARENT"
"""Set for every chaos worker process to the pid of the process that started it: a worker whose
parent is gone (killed without cleanup) stops itself (:mod:`~respire_actors.chaos.process_main`)."""

_live: set[WorkerProcess] = set()


def stop_leftover_workers() -> int:
    """SIGKILL every worker process this process started that is still running (a scenario
    that failed or overran its budget may leave some); returns how many. The runner calls it
    after each scenario, and it runs at interpreter exit."""
    left = [w for w in _live if w.alive()]
    for worker in left:
        worker.kill()
    _live.clear()
    return len(left)


atexit.register(stop_leftover_workers)


@dataclass(eq=False)
class WorkerProcess:
    """A running ``respire_actors.chaos.worker`` process."""

    process: subprocess.Popen[bytes]
    ready_file: Path
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until the worker has started every actor; raise with its log if it exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready_file.exists():
                return
            if not self.alive():
                raise RuntimeError(
                    f"chaos worker exited with {self.process.returncode}: {self.tail()}"
                )
            time.sleep(0.02)
        raise TimeoutError(f"chaos worker not ready after {timeout} s: {self.tail()}")

    def signal(self, sig: signal.Signals) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.process.wait()

    def stop(self, timeout: float = 15.0) -> int:
        """Graceful stop (SIGTERM: the worker stops intake and finishes bounded work); SIGKILL
        after ``timeout``. Returns the exit code."""
        self.signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.process.wait()

    def wait_exit(self, timeout: float) -> int | None:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def start_worker(
    url: str,
    queue: str,
    effects: Path,
    work_dir: Path,
    *extra: str,
    backend: str = "asyncio",
    env: dict[str, str] | None = None,
    wait: bool = True,
    module: str = "respire_actors.chaos.worker",
) -> WorkerProcess:
    """Start one worker process on ``queue`` recording effects in ``effects``; ``extra`` are
    more ``chaos.worker`` arguments (``--consumers 4``, ``--no-renew``, ...); ``env`` adds
    environment variables (e.g. a kill point); ``module`` is the worker program
    (``respire_actors.chaos.reliable_worker`` for a reliable-queue consumer)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    stamp = f"{time.monotonic_ns()}"
    ready = work_dir / f"worker-{stamp}.ready"
    log = work_dir / f"worker-{stamp}.log"
    cmd = [
        sys.executable, "-m", module,
        "--url", url, "--queue", queue, "--effects", str(effects),
        "--ready-file", str(ready), "--backend", backend, *extra,
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, PARENT_ENV: str(os.getpid()), **(env or {})},
            start_new_session=True,
        )
    worker = WorkerProcess(process, ready, log)
    _live.add(worker)
    if wait:
        worker.wait_ready()
    return worker
