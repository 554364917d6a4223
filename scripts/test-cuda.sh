#!/usr/bin/env bash
# The CUDA kernels' tests on a machine with an NVIDIA GPU (issue 17).
#   scripts/test-cuda.sh build     configure build-cuda/ (-DRINGLM_CUDA=ON, nvcc,
#                                  sm_90) and build the CUDA test programs
#   scripts/test-cuda.sh run       run them: correctness against the CPU
#                                  reference, the same under compute-sanitizer
#                                  memcheck, and again under each comparison
#                                  switch
#   scripts/test-cuda.sh bench     the speed tables (--bench)
#   scripts/test-cuda.sh           all three
# To fit `run` into shorter device calls: MEMCHECK=0 skips the memcheck
# runs; SWITCHES=REGEX runs only the switch table's lines that match it
# (SWITCHES=none: none of them); SWITCH_MEMCHECK=1 runs those lines under
# memcheck too.
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
  cmake --build build-cuda --target $progs ringlm make_test_model # test_cuda_model writes a model with it
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
  tar cf - build-cuda/tests/test_cuda_{qgemv,ops,model} build-cuda/tests/make_test_model build-cuda/ringlm build-cuda/devlib |
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
    if [ "${MEMCHECK:-1}" = 0 ]; then
      echo "test-cuda: memcheck of $p not run (MEMCHECK=0)"
    elif compute-sanitizer --tool memcheck --error-exitcode 1 "$bin" >"$log" 2>&1; then
      grep -E "ERROR SUMMARY|passed" "$log"
    else
      tail -30 "$log"
      echo "test-cuda: compute-sanitizer memcheck found errors (or a failure) in $p"
      failed="$failed memcheck:$p"
    fi
  done
  # The programs again under the comparison switches (RINGLM_CUDA_*,
  # docs/cuda-notes.md), each with the programs whose paths it changes:
  #   XREG6=0          6-bit one-row products on the f32 unit kernel
  #   Q8_WIDE=0        producers' int8 rows for MAX_M rows at most
  #   SUM_LATE=0       split products' sums written by add_splits
  #   SUM_QKV=1        q, k and v's sums added by qkv_prep
  #   QGEMM_MULTI=1    gate and up (q, k, v) past 16 tokens in one f16 launch
  #   QGEMM_NT4=1      the f16 product at most 32 tokens a block
  #   I8_WAVES=0       the int8 product split by the target rule alone
  #   I8_OCC4=1        its 32-token instances at four blocks an SM
  #   I8_FAST=0        its run-time group instances for every weight
  #   ATTN_CAP_PARTS=0 decode's attention grid by n_splits alone
  #   EARLY_POS=0      qkv_prep and the merge read positions after the wait
  #   DENSE_AHEAD=0    the dense products ask the L2 for nothing ahead
  #   DENSE_GATED=0    dense gate and up as two products and an activation
  #   DENSE_LOOP=1     one-row dense products on a persistent grid, the
  #                    next block's first loads before the sums go out
  #   HEAD8=0          a 2-6-bit lm_head past one row on the f32 unit kernel
  #   ATTN_SHORT_PARTS=0 decode's attention parts by 64 keys alone
  #   MERGE_KEEP=0     the merge loads the parts' outputs after m and l
  #   XREG_ROWS=1|2    decode's 4-bit product's row groups of 1 or 2 rows
  #   XREG_HALF=0      that product at the fewest passes a warp and 4 rows
  #                    a block everywhere (not half-width blocks)
  #   ATTN_WHOLE=0     a one-token pass's attention always in parts and
  #                    a merge (not in one block a query head while no
  #                    query sees past 128 positions; test_cuda_ops forces
  #                    the one-block path on every case it takes)
  #   ATTN_WHOLE=4096  that one-block path up to 4096 positions (many
  #                    rounds a block)
  # The ones marked "off until it has run on a GPU" in their source are
  # tested here before any default changes.
  # SWITCH_MEMCHECK=1: each switch's programs under memcheck too (a switch
  # on its way to a default: the memory it touches, not only its bits)
  san=""
  [ "${SWITCH_MEMCHECK:-0}" = 1 ] && san="compute-sanitizer --tool memcheck --error-exitcode 1"
  while read -r sw progs_sw; do
    [[ "$sw $progs_sw" =~ ${SWITCHES:-.} ]] || continue
    IFS=+ read -ra parts <<<"$sw" # A=1+B=2: both switches at once
    envs=()
    for x in "${parts[@]}"; do envs+=("RINGLM_CUDA_$x"); done
    for p in $progs_sw; do
      log=build-cuda/switch-$p-${sw//[=+]/_}.log
      if env "${envs[@]}" $san build-cuda/tests/$p >"$log" 2>&1; then
        echo "test-cuda: $p with ${envs[*]}: passed${san:+ under memcheck}"
      else
        tail -30 "$log"
        echo "test-cuda: $p with ${envs[*]}: FAILED ($log)"
        failed="$failed $p:$sw"
      fi
    done
  done <<'SWITCHES'
XREG6=0 test_cuda_model
Q8_WIDE=0 test_cuda_model
SUM_LATE=0 test_cuda_model
SUM_QKV=1 test_cuda_model
QGEMM_MULTI=1 test_cuda_model
QGEMM_NT4=1 test_cuda_qgemv
I8_WAVES=0 test_cuda_qgemv test_cuda_model
I8_OCC4=1 test_cuda_qgemv test_cuda_model
I8_FAST=0 test_cuda_qgemv test_cuda_model
ATTN_CAP_PARTS=0 test_cuda_ops test_cuda_model
EARLY_POS=0 test_cuda_ops test_cuda_model
DENSE_AHEAD=0 test_cuda_ops test_cuda_model
DENSE_GATED=0 test_cuda_model
DENSE_LOOP=1 test_cuda_qgemv test_cuda_ops test_cuda_model
HEAD8=0 test_cuda_model
ATTN_SHORT_PARTS=0 test_cuda_ops test_cuda_model
MERGE_KEEP=0 test_cuda_ops test_cuda_model
XREG_ROWS=1 test_cuda_qgemv
XREG_ROWS=2 test_cuda_qgemv
XREG_HALF=0 test_cuda_qgemv test_cuda_model
ATTN_WHOLE=0 test_cuda_model
ATTN_WHOLE=4096 test_cuda_model
SWITCHES
  [ -z "$failed" ] || { echo "test-cuda: failed:$failed"; exit 1; }
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  [ "$what" = bench ] && [ -f build-cuda/pack/carry.tar.xz ] && [ ! -x build-cuda/tests/test_cuda_qgemv ] &&
    tar xJf build-cuda/pack/carry.tar.xz
  export LD_LIBRARY_PATH=$PWD/build-cuda/devlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  for p in test_cuda_qgemv test_cuda_ops; do build-cuda/tests/$p --bench; done
fi
