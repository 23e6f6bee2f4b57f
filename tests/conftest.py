"""Shared pytest configuration: Hypothesis profiles (TESTING.md section 5).

* ``ci``   — loaded when ``CI=true``: derandomized (examples fixed by a hash of the test), no example
  database, no deadline, ``print_blob=True``;
* ``dev``  — the default: random exploration with the example database;
* ``deep`` — long runs: 2000 examples per test, random, database on (``HYPOTHESIS_PROFILE=deep``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    max_examples=100,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=50, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "deep", deadline=None, max_examples=2000, suppress_health_check=[HealthCheck.too_slow]
)

if os.environ.get("HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])
elif os.environ.get("CI", "").lower() == "true":
    settings.load_profile("ci")
else:
    settings.load_profile("dev")


@pytest.fixture(scope="session", autouse=True)
def _model_cache_in_a_temporary_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """De-quantised models (spec_fast.cache) go to a fresh folder per session, never the user's cache;
    it is removed at the end (an entry of SmolLM2 takes 540 MB)."""
    folder = str(tmp_path_factory.mktemp("spec-fast-cache"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPEC_FAST_CACHE", folder)
        yield folder
    shutil.rmtree(folder, ignore_errors=True)
