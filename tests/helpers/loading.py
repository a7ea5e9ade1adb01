"""Servers that are still loading their data set (they answer ``LOADING`` for a while).

``key-load-delay`` is a test-only valkey setting: microseconds of sleep per key (RDB) or per
replayed command (AOF) while loading, which makes the loading window as long as a test needs.
"""

from __future__ import annotations

from pathlib import Path

from .resp import SyncRedis, info_fields
from .servers import ValkeyProcess, start_valkey


def fill(port: int, count: int, password: str = "") -> None:
    """``count`` SETs in pipelined batches (each becomes one AOF command to replay); AUTH
    ``password`` first when given (the embedded server requires one)."""
    with SyncRedis("127.0.0.1", port, timeout=30) as conn:
        if password:
            conn.execute("AUTH", password)
        for start in range(0, count, 1000):
            batch = range(start, min(count, start + 1000))
            for n in batch:
                conn.send("SET", f"key:{n}", "x")
            for _ in batch:
                conn.read_reply()


def loading_server(data_dir: Path, *, keys: int = 20_000, delay_us: int = 100) -> ValkeyProcess:
    """A valkey-server with ``keys`` keys in its AOF, restarted so that it is loading them
    (for about ``keys * delay_us`` microseconds) when this returns."""
    first = start_valkey(data_dir, "--appendonly", "yes")
    try:
        fill(first.port, keys)
    finally:
        first.stop()
    server = start_valkey(
        data_dir,
        "--appendonly", "yes",
        "--key-load-delay", str(delay_us),
        "--loading-process-events-interval-bytes", "1024",
    )  # fmt: skip
    return server


def is_loading(server: ValkeyProcess) -> bool:
    return info_fields(server.execute("INFO", "persistence"))["loading"] == "1"  # type: ignore[arg-type]
