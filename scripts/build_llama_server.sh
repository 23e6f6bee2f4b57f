#!/usr/bin/env bash
# Build llama.cpp's own OpenAI-compatible server (llama-server) from the llama.cpp sources that the
# llama-cpp-python source distribution carries (vendor/llama.cpp), for bench/serve.py's comparison on the
# same GGUF file. Only the llama-server target is built (CPU, native instructions, no OpenMP, no curl).
#   bash scripts/build_llama_server.sh [BUILD_DIR]     # prints the binary's path on the last line
# Needs cmake and a C++ compiler; downloads the sdist with pip (held to llama-cpp-python 0.3.36, the version
# bench/peers.py measured). Runs at low priority (nice 19): on a shared machine it only takes idle CPU.
set -euo pipefail
BUILD_DIR=${1:-${TMPDIR:-/tmp}/llama-server-build}
VERSION=0.3.36
mkdir -p "$BUILD_DIR"
cd "$BUILD_DIR"
if [ ! -d "llama_cpp_python-$VERSION" ]; then
  python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d .
  tar xzf "llama_cpp_python-$VERSION.tar.gz"
fi
SRC="llama_cpp_python-$VERSION/vendor/llama.cpp"
nice -n 19 cmake -S "$SRC" -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_OPENMP=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >/dev/null
nice -n 19 cmake --build build --target llama-server -j "$(nproc)"
echo "$BUILD_DIR/build/bin/llama-server"
