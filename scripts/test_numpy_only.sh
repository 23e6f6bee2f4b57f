#!/usr/bin/env bash
# `pytest -m statistical` where only spec_ref's dependencies (numpy, scipy) and the test tools (hypothesis,
# pytest) are installed: torch/transformers test modules must be reported as skipped with a reason, and the
# spec_ref statistical tests must run and pass. The virtual environment is cached in build/numpy_only_venv
# (an ignored path; delete it to rebuild) and the project is installed into it editable, without dependencies.
# Extra arguments go to pytest (e.g. a subset of test paths).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=build/numpy_only_venv
# the same pinned versions as scripts/setup.sh: the derandomized CI profile's examples depend on Hypothesis's
CONSTRAINTS=scripts/constraints.txt
STAMP="$VENV/.installed-for-$( (pwd; cat "$CONSTRAINTS") | cksum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ]; then
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -c "$CONSTRAINTS" numpy scipy hypothesis pytest >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e . >&2
    touch "$STAMP"
fi
if "$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"; then
    echo "error: $VENV has torch installed; it must be a numpy-only environment (delete it to rebuild)" >&2
    exit 2
fi
# python -m puts this checkout first on sys.path, so the working tree is what is tested.
CI=${CI:-true} "$VENV/bin/python" -m pytest -m statistical -q -p no:cacheprovider "$@"
