"""Every relative link in README.md and docs/ points at a file that exists (found by review:
the failure-contract page linked two scenario pages under names they never had)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    out = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            title = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
            out.add(title)
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in _LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: not checked here
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        missing_anchor = bool(anchor) and resolved.suffix == ".md"
        if not resolved.exists() or (missing_anchor and anchor not in _anchors(resolved)):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to missing targets: {broken}"
