"""Shared pytest configuration: Hypothesis profiles (docs/testing.md section 5).

* ``ci``   — loaded when ``CI=true``: derandomized (examples fixed by a hash of the test), no example
  database, no deadline, ``print_blob=True``;
* ``dev``  — the default: random exploration with the example database;
* ``deep`` — long runs: 2000 examples per test, random, database on (``HYPOTHESIS_PROFILE=deep``).

Optional dependencies: ``spec_ref`` needs only numpy and scipy, so its tests (``pytest -m statistical``
included) must run where torch and transformers are not installed. Where one of them is missing, a test
module whose import fails for that reason is reported as *skipped* with the reason, instead of as a
collection error (scripts/test_numpy_only.sh checks this environment).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

#: Packages some test modules need but spec_ref does not.
OPTIONAL_DEPENDENCIES = ("torch", "transformers")
MISSING_DEPENDENCIES = tuple(name for name in OPTIONAL_DEPENDENCIES if importlib.util.find_spec(name) is None)


class _ModuleNeedingOptionalDependency(pytest.Module):
    """A test module that is skipped, with the reason, when its import needs a missing optional package."""

    def _getobj(self) -> Any:
        try:
            return super()._getobj()
        except pytest.Collector.CollectError as error:
            cause = error.__cause__
            missing = getattr(cause, "name", None) or ""
            if isinstance(cause, ModuleNotFoundError) and missing.split(".")[0] in MISSING_DEPENDENCIES:
                where = self.path.relative_to(self.config.rootpath).as_posix()
                raise pytest.skip.Exception(
                    f"{where} needs {missing}, which is not installed (spec_ref itself needs only numpy and scipy)",
                    allow_module_level=True,
                ) from None
            raise


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    if MISSING_DEPENDENCIES:
        return _ModuleNeedingOptionalDependency.from_parent(parent, path=module_path)  # type: ignore[no-any-return]
    return None


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


_CACHE_FOLDER: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """De-quantised models and the native kernels (spec_fast.cache) go to a fresh folder per session, never
    the user's cache; set before collection (a module that asks whether the kernels are available at import
    builds them) and removed at the end (an entry of SmolLM2 takes 540 MB)."""
    if not _CACHE_FOLDER:
        _CACHE_FOLDER.append(tempfile.mkdtemp(prefix="spec-fast-cache-"))
        os.environ["SPEC_FAST_CACHE"] = _CACHE_FOLDER[0]


def pytest_unconfigure(config: pytest.Config) -> None:
    while _CACHE_FOLDER:
        shutil.rmtree(_CACHE_FOLDER.pop(), ignore_errors=True)


@pytest.fixture
def native_kernels() -> None:
    """The native kernels must be available: skip without them, fail with ``CI=true`` (tests/native_kernels.py)."""
    from tests.native_kernels import require_native

    require_native()
