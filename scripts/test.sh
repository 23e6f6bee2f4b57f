#!/usr/bin/env bash
# The whole test suite: strict type checks, then every test (exact, property, differential, engine, proofs
# runner and the `statistical` Monte Carlo tests). CI=true selects the derandomized Hypothesis profile.
# Then `pytest -m statistical` once more in a numpy-only virtual environment (scripts/test_numpy_only.sh):
# spec_ref and its tests must not need torch. Set NUMPY_ONLY=0 to skip that part.
# First, scripts/test_wheel.sh (about 20 s): the built wheel installed into a fresh virtual environment (not
# editable) must build its native kernels and decode; it is also where CI asserts that the native library
# is available (with CI=true a native test fails instead of skipping). Set WHEEL=0 to skip it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
"$PYTHON" -m mypy --strict spec_ref spec_fast conformance
if [ "${WHEEL:-1}" != "0" ]; then
    PYTHON="$PYTHON" bash scripts/test_wheel.sh
fi
# two worker processes (pytest-xdist; PYTEST_WORKERS=0 runs in this process): the machine has two cores, and
# the tests that start a Ray instance share one worker (their xdist_group)
"$PYTHON" -m pytest -q -p no:cacheprovider --durations=15 -n "${PYTEST_WORKERS:-2}" --dist loadgroup "$@"
if [ "${NUMPY_ONLY:-1}" != "0" ]; then
    PYTHON="$PYTHON" bash scripts/test_numpy_only.sh
fi
