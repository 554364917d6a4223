#!/usr/bin/env bash
# Coverage-guided fuzzing of every parser of outside bytes (tests/fuzz/).
#   scripts/fuzz.sh [SECONDS] [TARGET...]      (FUZZ_MIN_EXECS, default 1000000)
# Builds the targets with clang and libFuzzer (+ ASan, UBSan) in
# build-fuzz/, runs each for SECONDS (default 600; two at a time) from a
# copy of its seed corpus (tests/fuzz/corpus/T, grown in build-fuzz/corpus/T),
# then, if it made fewer than FUZZ_MIN_EXECS executions, on over the grown
# corpus until it has: at least SECONDS and FUZZ_MIN_EXECS, whichever ends
# later. Prints per target: executions, seconds, coverage (libFuzzer's cov:
# edges and ft: features) and findings. A crash, leak, timeout or out-of-memory input
# lands in build-fuzz/findings/T/; copy it to tests/fuzz/regress/T/ once
# fixed, so that ctest replays it. Exits 1 on any finding.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-600}
min_execs=${FUZZ_MIN_EXECS:-1000000}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(safetensors gguf config tokenizer template kv_state snapshot request ids batch)
# clang and its runtime (libFuzzer), only here: the normal build uses gcc.
bash scripts/deps.sh >/dev/null
for p in clang libclang-rt-14-dev; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "$p"
  fi
done
CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_C_FLAGS_DEBUG=-g -O1" \
  -DRINGLM_SANITIZE=ON -DRINGLM_FUZZ=ON -DRINGLM_BENCH=OFF >/dev/null
if ! cmake --build build-fuzz --target $(printf 'fuzz_%s ' "${targets[@]}") >build-fuzz/build.log 2>&1; then
  tail -20 build-fuzz/build.log
  echo "fuzz: the build failed (build-fuzz/build.log)"
  exit 1
fi
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
execs_of() { grep -o 'stat::number_of_executed_units: [0-9]*' "$1" 2>/dev/null | awk '{s += $2} END {print s + 0}'; }
run_one() {
  local t=$1 work=build-fuzz/corpus/$1 out=build-fuzz/findings/$1 log=build-fuzz/fuzz_$1.log
  mkdir -p "$work" "$out"
  cp -n tests/fuzz/corpus/"$t"/* "$work"/ 2>/dev/null || true
  local t0=$SECONDS
  # -rss_limit_mb: an input that makes a parser take 2 GiB is a finding.
  local opts=(-timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 -artifact_prefix="$out"/)
  build-fuzz/tests/fuzz_"$t" "$work" -max_total_time="$secs" "${opts[@]}" >"$log" 2>&1 || true
  local done_execs
  done_execs=$(execs_of "$log")
  if [ "$(find "$out" -type f | wc -l)" -eq 0 ] && [ "$done_execs" -gt 0 ] && [ "$done_execs" -lt "$min_execs" ]; then
    build-fuzz/tests/fuzz_"$t" "$work" -runs=$((min_execs - done_execs)) "${opts[@]}" >>"$log" 2>&1 || true
  fi
  echo $((SECONDS - t0)) >build-fuzz/fuzz_"$t".secs
}
pids=()
for t in "${targets[@]}"; do
  run_one "$t" &
  pids+=($!)
  if [ ${#pids[@]} -ge 2 ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
done
wait
status=0
printf '%-12s %12s %8s %8s %8s %9s\n' target executions seconds cov ft findings
for t in "${targets[@]}"; do
  log=build-fuzz/fuzz_$t.log
  execs=$(execs_of "$log")
  [ "$execs" -gt 0 ] || execs=""
  took=$(cat build-fuzz/fuzz_"$t".secs 2>/dev/null || echo "?")
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(echo "$last" | grep -o 'cov: [0-9]*' | awk '{print $2}' || true)
  ft=$(echo "$last" | grep -o 'ft: [0-9]*' | awk '{print $2}' || true)
  found=$(find build-fuzz/findings/"$t" -type f | wc -l)
  printf '%-12s %12s %8s %8s %8s %9s\n' "$t" "${execs:-?}" "$took" "${cov:-?}" "${ft:-?}" "$found"
  if [ "$found" -gt 0 ] || [ -z "$execs" ] || [ "$execs" -lt "$min_execs" ]; then status=1; fi
done
exit $status
