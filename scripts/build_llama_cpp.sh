#!/usr/bin/env bash
# Build llama.cpp's own tools natively from the llama.cpp sources that the llama-cpp-python source distribution
# carries (vendor/llama.cpp): the anchors our benchmarks compare against, on the same GGUF file.
#   bash scripts/build_llama_cpp.sh [BUILD_DIR] [TARGET ...]   # prints each built binary's path, one per line
# Default targets: llama-server (bench/serve.py), llama-bench (pass cost, tg/pp), llama-simple, llama-lookup
# (llama.cpp's prompt-lookup speculative decoding) and llama-quantize (the Q8_0 re-quantisation row); then
# llama-decode (bench/native/llama_decode.c: plain decoding over libllama with a thread count, token ids in and
# the prefill and the decode timed apart, which llama-simple cannot do) is compiled against the built library. CPU only, native instructions (-DGGML_NATIVE=ON), no OpenMP, no curl.
# Needs cmake, ninja and a C++ compiler; downloads the sdist with pip (held to llama-cpp-python 0.3.36, the
# version bench/peers.py measured). Runs at low priority (nice 19): on a shared machine it only takes idle CPU.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
BUILD_DIR=${1:-${TMPDIR:-/tmp}/llama-cpp-build}
shift || true
mkdir -p "$BUILD_DIR"
BUILD_DIR=$(cd "$BUILD_DIR" && pwd)
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(llama-server llama-bench llama-simple llama-lookup llama-quantize)
VERSION=0.3.36
mkdir -p "$BUILD_DIR"
cd "$BUILD_DIR"
if [ ! -d "llama_cpp_python-$VERSION" ]; then
  python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d .
  tar xzf "llama_cpp_python-$VERSION.tar.gz"
fi
SRC="llama_cpp_python-$VERSION/vendor/llama.cpp"
nice -n 19 cmake -S "$SRC" -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_OPENMP=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_SERVER=ON >/dev/null
nice -n 19 cmake --build build --target "${TARGETS[@]}" -j "${JOBS:-$(nproc)}" >&2
for target in "${TARGETS[@]}"; do
  echo "$BUILD_DIR/build/bin/$target"
done
if [ -f build/bin/libllama.so ]; then
  "${CC:-cc}" -O2 -std=gnu11 -I"$SRC/include" -I"$SRC/ggml/include" "$REPO/bench/native/llama_decode.c" \
    -o build/bin/llama-decode -Lbuild/bin -lllama -lggml -lggml-base -Wl,-rpath,"$BUILD_DIR/build/bin"
  echo "$BUILD_DIR/build/bin/llama-decode"
fi
