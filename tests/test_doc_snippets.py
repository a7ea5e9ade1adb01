"""Every Python snippet in README.md and docs/*.md runs as written, against real servers.

Each block (see ``helpers/snippets.py`` for the ``continues`` / ``no-run`` conventions) is
written to a file and run as ``python <file>`` in a fresh process, on the embedded Valkey and
on Redis 7.0, with ``$RESPIRE_REDIS_URL`` carrying a random key prefix; the keys it leaves are
deleted afterwards. A snippet fails on a non-zero exit, a traceback on stderr (handler failures
are logged with one) or when it does not finish within its timeout (a worker that never stops).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.keyspace import new_name, release_keys_sync
from helpers.snippets import Snippet, SnippetError, collect, extract

ROOT = Path(__file__).resolve().parent.parent
SNIPPETS = collect(ROOT)
RUNNABLE = [s for s in SNIPPETS if s.run]
COMPILE_ONLY = [s for s in SNIPPETS if not s.run]
TIMEOUT = float(os.environ.get("RESPIRE_SNIPPET_TIMEOUT", "90"))

pytestmark = pytest.mark.slow


def run_program(
    code: str, directory: Path, name: str, env: dict[str, str], timeout: float = TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` as ``python <name>.py`` in ``directory``; kill its process group on timeout."""
    script = directory / f"{name}.py"
    script.write_text(code, encoding="utf-8")
    process = subprocess.Popen(
        [sys.executable, script.name],
        cwd=directory,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(
            f"{name} did not finish within {timeout:.0f} s\n--- stdout\n{stdout}\n"
            f"--- stderr\n{stderr}"
        )
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def snippet_env(url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPIRE_")}
    env["PYTHONUNBUFFERED"] = "1"
    if url is not None:
        env["RESPIRE_REDIS_URL"] = url
    return env


def module_name(snippet: Snippet) -> str:
    stem = snippet.path.replace("/", "_").replace(".", "_").replace("-", "_")
    return f"{stem}_{snippet.line}"


@pytest.mark.parametrize("snippet", RUNNABLE, ids=[s.id for s in RUNNABLE])
def test_snippet_runs(snippet: Snippet, server_url: str, tmp_path: Path) -> None:
    prefix = new_name("doc")
    url = f"{server_url}{'&' if '?' in server_url else '?'}key_prefix={prefix}:"
    try:
        result = run_program(snippet.code, tmp_path, module_name(snippet), snippet_env(url))
    finally:
        release_keys_sync(server_url, f"*{prefix}*")
    where = snippet.id + "".join(f"+{line}" for line in snippet.joined_lines)
    report = f"{where}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    assert result.returncode == 0, f"exit code {result.returncode}: {report}"
    if not snippet.traceback_expected:
        assert "Traceback (most recent call last)" not in result.stderr, report


@pytest.mark.parametrize("snippet", COMPILE_ONLY, ids=[s.id for s in COMPILE_ONLY])
def test_no_run_snippet_compiles(snippet: Snippet) -> None:
    snippet.compile()
    pytest.skip(f"{snippet.id}: marked no-run (compiled only)")


def test_every_runnable_snippet_compiles() -> None:
    """Fast feedback before any server is involved."""
    for snippet in RUNNABLE:
        snippet.compile()


def test_runnable_snippets_are_ruff_clean(tmp_path: Path) -> None:
    """Snippets are code people copy: held to the project's lint and format rules."""
    for snippet in RUNNABLE:
        (tmp_path / f"{module_name(snippet)}.py").write_text(snippet.code, encoding="utf-8")
    config = str(ROOT / "pyproject.toml")
    for args in (["check", "--no-cache"], ["format", "--no-cache", "--check", "--diff"]):
        result = subprocess.run(
            [sys.executable, "-m", "ruff", *args, "--config", config, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_snippets_are_found() -> None:
    assert any(s.path == "README.md" for s in RUNNABLE)
    for doc in ("job-queue", "stream-workers", "reliable-queue", "topics", "scheduling"):
        assert any(s.path == f"docs/{doc}.md" for s in RUNNABLE), doc
    # no-run is for blocks that are not programs; keep it the exception
    assert len(COMPILE_ONLY) <= len(RUNNABLE) // 3, [s.id for s in COMPILE_ONLY]


def test_readme_snippet_does_not_run_the_worker_at_import(tmp_path: Path) -> None:
    """The README example is a module ``serve`` can load: importing it starts nothing."""
    readme = [s for s in RUNNABLE if s.path == "README.md"]
    assert readme, "README.md has no runnable Python snippet"
    (tmp_path / "readme_app.py").write_text(readme[0].code, encoding="utf-8")
    check = (
        "from respire_actors import Worker\n"
        "from respire_actors.cli import load_app\n"
        "app = load_app('readme_app:worker')\n"
        "assert isinstance(app, Worker), app\n"
        "print('loaded', [r.queue for r in app.registrations])\n"
    )
    # no server URL at all: a module that connected or ran the worker would fail or hang
    result = run_program(check, tmp_path, "load_readme", snippet_env(None), timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("loaded ['"), result.stdout


# -- the extractor itself ------------------------------------------------------------------

DOC = """\
# Title

```python
print("one")
```

Text.

<!-- snippet: continues -->
```python
print("two")
```

```sh
echo not python
```

<!-- snippet: no-run -->
```python
f(x, *args, key=1)
```

    ```py
    print("indented")
    ```

<!-- snippet: expect-traceback -->
```python
raise SystemExit(0)
```
"""


def test_extract_joins_continuations_and_marks_no_run() -> None:
    found = extract(DOC, "x.md")
    assert [(s.line, s.run) for s in found] == [(3, True), (19, False), (23, True), (28, True)]
    assert [s.traceback_expected for s in found] == [False, False, False, True]
    assert found[0].code == 'print("one")\nprint("two")\n'
    assert found[0].joined_lines == [10]
    assert found[1].code == "f(x, *args, key=1)\n"
    assert found[2].code == 'print("indented")\n'


def test_extract_rejects_bad_directives() -> None:
    with pytest.raises(SnippetError, match="unknown snippet directive"):
        extract("<!-- snippet: skip -->\n```python\npass\n```\n", "x.md")
    with pytest.raises(SnippetError, match="no earlier Python block"):
        extract("<!-- snippet: continues -->\n```python\npass\n```\n", "x.md")
    with pytest.raises(SnippetError, match="never closed"):
        extract("```python\npass\n", "x.md")


def test_runner_fails_a_snippet_that_hangs(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception, match="did not finish"):
        run_program("import time\ntime.sleep(60)\n", tmp_path, "hang", snippet_env(None), 2)
