"""Python code blocks of README.md and docs/*.md, as programs the doc tests run.

Every fenced block whose info string is ``python`` (or ``py``) is a complete program: it runs as
``python <file>`` with ``$RESPIRE_REDIS_URL`` pointing at a test server. Two directives, written
as an HTML comment on the nearest non-blank line before the opening fence, change that:

``<!-- snippet: continues -->``
    the block is appended to the previous Python block of the same file; the joined program
    runs once, named after its first block.
``<!-- snippet: no-run -->``
    the block is not a program (a signature listing, a fragment shown for its shape); it is only
    compiled (top-level ``await`` allowed), and reported as skipped. Use sparingly.
``<!-- snippet: expect-traceback -->``
    the program demonstrates a failure that is logged with its traceback (a supervisor
    restarting a crashed child): it must still exit 0, but a traceback on stderr is allowed.

Blocks in other languages (``sh``, plain output) are not collected. An unknown directive, or a
``continues`` block with nothing to continue, is an error at extraction time.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

PYTHON_LANGUAGES = frozenset({"python", "py", "python3"})
DIRECTIVES = frozenset({"continues", "no-run", "expect-traceback"})

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*snippet:\s*(?P<name>[\w-]+)\s*-->\s*$")


class SnippetError(ValueError):
    """A markdown file breaks the snippet conventions."""


@dataclass
class Snippet:
    """One program: a Python block, plus any ``continues`` blocks joined to it."""

    path: str  # relative to the repository root, e.g. "docs/job-queue.md"
    line: int  # 1-based line of the opening fence of the first block
    code: str
    run: bool = True
    traceback_expected: bool = False
    joined_lines: list[int] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    def compile(self) -> object:
        """Compile the program (top-level ``await`` allowed for no-run blocks)."""
        flags = 0 if self.run else ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        return compile(self.code, self.id, "exec", flags=flags, dont_inherit=True)


def extract(text: str, path: str) -> list[Snippet]:
    """The Python programs of one markdown text, in order."""
    lines = text.splitlines()
    snippets: list[Snippet] = []
    last_python: Snippet | None = None
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        start = i
        fence, indent = match["fence"], match["indent"]
        language = match["info"].strip().split(" ")[0].lower() if match["info"].strip() else ""
        body: list[str] = []
        i += 1
        while i < len(lines):
            closing = lines[i].strip()
            if closing.startswith(fence[0] * len(fence)) and not closing.strip(fence[0]):
                break
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        else:
            raise SnippetError(f"{path}:{start + 1}: code block is never closed")
        i += 1
        if language not in PYTHON_LANGUAGES:
            continue
        directive = _directive_before(lines, start, path)
        code = "\n".join(body) + "\n"
        if directive == "continues":
            if last_python is None:
                raise SnippetError(f"{path}:{start + 1}: 'continues' with no earlier Python block")
            last_python.code += code
            last_python.joined_lines.append(start + 1)
            continue
        snippet = Snippet(
            path,
            start + 1,
            code,
            run=directive != "no-run",
            traceback_expected=directive == "expect-traceback",
        )
        snippets.append(snippet)
        last_python = snippet
    return snippets


def _directive_before(lines: list[str], fence_index: int, path: str) -> str | None:
    j = fence_index - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    if j < 0:
        return None
    if "snippet:" not in lines[j]:
        return None
    match = _DIRECTIVE.match(lines[j])
    if match is None or match["name"] not in DIRECTIVES:
        raise SnippetError(
            f"{path}:{j + 1}: unknown snippet directive {lines[j].strip()!r}; "
            f"use one of {sorted(DIRECTIVES)}"
        )
    return match["name"]


def documented_files(root: Path) -> list[Path]:
    """README.md and every docs/*.md, in a stable order."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def collect(root: Path) -> list[Snippet]:
    """Every Python program in the repository's documentation."""
    found: list[Snippet] = []
    for file in documented_files(root):
        found += extract(file.read_text(encoding="utf-8"), file.relative_to(root).as_posix())
    return found
