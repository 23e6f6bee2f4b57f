"""README.md's "Use spec_ref to test your verifier" example runs as written (numpy and scipy only).

It includes a statistical-mode check (alpha 1e-6, power 0.99 at TV 0.1, stated in the printed report) and,
in exact mode, its negative control: the buggy verifier must be reported as not lossless.
"""

from __future__ import annotations

import pytest

from tests.oracle.readme import section_code_blocks


@pytest.mark.statistical
def test_the_readme_example_runs_and_its_assertions_hold(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = section_code_blocks()
    assert len(blocks) == 2, "the section has the numpy example and the transformers adapter"
    assert "torch" not in blocks[0]
    exec(compile(blocks[0], "README.md (Use spec_ref to test your verifier)", "exec"), {"__name__": "readme"})
    printed = capsys.readouterr().out
    assert "check_token_verifier(my_verifier): lossless (exact mode" in printed
    assert "power 0.99" in printed and "alpha 1e-06" in printed
