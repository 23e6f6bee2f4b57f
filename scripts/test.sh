#!/usr/bin/env bash
# The whole test suite: strict type checks, then every test (exact, property, differential, engine, proofs
# runner and the `statistical` Monte Carlo tests). CI=true selects the derandomized Hypothesis profile.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
"$PYTHON" -m mypy --strict spec_ref spec_fast
"$PYTHON" -m pytest -q -p no:cacheprovider --durations=15 "$@"
