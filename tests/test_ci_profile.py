"""CI runs Hypothesis deterministically: the ``ci`` profile is derandomized with no example database
(docs/testing.md section 5), and ``CI=true`` really loads it."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings


def test_ci_profile_is_derandomized_without_database_or_deadline() -> None:
    profile = settings.get_profile("ci")
    assert profile.derandomize is True
    assert profile.database is None
    assert profile.deadline is None
    assert profile.print_blob is True


@pytest.mark.skipif(os.environ.get("CI", "").lower() != "true" or bool(os.environ.get("HYPOTHESIS_PROFILE")),
                    reason="checks the profile CI=true loads")
def test_ci_environment_loads_the_ci_profile() -> None:
    assert settings.default.derandomize is True
    assert settings.default.database is None
