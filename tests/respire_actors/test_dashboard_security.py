"""The dashboard's security decisions and settings, without a server: who is let in, which
forms are accepted, and which settings are refused."""

from __future__ import annotations

import base64

import pytest

from respire_actors.dashboard import BasicAuth, DashboardConfig, TokenAuth
from respire_actors.dashboard.charts import minute_chart
from respire_actors.dashboard.security import (
    Identity,
    Refusal,
    RevokedSessions,
    authenticate,
    csrf_token,
    csrf_valid,
    is_loopback,
    new_session,
    session_value,
)
from respire_actors.dashboard.server import config_from_environment, is_loopback_host
from respire_actors.errors import ConfigurationError, ValidationError

TOKEN = "a-token-of-enough-length"
SECRET = b"s" * 32


def auth(config: DashboardConfig, host: str = "10.0.0.5", **kw: str | None) -> object:
    return authenticate(
        config,
        client_host=host,
        authorization=kw.get("authorization"),
        session_cookie=kw.get("session"),
        host_header=kw.get("host_header", "127.0.0.1:8080"),
    )


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.1", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("10.0.0.1", False),
        ("::ffff:10.0.0.1", False),
        ("0.0.0.0", False),
        ("localhost", False),  # a client address is never a name
        ("", False),
        (None, False),
    ],
)
def test_loopback_addresses(host: str | None, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_without_auth_only_loopback_clients_get_in() -> None:
    config = DashboardConfig(secret=SECRET)
    assert auth(config, "127.0.0.1") == Identity("loopback")
    assert auth(config, "192.168.1.2") == Refusal("forbidden")
    assert auth(config, None) == Refusal("forbidden")
    # credentials change nothing when no auth is configured
    assert auth(config, "192.168.1.2", authorization=f"Bearer {TOKEN}") == Refusal("forbidden")


@pytest.mark.parametrize(
    ("host_header", "served"),
    [
        ("127.0.0.1:8080", True),
        ("127.0.0.1", True),
        ("localhost:8080", True),
        ("LOCALHOST", True),
        ("localhost.:9", True),
        ("app.localhost:8080", True),
        ("[::1]:8080", True),
        ("[::1]", True),
        # DNS rebinding: another name whose DNS answer was switched to 127.0.0.1
        ("rebind.attacker.example:8080", False),
        ("localhost.attacker.example", False),
        ("127.0.0.1.nip.io", False),
        ("[::1]x", False),
        ("127.0.0.1:x", False),
        ("10.0.0.5:8080", False),
        ("", False),
        (None, False),
    ],
)
def test_without_auth_the_host_must_be_a_loopback_name(
    host_header: str | None, served: bool
) -> None:
    """A page on a rebound name (its DNS answer switched to 127.0.0.1) reached the dashboard
    through the user's browser: the Origin and CSRF checks agreed with its own Host."""
    config = DashboardConfig(secret=SECRET)
    expected = Identity("loopback") if served else Refusal("forbidden")
    assert auth(config, "127.0.0.1", host_header=host_header) == expected


def test_token_auth_by_header_or_session_cookie() -> None:
    config = DashboardConfig(auth=TokenAuth(TOKEN), secret=SECRET)
    assert auth(config, authorization=f"Bearer {TOKEN}") == Identity("token")
    assert auth(config, authorization=f"bearer {TOKEN}") == Identity("token")
    assert auth(config, session=new_session(SECRET, TOKEN)) == Identity("token")
    for refused in (
        {},
        {"authorization": "Bearer wrong-token-of-length"},
        {"authorization": f"Basic {TOKEN}"},
        {"authorization": f"Bearer {TOKEN}x"},
        {"session": TOKEN},  # the cookie holds an HMAC, never the token itself
        {"session": session_value(SECRET, TOKEN)},  # the old unexpiring cookie
        {"session": new_session(b"another secret!!", TOKEN)},
        {"session": new_session(SECRET, "another-token-of-length")},  # the token was rotated
    ):
        assert auth(config, **refused) == Refusal("login"), refused
    # loopback is no exception once auth is configured
    assert auth(config, "127.0.0.1") == Refusal("login")


def test_sessions_expire_differ_per_login_and_end_at_logout() -> None:
    """Found by review: the session cookie was HMAC(secret, token): the same for every login,
    never expiring, and still valid after a logout (which only deleted it in the browser)."""
    config = DashboardConfig(auth=TokenAuth(TOKEN), secret=SECRET)
    first, second = new_session(SECRET, TOKEN), new_session(SECRET, TOKEN)
    assert first != second
    old = new_session(SECRET, TOKEN, now=1_000_000)  # issued long ago: expired
    assert auth(config, session=old) == Refusal("login")
    issued, sid, mac = first.split(".")
    forged = f"{int(issued) + 3600}.{sid}.{mac}"  # a later issue time breaks the HMAC
    assert auth(config, session=forged) == Refusal("login")
    revoked = RevokedSessions()
    revoked.revoke(first)

    def with_revoked(cookie: str) -> object:
        return authenticate(
            config,
            client_host="10.0.0.5",
            authorization=None,
            session_cookie=cookie,
            host_header="127.0.0.1:8080",
            revoked=revoked,
        )

    assert with_revoked(first) == Refusal("login")  # logged out: replaying it fails
    assert with_revoked(second) == Identity("token")  # another login's session lives on


def test_basic_auth() -> None:
    config = DashboardConfig(auth=BasicAuth("ops", "correct horse"), secret=SECRET)

    def basic(user_password: str) -> str:
        return "Basic " + base64.b64encode(user_password.encode()).decode()

    assert auth(config, authorization=basic("ops:correct horse")) == Identity("ops")
    for wrong in ("ops:wrong", "other:correct horse", "ops", "", "ops:correct horse "):
        assert auth(config, authorization=basic(wrong)) == Refusal("challenge"), wrong
    assert auth(config, authorization="Basic !!!not-base64") == Refusal("challenge")
    assert auth(config, authorization=f"Bearer {TOKEN}") == Refusal("challenge")
    assert auth(config) == Refusal("challenge")


def test_csrf_token_must_match_the_cookie_and_the_origin() -> None:
    nonce = "0123456789abcdef0123456789abcdef"
    token = csrf_token(SECRET, nonce)
    own = "http://127.0.0.1:8080"
    assert csrf_valid(SECRET, nonce=nonce, submitted=token, origin=None, own_origin=own)
    assert csrf_valid(SECRET, nonce=nonce, submitted=token, origin=own, own_origin=own)
    assert csrf_valid(SECRET, nonce=nonce, submitted=token, origin=own.upper(), own_origin=own)
    refused = [
        {"nonce": None, "submitted": token, "origin": None},
        {"nonce": nonce, "submitted": None, "origin": None},
        {"nonce": nonce, "submitted": "", "origin": None},
        {"nonce": nonce, "submitted": token[:-1] + "0", "origin": None},
        {"nonce": nonce[::-1], "submitted": token, "origin": None},
        {"nonce": nonce, "submitted": nonce, "origin": None},  # plain double submit is not enough
        {"nonce": nonce, "submitted": token, "origin": "http://evil.example"},
        {"nonce": nonce, "submitted": token, "origin": "http://127.0.0.1:8081"},
        {"nonce": nonce, "submitted": token, "origin": "https://127.0.0.1:8080"},
        {"nonce": nonce, "submitted": token, "origin": "null"},
    ]
    for case in refused:
        assert not csrf_valid(SECRET, own_origin=own, **case), case  # type: ignore[arg-type]
    assert csrf_token(b"another secret!!", nonce) != token


def test_settings_are_validated() -> None:
    for bad in (
        {"page_size": 0},
        {"page_size": 501},
        {"page_size": True},
        {"metrics_minutes": 0},
        {"live_interval": 0.1},
        {"live_interval": "1"},
        {"queues": "email"},
        {"queues": ("a{b}",)},
        {"queues": ["email"]},
        {"read_only": 1},
        {"secret": b"short"},
        {"auth": "token"},
    ):
        with pytest.raises(ValidationError):
            DashboardConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        TokenAuth("short")
    with pytest.raises(ValidationError):
        BasicAuth("a:b", "password123")
    with pytest.raises(ValidationError):
        BasicAuth("ops", "short")
    assert "a-token" not in repr(TokenAuth(TOKEN))
    assert "correct" not in repr(BasicAuth("ops", "correct horse"))
    assert DashboardConfig().secret != DashboardConfig().secret  # random per process


def test_command_line_settings_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in (
        "RESPIRE_DASHBOARD_TOKEN",
        "RESPIRE_DASHBOARD_PASSWORD",
        "RESPIRE_DASHBOARD_SECRET",
    ):
        monkeypatch.delenv(name, raising=False)
    plain = config_from_environment(queues=None, basic_user=None, read_only=False,
                                    show_payloads=False)  # fmt: skip
    assert plain.auth is None
    monkeypatch.setenv("RESPIRE_DASHBOARD_TOKEN", TOKEN)
    monkeypatch.setenv("RESPIRE_DASHBOARD_SECRET", "x" * 20)
    token = config_from_environment(queues=("a",), basic_user=None, read_only=True,
                                    show_payloads=False)  # fmt: skip
    assert token.auth == TokenAuth(TOKEN) and token.secret == b"x" * 20 and token.read_only
    with pytest.raises(ConfigurationError):
        config_from_environment(queues=None, basic_user="ops", read_only=False,
                                show_payloads=False)  # fmt: skip
    monkeypatch.delenv("RESPIRE_DASHBOARD_TOKEN")
    with pytest.raises(ConfigurationError):  # no password
        config_from_environment(queues=None, basic_user="ops", read_only=False,
                                show_payloads=False)  # fmt: skip
    monkeypatch.setenv("RESPIRE_DASHBOARD_PASSWORD", "correct horse")
    basic = config_from_environment(queues=None, basic_user="ops", read_only=False,
                                    show_payloads=False)  # fmt: skip
    assert basic.auth == BasicAuth("ops", "correct horse")
    assert is_loopback_host("localhost") and is_loopback_host("::1")
    assert not is_loopback_host("0.0.0.0") and not is_loopback_host("example.com")


def test_minute_chart_scales_to_the_busiest_minute() -> None:
    from datetime import UTC, datetime

    from respire_actors.jobs import MinuteMetrics

    minutes = [
        MinuteMetrics(datetime(2026, 1, 1, 10, i, tzinfo=UTC), c, f)
        for i, (c, f) in enumerate([(0, 0), (10, 0), (5, 5), (0, 2)])
    ]
    chart = minute_chart(minutes, width=400, height=100)
    assert (chart.peak, chart.completed, chart.failed) == (10, 15, 7)
    tallest = [b for b in chart.bars if b.kind == "completed" and b.height == 100]
    assert len(tallest) == 1 and tallest[0].y == 0
    stacked = [b for b in chart.bars if "10:02" in b.title]
    assert sorted(b.height for b in stacked) == [50, 50]
    assert minute_chart([]).bars == () and minute_chart(minutes[:1]).bars == ()
