"""docs/conformance.md's Python examples run as written: the ten-line check of a verifier (exact mode) and the
replay of a committed counterexample with spec_ref.exact_law, which must give the total variation the report
states."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def code_blocks() -> list[str]:
    text = (ROOT / "docs" / "conformance.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_the_ten_line_check_and_the_counterexample_replay_run_as_written(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = code_blocks()
    assert len(blocks) == 2
    check, replay = blocks
    assert len([line for line in check.splitlines() if line.strip() and not line.startswith("#")]) <= 14
    monkeypatch.chdir(ROOT)
    for name, block in (("check", check), ("replay", replay)):
        exec(compile(block, f"docs/conformance.md ({name})", "exec"), {"__name__": "docs"})
    printed = capsys.readouterr().out
    assert "check_chain_verifier(my_verifier): lossless (exact mode" in printed
    assert printed.strip().splitlines()[-1].startswith("TV 1/6")
