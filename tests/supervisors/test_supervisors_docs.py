"""The complete example in docs/supervisors.md runs and prints what the text says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "supervisors.md"

pytestmark = pytest.mark.anyio


def example_source() -> str:
    blocks: list[str] = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    return next(block for block in blocks if "async def main()" in block)


async def test_documented_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    namespace: dict[str, object] = {"__name__": "docs_example"}
    exec(compile(example_source(), str(DOC), "exec"), namespace)
    await namespace["main"]()  # type: ignore[operator]
    out = capsys.readouterr().out
    assert "processed: [0, 1, 2, 4, 5, 6, 7, 8, 9]" in out
    assert "last error: RuntimeError('job 3 upset the consumer')" in out
    assert re.search(r"consumer\s+running\s+1 ", out)
