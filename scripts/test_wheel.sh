#!/usr/bin/env bash
# A real install, as a user gets it: build the wheel, install it (not editable) into a fresh virtual
# environment, and decode from there, outside the checkout (so nothing is imported from the working tree).
# The environment sees the already installed dependencies (--system-site-packages: torch is not downloaded
# again); the check below makes sure spec_fast and spec_ref themselves come from the wheel. The cache
# ($SPEC_FAST_CACHE) is a temporary folder: nothing is written to the user's.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
CONSTRAINTS=scripts/constraints.txt
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore SPEC_FAST_CACHE="$WORK/cache"
"$PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/dist" . >&2
WHEEL=$(ls "$WORK"/dist/spec_verify-*.whl)
"$PYTHON" -m venv --system-site-packages "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q -c "$CONSTRAINTS" "$WHEEL" >&2
ROOT=$(pwd)
cd "$WORK"
"$WORK/venv/bin/python" - "$ROOT" <<'PY'
import pathlib, sys, zipfile
import spec_fast, spec_ref
from spec_fast.lean import native
venv = pathlib.Path(sys.prefix).resolve()
for module in (spec_fast, spec_ref):
    where = pathlib.Path(module.__file__).resolve()
    assert venv in where.parents, f"{module.__name__} imported from {where}, not from the wheel in {venv}"
sources = sorted(pathlib.Path(s).name for s in native._SOURCES)
shipped = sorted(pathlib.Path(p).name for p in (pathlib.Path(sys.argv[1]) / "spec_fast" / "lean").glob("*.c"))
assert sources == shipped and all(pathlib.Path(s).is_file() for s in native._SOURCES), (sources, shipped)
assert native.available(), f"the installed wheel cannot build its native kernels: {native.unavailable_reason()}"
print(f"wheel: spec_fast and spec_ref from {venv}; native kernels built from {', '.join(sources)}", file=sys.stderr)
PY
"$WORK/venv/bin/spec-fast" --version
OUT=$("$WORK/venv/bin/spec-fast" generate "Name a colour." --max-new-tokens 4 --threads 1 -q)
[ -n "$OUT" ] || { echo "error: spec-fast generate from the wheel printed nothing" >&2; exit 1; }
echo "wheel: spec-fast generate -> $OUT" >&2
"$WORK/venv/bin/python" -m spec_ref.demo >/dev/null
"$WORK/venv/bin/spec-ref-demo" >/dev/null
echo "wheel: OK ($(basename "$WHEEL"))" >&2
