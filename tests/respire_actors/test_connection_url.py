"""ConnectionSettings.from_url and connect(): every URL form, and clear errors for bad ones."""

from __future__ import annotations

import pytest

from respire_actors.errors import ConfigurationError
from respire_actors.redis.client import DEFAULT_URL_ENV, ConnectionSettings, connect


def parse(url: str, **overrides: object) -> ConnectionSettings:
    return ConnectionSettings.from_url(url, **overrides)


def test_plain_redis_url_defaults() -> None:
    s = parse("redis://example.com")
    assert (s.host, s.port, s.db, s.tls, s.cluster) == ("example.com", 6379, 0, False, False)
    assert s.username is None and s.password is None
    assert s.unix_socket_path is None


def test_host_port_db() -> None:
    s = parse("redis://10.0.0.5:6380/3")
    assert (s.host, s.port, s.db) == ("10.0.0.5", 6380, 3)
    assert s.describe() == "redis://10.0.0.5:6380/3"


def test_ipv6_host() -> None:
    s = parse("redis://[::1]:6390/1")
    assert (s.host, s.port, s.db) == ("::1", 6390, 1)


def test_user_and_password_percent_decoded() -> None:
    s = parse("redis://alice:p%40ss%3Aword@db.local:7000")
    assert (s.username, s.password) == ("alice", "p@ss:word")
    assert (s.host, s.port) == ("db.local", 7000)


def test_password_only_with_empty_user() -> None:
    s = parse("redis://:hunter2@db.local")
    assert s.username is None
    assert s.password == "hunter2"


def test_describe_and_errors_never_show_credentials() -> None:
    s = parse("redis://alice:topsecret@db.local:7000")
    assert "topsecret" not in s.describe()
    with pytest.raises(ConfigurationError) as info:
        parse("redis://alice:topsecret@db.local:7000?bogus=1")
    assert "topsecret" not in str(info.value)


def test_rediss_turns_tls_on_with_options() -> None:
    s = parse(
        "rediss://cache.example:6380?ssl_ca_certs=/etc/ca.pem&ssl_cert_reqs=required"
        "&ssl_certfile=/c.pem&ssl_keyfile=/k.pem"
    )
    assert s.tls is True
    assert s.tls_ca_certs == "/etc/ca.pem"
    assert s.tls_cert_reqs == "required"
    assert (s.tls_certfile, s.tls_keyfile) == ("/c.pem", "/k.pem")
    assert s.describe().startswith("rediss://")
    assert parse("redis://cache.example").tls is False
    assert parse("valkeys://cache.example").tls is True


@pytest.mark.parametrize(
    "url",
    [
        "redis://u:pw@cache.example?ssl_ca_certs=/etc/ca.pem&ssl_cert_reqs=required",
        "redis://cache.example?ssl_cert_reqs=none",
        "redis+cluster://a:1,b:2?ssl_certfile=/c.pem&ssl_keyfile=/k.pem",
        "unix:///tmp/redis.sock?ssl_ca_certs=/etc/ca.pem",
    ],
)
def test_tls_options_on_a_plain_text_scheme_are_refused(url: str) -> None:
    """One missing "s" in the scheme used to connect in plain text, options ignored."""
    with pytest.raises(ConfigurationError, match="rediss://") as info:
        parse(url)
    assert "pw" not in str(info.value)


def test_bad_cert_reqs_is_rejected() -> None:
    with pytest.raises(ConfigurationError, match="ssl_cert_reqs"):
        parse("rediss://h?ssl_cert_reqs=sometimes")


def test_unix_socket_url() -> None:
    s = parse("unix:///var/run/valkey.sock?db=2")
    assert s.unix_socket_path == "/var/run/valkey.sock"
    assert s.db == 2
    assert s.describe() == "unix:///var/run/valkey.sock"


def test_unix_socket_with_credentials() -> None:
    s = parse("unix://bob:pw@/tmp/v.sock")
    assert (s.username, s.password, s.unix_socket_path) == ("bob", "pw", "/tmp/v.sock")


def test_unix_without_path_is_rejected() -> None:
    with pytest.raises(ConfigurationError, match="no socket path"):
        parse("unix://")


def test_query_options() -> None:
    s = parse(
        "redis://h/0?key_prefix=%7Btenant%7D%3A&command_timeout=2.5&connect_timeout=1"
        "&max_connections=8&client_name=worker-1"
    )
    assert s.key_prefix == "{tenant}:"
    assert s.command_timeout == 2.5
    assert s.connect_timeout == 1.0
    assert s.max_connections == 8
    assert s.client_name == "worker-1"


def test_db_query_overrides_path() -> None:
    assert parse("redis://h/1?db=4").db == 4


def test_keyword_overrides_beat_the_url() -> None:
    s = parse("redis://h?command_timeout=2", command_timeout=9.0, key_prefix="p:")
    assert s.command_timeout == 9.0
    assert s.key_prefix == "p:"


@pytest.mark.parametrize(
    "url",
    ["redis+cluster://a:7000,b:7001,c:7002", "redis://a:7000,b:7001,c:7002?cluster=true"],
)
def test_cluster_forms(url: str) -> None:
    s = parse(url)
    assert s.cluster is True
    assert s.cluster_nodes == (("a", 7000), ("b", 7001), ("c", 7002))
    assert (s.host, s.port) == ("a", 7000)
    assert s.describe() == "redis+cluster://a:7000,b:7001,c:7002"


def test_tls_cluster() -> None:
    s = parse("rediss+cluster://a:7000")
    assert s.cluster and s.tls


def test_single_host_cluster_flag() -> None:
    s = parse("redis://a:7000?cluster=yes")
    assert s.cluster and s.cluster_nodes == (("a", 7000),)


def test_several_hosts_need_cluster_scheme() -> None:
    with pytest.raises(ConfigurationError, match="redis\\+cluster://"):
        parse("redis://a:7000,b:7001")


def test_cluster_has_only_db_zero() -> None:
    with pytest.raises(ConfigurationError, match="only database 0"):
        parse("redis+cluster://a:7000/2")


@pytest.mark.parametrize("url", ["http://h:6379", "memcached://h", "h:6379", "redis2://h"])
def test_bad_scheme(url: str) -> None:
    with pytest.raises(ConfigurationError, match="scheme"):
        parse(url)


@pytest.mark.parametrize("port", ["0", "65536", "99999", "abc", "-1"])
def test_bad_port(port: str) -> None:
    with pytest.raises(ConfigurationError, match="port"):
        parse(f"redis://h:{port}")


def test_bad_database() -> None:
    with pytest.raises(ConfigurationError, match="database"):
        parse("redis://h/zero")


def test_a_repeated_option_is_refused_not_silently_the_last() -> None:
    with pytest.raises(ConfigurationError, match=r"\['key_prefix'\] given more than once"):
        parse("redis://h?key_prefix=a:&key_prefix=b:")
    with pytest.raises(ConfigurationError, match="more than once"):
        parse("redis://h?spin_wait=0&command_timeout=1&spin_wait=0")


def test_unknown_option_is_named() -> None:
    with pytest.raises(ConfigurationError, match="socket_keepalive"):
        parse("redis://h?socket_keepalive=1")


@pytest.mark.parametrize(
    ("query", "match"),
    [
        ("command_timeout=fast", "command_timeout"),
        ("command_timeout=0", "command_timeout must be positive"),
        ("connect_timeout=-1", "connect_timeout must be positive"),
        ("max_connections=1", "max_connections"),
        ("max_connections=lots", "max_connections"),
        ("db=x", "db"),
        ("key_prefix=%7Bopen", "hash tag"),
        # found by review: anything but a known true word silently meant "no cluster"
        ("cluster=maybe", "bad value 'maybe' for cluster"),
        ("cluster=flase", "for cluster"),
        # found by review: the server refused it at the handshake with a raw hiredis error
        ("client_name=has%20space", "client_name"),
    ],
)
def test_bad_option_values(query: str, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        parse(f"redis://h?{query}")


def test_a_cluster_url_cannot_also_say_cluster_false() -> None:
    with pytest.raises(ConfigurationError, match="cluster=false"):
        parse("redis+cluster://h:1?cluster=false")
    assert parse("redis://h:1?cluster=off").cluster is False
    assert parse("redis://h:1?cluster=on").cluster is True


def test_connect_uses_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEFAULT_URL_ENV, "redis://from-env:6390/5")
    client = connect()
    assert (client.settings.host, client.settings.port, client.settings.db) == (
        "from-env",
        6390,
        5,
    )
    # an explicit URL wins over the environment
    assert connect("redis://explicit:1234").settings.host == "explicit"


def test_connect_without_url_or_env_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(DEFAULT_URL_ENV, raising=False)
    with pytest.raises(ConfigurationError, match=DEFAULT_URL_ENV):
        connect()
    with pytest.raises(ConfigurationError):
        connect(None)


def test_connect_options_override_url() -> None:
    client = connect("redis://h?command_timeout=3", command_timeout=0.5, key_prefix="x:")
    assert client.settings.command_timeout == 0.5
    assert client.key_prefix == "x:"
    stats = client.statistics()  # nothing is opened before the client is entered
    assert not stats.entered and stats.connections_opened == 0


@pytest.mark.anyio
async def test_connect_from_env_reaches_the_server(
    monkeypatch: pytest.MonkeyPatch, server_url: str
) -> None:
    monkeypatch.setenv(DEFAULT_URL_ENV, server_url)
    async with connect() as client:
        assert await client.execute("PING") == b"PONG"


def test_a_user_without_a_password_is_a_user() -> None:
    """Found by review: redis://alice@host was read as the default user's password 'alice';
    the documented form is user[:password], so it is the ACL user alice (nopass)."""
    s = parse("redis://alice@db.local")
    assert (s.username, s.password) == ("alice", None)


@pytest.mark.parametrize(
    "query", ["cluster", "comand_timeout", "command_timeout=", "key_prefix=a&key_prefix"]
)
def test_an_option_without_a_value_is_refused(query: str) -> None:
    """Found by review: options without a value were dropped silently (?cluster connected to
    one server; a misspelt bare option passed unnoticed)."""
    with pytest.raises(ConfigurationError, match=r"no value|more than once"):
        parse(f"redis://db.local?{query}")
