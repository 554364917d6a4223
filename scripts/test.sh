#!/usr/bin/env bash
# Builds and runs the whole test suite with ctest.
#   scripts/test.sh             Debug build in build-test/
#   scripts/test.sh --sanitize  AddressSanitizer + UBSan build in build-san/
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
dir=build-test
# Debug keeps the invariant checks (RLM_ASSERT); -O2 keeps the property
# tests quick.
flags=(-DCMAKE_BUILD_TYPE=Debug "-DCMAKE_C_FLAGS_DEBUG=-g -O2")
if [ "${1:-}" = "--sanitize" ]; then
  dir=build-san
  flags=(-DCMAKE_BUILD_TYPE=Debug "-DCMAKE_C_FLAGS_DEBUG=-g -O1" -DRINGLM_SANITIZE=ON)
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
else
  # The CUDA kernels are compiled wherever nvcc is (CUDA is not a Debian
  # package here); their test then says "skipped: no GPU" without one, and
  # scripts/test-cuda.sh runs it on a GPU machine.
  nvcc=$(command -v nvcc || true)
  [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
  if [ -n "$nvcc" ]; then
    flags+=(-DRINGLM_CUDA=ON "-DCMAKE_CUDA_COMPILER=$nvcc")
  else
    echo "test: nvcc not found; the CUDA kernels are not compiled"
  fi
fi
cmake -S . -B "$dir" -G Ninja "${flags[@]}" >/dev/null
cmake --build "$dir"
# Real tokenizer files for test_tokenizer; offline, it skips those cases.
# Offline, those cases print "skipped"; with CI=true a skip is a failure.
bash scripts/fetch_tokenizers.sh || echo "test: fetch_tokenizers failed; real-tokenizer cases will be skipped (a failure under CI=true)"
ctest --test-dir "$dir" --output-on-failure -j2
