#!/usr/bin/env bash
# Build llama.cpp's own OpenAI-compatible server (llama-server) for bench/serve.py's comparison on the same
# GGUF file: scripts/build_llama_cpp.sh with that one target.
#   bash scripts/build_llama_server.sh [BUILD_DIR]     # prints the binary's path on the last line
set -euo pipefail
exec bash "$(dirname "$0")/build_llama_cpp.sh" "${1:-${TMPDIR:-/tmp}/llama-server-build}" llama-server
