"""The fenced Python blocks of README.md's "Use spec_ref to test your verifier" section, for the tests that
execute them."""

from __future__ import annotations

import re
from pathlib import Path

SECTION = "## Use spec_ref to test your verifier"


def section_code_blocks() -> list[str]:
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end >= 0 else len(text)]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
