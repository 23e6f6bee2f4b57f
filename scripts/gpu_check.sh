#!/usr/bin/env bash
# The GPU check, for a machine with a CUDA device and torch + transformers (no network, no model files):
# the CUDA-marked tests, then bench/gpu_check.py (pass cost per width on random-weight 135M/1B/8B Llama
# shapes, verification kernels at batch 64, greedy equality, host reads per step, continuous batching).
#   bash scripts/gpu_check.sh [OUT_DIR]     # default bench/results/gpu; about 3 minutes on one H100
# Set SPEC_VERIFY_COMMIT where the checkout has no .git (a copied working tree) so the report names its commit.
# Exit status: 0 when the tests pass and every bench section ran, 1 otherwise, 2 without a CUDA device.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/results/gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: no CUDA device is visible to torch" >&2
  exit 2
fi
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
# -W default: warnings are shown, not errors as in CI (this machine's torch/transformers are not CI's pins)
timeout 300 "$PYTHON" -m pytest -m gpu tests/engine/test_cuda.py tests/fast/test_kernels_parity.py tests/fast/test_rng_counter.py -q \
  -p no:cacheprovider -W default 2>&1 | tee "$OUT/pytest.log"
tests_rc=${PIPESTATUS[0]}
timeout 420 "$PYTHON" bench/gpu_check.py --out "$OUT/gpu_check" 2>&1 | tee "$OUT/bench.log"
bench_rc=${PIPESTATUS[0]}
echo "gpu_check: tests exit status $tests_rc, bench exit status $bench_rc" | tee -a "$OUT/bench.log"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
