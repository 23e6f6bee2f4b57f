"""The native kernels in the tests: a test that needs them skips where they cannot be built, except in CI
(``CI=true``), where an unavailable native library fails the test: a broken compile must not pass CI by
skipping every native test."""

from __future__ import annotations

import os

import pytest


def require_native() -> None:
    """Skip (or, with ``CI=true``, fail) the calling test unless the native kernels are available."""
    from spec_fast.lean import native

    if native.available():
        return
    message = f"the native kernels are unavailable here: {native.unavailable_reason()}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + " (CI=true: a native test may not skip)")
    pytest.skip(message)
