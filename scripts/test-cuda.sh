#!/usr/bin/env bash
# The CUDA kernels' tests on a machine with an NVIDIA GPU (issue 17).
#   scripts/test-cuda.sh build     configure build-cuda/ (-DRINGLM_CUDA=ON, nvcc,
#                                  sm_90) and build the CUDA test programs
#   scripts/test-cuda.sh run       run them: correctness against the CPU
#                                  reference, the same under compute-sanitizer
#                                  memcheck, then the speed table (--bench)
#   scripts/test-cuda.sh           both
# A GPU machine without jansson/PCRE2 headers can run what another machine
# built: the programs need only libcudart and libc there.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
bin=build-cuda/tests/test_cuda_qgemv
if [ "$what" = build ] || [ "$what" = all ]; then
  bash scripts/deps.sh >/dev/null
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DRINGLM_CUDA=ON -DRINGLM_BENCH=OFF >/dev/null
  cmake --build build-cuda --target test_cuda_qgemv
fi
if [ "$what" = run ] || [ "$what" = all ]; then
  export RINGLM_REQUIRE_GPU=1 # a missing GPU is a failure here, not a skip
  "$bin"
  if command -v compute-sanitizer >/dev/null; then
    compute-sanitizer --tool memcheck --error-exitcode 1 "$bin" >build-cuda/memcheck.log 2>&1 ||
      { tail -30 build-cuda/memcheck.log; echo "test-cuda: compute-sanitizer memcheck found errors"; exit 1; }
    grep -E "ERROR SUMMARY|passed" build-cuda/memcheck.log
  else
    echo "test-cuda: compute-sanitizer not found; memcheck not run"
    exit 1
  fi
  "$bin" --bench
fi
