"""A tiny synchronous RESP2 client for administering servers (building clusters, promoting
replicas, reading INFO) in the chaos suite and the tests' fixtures.

It deliberately shares nothing with the library's connection layer: what prepares and breaks
servers must not depend on the code whose behaviour under those faults is being judged.
"""

from __future__ import annotations

import socket
from types import TracebackType
from typing import Any


class RespError(Exception):
    """The server replied with an error."""


class SyncRedis:
    """One blocking socket speaking RESP2. ``execute(*args)`` returns the decoded reply."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 6379,
        *,
        unix_path: str | None = None,
        timeout: float = 5.0,
    ) -> None:
        if unix_path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target: Any = unix_path
        else:
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            target = (host, port)
        sock.settimeout(timeout)
        try:
            sock.connect(target)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._buf = bytearray()

    def __enter__(self) -> SyncRedis:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    def execute(self, *args: str | bytes | int | float) -> Any:
        """Send one command; return its reply (bytes, int, list, None). Raises RespError."""
        self.send(*args)
        return self.read_reply()

    def send(self, *args: str | bytes | int | float) -> None:
        out = bytearray(b"*%d\r\n" % len(args))
        for arg in args:
            data = arg if isinstance(arg, bytes) else str(arg).encode()
            out += b"$%d\r\n%s\r\n" % (len(data), data)
        self._sock.sendall(out)

    def read_reply(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return bytes(rest)
        if kind == b"-":
            raise RespError(rest.decode("utf-8", "replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            data = self._exact(size + 2)
            return bytes(data[:-2])
        if kind == b"*":
            size = int(rest)
            if size < 0:
                return None
            return [self.read_reply() for _ in range(size)]
        raise RespError(f"unexpected RESP reply {line!r}")

    def _fill(self) -> None:
        chunk = self._sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self._buf += chunk

    def _line(self) -> bytes:
        while (end := self._buf.find(b"\r\n")) < 0:
            self._fill()
        line = bytes(self._buf[:end])
        del self._buf[: end + 2]
        return line

    def _exact(self, size: int) -> bytes:
        while len(self._buf) < size:
            self._fill()
        data = bytes(self._buf[:size])
        del self._buf[:size]
        return data


def info_fields(text: bytes | str) -> dict[str, str]:
    """Parse an INFO (or CLUSTER INFO) reply into a dict."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and not key.startswith("#"):
            fields[key.strip()] = value.strip()
    return fields
