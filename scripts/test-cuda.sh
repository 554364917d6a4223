#!/usr/bin/env bash
# The CUDA kernels' tests on a machine with an NVIDIA GPU (issue 17).
#   scripts/test-cuda.sh build     configure build-cuda/ (-DRINGLM_CUDA=ON, nvcc,
#                                  sm_90) and build the CUDA test programs
#   scripts/test-cuda.sh run       run them: correctness against the CPU
#                                  reference, the same under compute-sanitizer
#                                  memcheck, then the speed table (--bench)
#   scripts/test-cuda.sh           both
# A GPU machine without our Debian packages can run what another machine
# built: `build` gathers the libraries it lacks into build-cuda/devlib, which
# `run` puts on LD_LIBRARY_PATH, and packs the programs and devlib into
# build-cuda/pack/carry.tar.xz (6-10 MB against 60-77 MB unpacked: carry
# build-cuda/pack there); `run` unpacks it when present.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
# test_cuda_qgemv: the quantized products; test_cuda_ops: the rest of the
# forward pass's kernels (element-wise, RoPE, embedding, dense product, KV
# write, attention); test_cuda_model: sessions on the GPU against the CPU.
progs="test_cuda_qgemv test_cuda_ops test_cuda_model"
if [ "$what" = build ] || [ "$what" = all ]; then
  bash scripts/deps.sh >/dev/null
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DRINGLM_CUDA=ON -DRINGLM_BENCH=OFF >/dev/null
  cmake --build build-cuda --target $progs ringlm
  # The run-time libraries a GPU machine without our Debian packages lacks
  # (jansson, libmicrohttpd, libedit, libringlm itself), for LD_LIBRARY_PATH
  # there: carry build-cuda/devlib with the programs.
  mkdir -p build-cuda/devlib
  for l in $(ldd build-cuda/ringlm | awk '/=> \// {print $3}' | grep -E 'ringlm|jansson|microhttpd|libedit|libbsd|libmd'); do
    cp -L "$l" build-cuda/devlib/
  done
  mkdir -p build-cuda/pack
  # Each program holds the same 22 MB of kernels: one xz block with a
  # dictionary larger than all of them stores most of that once (6-10 MB,
  # not 17).
  tar cf - build-cuda/tests/test_cuda_{qgemv,ops,model} build-cuda/ringlm build-cuda/devlib |
    xz -T1 --lzma2=preset=6,dict=192MiB >build-cuda/pack/carry.tar.xz
fi
if [ "$what" = run ] || [ "$what" = all ]; then
  [ "$what" = run ] && [ -f build-cuda/pack/carry.tar.xz ] && tar xJf build-cuda/pack/carry.tar.xz
  export RINGLM_REQUIRE_GPU=1 # a missing GPU is a failure here, not a skip
  export RINGLM_SOURCE_DIR=$PWD LD_LIBRARY_PATH=$PWD/build-cuda/devlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  command -v compute-sanitizer >/dev/null ||
    { echo "test-cuda: compute-sanitizer not found; memcheck not run"; exit 1; }
  failed="" # every program runs, so one failure hides nothing of the others
  for p in $progs; do
    bin=build-cuda/tests/$p log=build-cuda/memcheck-$p.log
    "$bin" || failed="$failed $p"
    if compute-sanitizer --tool memcheck --error-exitcode 1 "$bin" >"$log" 2>&1; then
      grep -E "ERROR SUMMARY|passed" "$log"
    else
      tail -30 "$log"
      echo "test-cuda: compute-sanitizer memcheck found errors (or a failure) in $p"
      failed="$failed memcheck:$p"
    fi
  done
  # the model test again with the 6-bit one-row products on the f32 unit
  # kernel (the path RINGLM_CUDA_XREG6=0 selects)
  RINGLM_CUDA_XREG6=0 build-cuda/tests/test_cuda_model || failed="$failed model:xreg6-off"
  # and with the producers' int8 activations for MAX_M rows at most (a
  # quantize launch before each batched product, as before 2026-12-05)
  RINGLM_CUDA_Q8_WIDE=0 build-cuda/tests/test_cuda_model || failed="$failed model:q8-narrow"
  # split products' sums written by add_splits, not added by their readers
  RINGLM_CUDA_SUM_LATE=0 build-cuda/tests/test_cuda_model || failed="$failed model:sum-late-off"
  # and q, k and v's sums added by qkv_prep too, behind a switch until it
  # has run on a GPU (docs/cuda-notes.md)
  RINGLM_CUDA_SUM_QKV=1 build-cuda/tests/test_cuda_model || failed="$failed model:sum-qkv"
  # and gate and up (q, k and v) past 16 tokens as one launch of the f16
  # tensor-core product, behind a switch until it has run on a GPU
  RINGLM_CUDA_QGEMM_MULTI=1 build-cuda/tests/test_cuda_model || failed="$failed model:qgemm-multi"
  RINGLM_CUDA_QGEMM_NT4=1 build-cuda/tests/test_cuda_qgemv || failed="$failed qgemv:qgemm-nt4"
  # and the int8 tensor-core product split by whole waves (more partials
  # for the readers of its sums), behind a switch too
  RINGLM_CUDA_I8_WAVES=1 build-cuda/tests/test_cuda_qgemv || failed="$failed qgemv:i8-waves"
  RINGLM_CUDA_I8_WAVES=1 build-cuda/tests/test_cuda_model || failed="$failed model:i8-waves"
  # and its 32-token instances built for four blocks an SM
  RINGLM_CUDA_I8_OCC4=1 build-cuda/tests/test_cuda_qgemv || failed="$failed qgemv:i8-occ4"
  RINGLM_CUDA_I8_OCC4=1 build-cuda/tests/test_cuda_model || failed="$failed model:i8-occ4"
  # attention launches capped at the parts a query of the cache can use
  RINGLM_CUDA_ATTN_CAP_PARTS=1 build-cuda/tests/test_cuda_ops || failed="$failed ops:attn-cap-parts"
  RINGLM_CUDA_ATTN_CAP_PARTS=1 build-cuda/tests/test_cuda_model || failed="$failed model:attn-cap-parts"
  for p in test_cuda_qgemv test_cuda_ops; do build-cuda/tests/$p --bench; done
  [ -z "$failed" ] || { echo "test-cuda: failed:$failed"; exit 1; }
fi
