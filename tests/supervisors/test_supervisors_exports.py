"""The public surface of ``supervisors`` and its independence from the rest of the project."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import supervisors

EXPECTED = {
    "Backoff",
    "BackoffTracker",
    "ChildContext",
    "ChildSnapshot",
    "ChildSpec",
    "DuplicateChild",
    "Mailbox",
    "MailboxClosed",
    "MailboxEmpty",
    "MailboxError",
    "MailboxFull",
    "MailboxReceiver",
    "MailboxSender",
    "MailboxStatistics",
    "Restart",
    "RestartIntensity",
    "RestartIntensityExceeded",
    "RunState",
    "StartError",
    "Strategy",
    "Supervisor",
    "SupervisorError",
    "SupervisorSnapshot",
    "UnknownChild",
    "current_child",
    "render_snapshot",
}

PACKAGE_DIR = Path(supervisors.__file__).parent


def test_all_is_exactly_the_public_api() -> None:
    assert set(supervisors.__all__) == EXPECTED
    assert len(supervisors.__all__) == len(EXPECTED), "duplicates in __all__"


def test_every_name_in_all_exists_and_is_public() -> None:
    for name in supervisors.__all__:
        assert hasattr(supervisors, name), name
        obj = getattr(supervisors, name)
        assert getattr(obj, "__module__", "supervisors").startswith("supervisors"), name


def test_no_other_public_names_leak() -> None:
    public = {
        name
        for name, value in vars(supervisors).items()
        if not name.startswith("_") and not isinstance(value, type(sys))
    }
    assert public == EXPECTED


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from supervisors import *", namespace)
    assert set(namespace) - {"__builtins__"} == EXPECTED


def test_errors_form_the_documented_tree() -> None:
    assert issubclass(supervisors.StartError, supervisors.SupervisorError)
    assert issubclass(supervisors.RestartIntensityExceeded, supervisors.SupervisorError)
    assert issubclass(supervisors.UnknownChild, LookupError)
    assert issubclass(supervisors.DuplicateChild, ValueError)
    for name in ("MailboxFull", "MailboxEmpty", "MailboxClosed"):
        assert issubclass(getattr(supervisors, name), supervisors.MailboxError)
    assert not issubclass(supervisors.MailboxError, supervisors.SupervisorError)


def test_importing_supervisors_loads_no_redis_and_no_respire_actors() -> None:
    code = (
        "import sys, supervisors\n"
        "bad = sorted(m for m in sys.modules\n"
        "             if m.split('.')[0] in {'coredis', 'redis', 'valkey', 'respire_actors'})\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE_DIR.parent, timeout=60)


def test_source_never_mentions_redis_or_respire_actors() -> None:
    for path in PACKAGE_DIR.glob("*.py"):
        text = path.read_text()
        for word in ("coredis", "import redis", "respire_actors"):
            assert word not in text, f"{path.name} mentions {word}"


def test_package_is_typed() -> None:
    assert (PACKAGE_DIR / "py.typed").is_file()
