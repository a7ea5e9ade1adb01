"""The command line, run as a real process: exit codes, one-line errors, the demo on the
embedded server, and graceful stop on SIGINT."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from helpers.cli import ROOT, run_cli, serving
from helpers.resp import SyncRedis

from respire_actors import JobQueue, cli, embedded
from respire_actors.errors import EmbeddedServerError
from respire_actors.redis.client import connect
from supervisors import StartError


def test_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("respire_actors ")


def test_ping_prints_a_table(server_url: str) -> None:
    result = run_cli("ping", "--redis-url", server_url)
    assert result.returncode == 0, result.stderr
    assert "version" in result.stdout and "flavor" in result.stdout


def assert_one_line_startup_error(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit code 3 and nothing on stderr but one ``error:`` line containing every needle."""
    assert result.returncode == 3, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("ping", "--redis-url", "foo://x"), "unsupported Redis URL scheme"),
        (("ping", "--redis-url", "redis://127.0.0.1:1"), "cannot reach Redis"),
        (
            ("serve", "no_such_module_xyz:app", "--redis-url", "redis://127.0.0.1:6379"),
            "cannot import module",
        ),
        (
            ("serve", "examples.email_app:nothing", "--redis-url", "redis://127.0.0.1:6379"),
            "has no attribute",
        ),
        (("serve", "badpath", "--redis-url", "redis://127.0.0.1:6379"), "must look like"),
    ],
)
def test_startup_errors_are_one_line_with_exit_3(args: tuple[str, ...], needle: str) -> None:
    result = run_cli(*args)
    assert_one_line_startup_error(result, needle)


def test_usage_error_exit_2() -> None:
    assert run_cli().returncode == 2


def test_demo_runs_to_completion_on_the_embedded_server(tmp_path: Path) -> None:
    result = run_cli(
        "serve",
        "examples.email_app:app",
        "--data-dir",
        str(tmp_path / "data"),
        env={"DEMO_JOBS": "5"},
    )
    assert result.returncode == 0, result.stderr
    assert "5 of 5 jobs completed" in result.stdout
    assert (tmp_path / "data" / "appendonlydir").exists()  # AOF persistence was on


def test_sigint_stops_gracefully(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RESPIRE_REDIS_URL"}
    env["DEMO_JOBS"] = "400"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "respire_actors",
            "serve",
            "examples.email_app:app",
            "--data-dir",
            str(tmp_path / "data"),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if "progress" in line:
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "stopping gracefully" in err
    assert "of 400 jobs completed" in out


# ------------------------------------------------------------------------------------------
# start-up failures: one line that says what to do, exit code 3 (issue 8, item 17)


@pytest.fixture
def http_port() -> Iterator[int]:
    """A port where an HTTP server (not Redis) listens."""

    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_unusable_data_dir(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    data = tmp_path / "a-file" / "data"
    result = run_cli("serve", "examples.email_app:app", "--data-dir", str(data))
    assert_one_line_startup_error(result, f"cannot use the data directory {data}", "--data-dir")


def test_locked_data_dir(tmp_path: Path) -> None:
    # A live process holds the lock and is recorded as the directory's owner.
    data = tmp_path / "data"
    data.mkdir()
    with open(data / embedded.LOCK_FILE, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        (data / embedded.RECORD_FILE).write_text(
            json.dumps({"owner_pid": os.getpid(), "server_pid": os.getpid(), "port": 1})
        )
        result = run_cli("serve", "examples.email_app:app", "--data-dir", str(data))
    assert_one_line_startup_error(
        result, f"{data} is in use by another process (pid {os.getpid()})", "--data-dir"
    )


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (("--log-level", "loud", "ping"), {}),
        (("ping", "--log-level", "loud"), {}),
        (("ping",), {"RESPIRE_LOG_LEVEL": "loud"}),
    ],
    ids=["before-command", "after-command", "environment"],
)
def test_bad_log_level(args: tuple[str, ...], env: dict[str, str]) -> None:
    result = run_cli(*args, env=env)
    assert_one_line_startup_error(result, "unknown log level 'loud'", "debug, info")


def test_an_object_that_is_not_an_app() -> None:
    result = run_cli("serve", "json:dumps", "--redis-url", "redis://127.0.0.1:6379")
    assert_one_line_startup_error(
        result, "'json:dumps' is not an app", "async def run(self, client, *, task_status"
    )


def test_a_module_failing_at_import_is_named() -> None:
    result = run_cli(
        "serve", "tests.apps.broken_import:app", "--redis-url", "redis://127.0.0.1:6379"
    )
    assert_one_line_startup_error(
        result, "importing module 'tests.apps.broken_import' failed", "RuntimeError: boom"
    )


def test_an_app_whose_run_is_not_async() -> None:
    result = run_cli(
        "serve", "tests.apps.broken_apps:sync_run", "--redis-url", "redis://127.0.0.1:6379"
    )
    assert_one_line_startup_error(result, "SyncRun.run is not async", "async def run")
    # found by review: the sync run used to be called (and could block for ever) first
    assert "sync run called" not in result.stdout


def test_an_app_whose_run_takes_no_task_status() -> None:
    """Found by review: `async def run(self, client)` failed with a bare TypeError about an
    unexpected keyword argument, which did not say what to change."""
    result = run_cli(
        "serve", "tests.apps.broken_apps:no_task_status", "--redis-url", "redis://127.0.0.1:6379"
    )
    assert_one_line_startup_error(result, "run(client, task_status=...)", "task_status=anyio")


def test_a_one_shot_app_that_never_reports_ready_exits_0_when_it_returns() -> None:
    """It used to be reported as a start-up failure (exit 3) after its work was done."""
    result = run_cli(
        "serve", "tests.apps.broken_apps:one_shot", "--redis-url", "redis://127.0.0.1:6379"
    )
    assert result.returncode == 0, result.stderr
    assert "one-shot work: PONG" in result.stdout


def test_a_module_whose_dependency_is_missing_says_so() -> None:
    """The module was found: the PYTHONPATH hint would send the user the wrong way."""
    result = run_cli(
        "serve", "tests.apps.missing_dependency:app", "--redis-url", "redis://127.0.0.1:6379"
    )
    line = assert_one_line_startup_error(
        result, "not_an_installed_package_xyz", "a package it imports is not installed"
    )
    assert "PYTHONPATH" not in line


def test_a_factory_that_fails() -> None:
    result = run_cli("serve", "fractions:Fraction", "--redis-url", "redis://127.0.0.1:6379")
    assert_one_line_startup_error(result, "is not an app")


@pytest.fixture
def password_server(tmp_path: Path) -> Iterator[int]:
    """A valkey-server that requires the password ``s3cret``; yields its port."""
    port = embedded.free_port()
    with subprocess.Popen(
        [
            str(embedded.valkey_binary()),
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--requirepass", "s3cret",
            "--dir", str(tmp_path),
            "--save", "",
            "--logfile", "valkey.log",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as proc:  # fmt: skip
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    with SyncRedis("127.0.0.1", port, timeout=1) as conn:
                        conn.execute("AUTH", "s3cret")
                    break
                except OSError:
                    assert time.monotonic() < deadline and proc.poll() is None
                    time.sleep(0.02)
            yield port
        finally:
            proc.terminate()
            proc.wait()


def test_missing_password(password_server: int) -> None:
    url = f"redis://127.0.0.1:{password_server}"
    for command in (("serve", "examples.email_app:app"), ("ping",)):
        result = run_cli(*command, "--redis-url", url)
        assert_one_line_startup_error(
            result, f"127.0.0.1:{password_server}", "requires a password", "--redis-url"
        )
    wrong = run_cli("ping", "--redis-url", f"redis://:nope@127.0.0.1:{password_server}")
    line = assert_one_line_startup_error(wrong, "refused the user name or password")
    assert "nope" not in line
    right = run_cli("ping", "--redis-url", f"redis://:s3cret@127.0.0.1:{password_server}")
    assert right.returncode == 0, right.stderr


@contextlib.contextmanager
def tcp_listener(reply: bytes | None) -> Iterator[int]:
    """A plain TCP listener that reads each request, then answers ``reply`` (or nothing) and
    closes; yields its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)
    stop = threading.Event()

    def answer() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn, contextlib.suppress(OSError):
                conn.settimeout(2)
                conn.recv(1024)
                if reply is not None:
                    conn.sendall(reply)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join()
        listener.close()


@pytest.fixture
def garbage_port() -> Iterator[int]:
    """Answers anything with an HTTP error line."""
    with tcp_listener(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n") as port:
        yield port


@pytest.fixture
def closing_port() -> Iterator[int]:
    """Reads the request and closes (as PostgreSQL does)."""
    with tcp_listener(None) as port:
        yield port


@pytest.mark.parametrize("listener", ["http_port", "garbage_port", "closing_port"])
def test_a_port_that_is_not_redis(listener: str, request: pytest.FixtureRequest) -> None:
    """Found by review: the message nested a second one ("cannot reach Redis ... the command
    may have run ... unset RESPIRE_REDIS_URL"), and a server that closes the connection was
    not recognised at all."""
    port = request.getfixturevalue(listener)
    url = f"redis://127.0.0.1:{port}"
    for command in (("serve", "examples.email_app:app"), ("ping",)):
        result = run_cli(*command, "--redis-url", url, timeout=90)
        line = assert_one_line_startup_error(
            result, f"127.0.0.1:{port}", "did not answer like a Redis server", "host and port"
        )
        assert "may have run" not in line and "cannot reach Redis" not in line


def test_ping_without_url_looks_for_the_embedded_server(tmp_path: Path) -> None:
    # Like serve: $RESPIRE_REDIS_URL, else the embedded server of the data directory. With
    # none running there, it says so (the running case is in test_serve_processes.py).
    data = tmp_path / "data"
    result = run_cli("ping", "--data-dir", str(data))
    assert_one_line_startup_error(result, f"no embedded server is running in {data}", "serve")
    env_data = run_cli("ping", env={"RESPIRE_DATA_DIR": str(data)})
    assert_one_line_startup_error(env_data, f"no embedded server is running in {data}")


def test_debug_log_level_adds_the_traceback(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    args = ("serve", "examples.email_app:app", "--data-dir", str(tmp_path / "a-file" / "d"))
    quiet = run_cli(*args)
    assert "Traceback" not in quiet.stderr
    loud = run_cli(*args, "--log-level", "debug")
    assert loud.returncode == 3
    assert "Traceback" in loud.stderr
    assert loud.stderr.strip().splitlines()[-1] == quiet.stderr.strip()


def test_root_cause_unwraps_groups_and_supervisor_errors() -> None:
    real = EmbeddedServerError("the real cause")
    start = StartError(supervisor="respire", child="embedded-valkey")
    start.__cause__ = ExceptionGroup("Exceptions from Trio nursery", [real])
    group = BaseExceptionGroup("outer", [ExceptionGroup("inner", [start])])
    assert cli.root_cause(group) is real
    other = ValueError("not ours")
    assert cli.root_cause(ExceptionGroup("g", [other, real])) is real  # ours is preferred
    assert cli.root_cause(ExceptionGroup("g", [other])) is other


# ------------------------------------------------------------------------------------------
# the banner, the throughput summary, --help (issue 8, item 18)


def test_worker_only_serve_prints_a_banner_and_throughput(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with serving(
        "tests.apps.counting:worker",
        "--data-dir",
        str(data),
        "--stats-interval",
        "0.5",
        stderr_path=tmp_path / "serve.err",
    ) as served:
        banner = served.wait_for_stderr("worker 'counting' on Valkey")
        assert f"(embedded, data in {data})" in banner
        queue_line = served.wait_for_stderr("queue 'counting'")
        assert "-> tests.apps.counting.count_run, concurrency 16" in queue_line
        served.wait_for_stderr("throughput: 0.0 jobs/s")
        record = embedded.read_record(data)
        assert record is not None
        anyio.run(enqueue_items, record.url, 30)
        line = served.wait_for_stderr("acked 30")  # all 30 within one period on a quiet box
        assert "retried 0, dead-lettered 0, failed 0, in flight 0" in line
        served.signal(signal.SIGINT)
        assert served.wait() == 0, served.stderr()


async def enqueue_items(url: str, count: int) -> None:
    from tests.apps.counting import CODEC, QUEUE, Item  # the app's own codec and queue

    async with connect(url) as client:
        await JobQueue(client, QUEUE, CODEC).enqueue_many((f"i{n}", Item(n)) for n in range(count))


def test_throughput_line() -> None:
    before = {"acked": 10, "retried": 1, "dead_lettered": 0, "failed": 0}
    after = {"acked": 110, "retried": 3, "dead_lettered": 1, "failed": 2}
    assert cli.throughput_line(before, after, 10.0, 4) == (
        "throughput: 10.3 jobs/s (103 in 10 s): acked 100, retried 2, dead-lettered 1, "
        "failed 2, in flight 4"
    )
    assert cli.throughput_line(before, before, 10.0, None).endswith("failed 0")


@pytest.mark.parametrize("command", [(), ("serve",), ("ping",), ("info",)])
def test_help_is_plain_text_with_exit_codes(command: tuple[str, ...]) -> None:
    result = run_cli(*command, "--help")
    assert result.returncode == 0
    text = result.stdout
    assert "::" not in text and "``" not in text and ":class:" not in text
    if command:
        assert "exit codes:" in text
        for code in ("0  success", "1  runtime failure", "2  usage error", "3  start-up"):
            assert code in text


def test_every_option_is_described() -> None:
    parser = cli._parser()
    parsers = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            parsers += list(action.choices.values())
    for each in parsers:
        for action in each._actions:
            assert action.help, f"{each.prog}: {action.option_strings or action.dest}"


def test_operator_tables_never_split_an_id_on_a_narrow_terminal() -> None:
    """Found by review: on an 80-column terminal every column folded, so a dead-letter id came
    out as '17961739419' on one line and '28-4' on the next and could not be copied back into
    `retry`; the table now keeps each cell on one line, wider than the terminal if need be."""
    import io

    from rich.console import Console

    from respire_actors.cli_admin import _table

    out = io.StringIO()
    row = ["1796173941928-4", "order-12345678", "processing-failed", 12345678]
    _table(
        "dead letters",
        ["dead id", "job id", "reason", "attempts"],
        [row],
        Console(file=out, width=40),
    )
    text = out.getvalue()
    for cell in row:
        assert str(cell) in text
    assert "…" not in text


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--shutdown-timeout", "-5"),
        ("--shutdown-timeout", "nan"),
        ("--stats-interval", "-1"),
        ("--stats-interval", "inf"),
        ("--stats-interval", "soon"),
    ],
)
def test_serve_refuses_bad_durations_as_usage_errors(flag: str, value: str) -> None:
    """Found by review: a negative or NaN --shutdown-timeout failed after start-up naming an
    internal ChildSpec (exit 3), and a negative --stats-interval was accepted."""
    done = run_cli("serve", "examples.email_app:app", flag, value)
    assert done.returncode == 2, done.stderr
    assert f"argument {flag}: {value!r}" in done.stderr
