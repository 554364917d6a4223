#!/usr/bin/env bash
# The CUDA backend's comparison switches (RINGLM_CUDA_*, docs/cuda-notes.md)
# side by side on one GPU machine: each variant's aggregate decode tokens/s
# (S_TG, llama-batched-bench's measure) and tg128, in alternating rounds,
# one line a variant and round, so that a shared machine's drift shows as
# spread rather than as a difference between variants. With TOKEN=1 and
# LOGITS=1 (below) it is the whole A/B a switch needs on a device call:
# the products alone, the logits' bits, the model's speed.
#
#   bench/cuda_switches.sh [MODELS_DIR]     (default /tmp/ringlm-bench)
#
# Model: Llama 3.1 8B's shape, random weights (scripts/make_bench_models.py),
# MLX 4-bit g64 with the tied head at HEAD bits (default 8; 6 as the
# anchor's Q6_K), --act-bits 8. Environment:
#   VARIANTS  ';'-separated variants, each a list of VAR=value words ("-"
#             for none), default: none; the attention merge's outputs
#             loaded after m and l (MERGE_KEEP=0); short contexts'
#             attention in parts of 64 keys (ATTN_SHORT_PARTS=0); the
#             defaults before the int8 product's G instances (I8_FAST=0
#             I8_WIDE=32 I8_WAVES=0); EARLY_POS=0; QGEMM_MULTI=1,
#             SUM_QKV=1, I8_OCC4=1 (behind switches); SUM_LATE=0
#   OLD       another ringlm binary (e.g. main's before a change, with its
#             libraries on OLD_LIB), run as variant "old"
#   DEPTH     depths (e.g. 4096,16384) at which each variant's decode is
#             also measured (-d, 64 tokens, one run each), with KV at
#             KV_BITS bits (unset: the model's dtype)
#   DTYPE     4bit (default: the model above, --act-bits 8) or bf16 (the
#             8B's bf16 weights as generated, --act-bits 0)
#   TOKEN=1   each variant and round also runs `test_cuda_qgemv
#             --bench-token` (QGEMV names it): one token's products alone
#             in a graph, and their share of the copy floor
#   LOGITS=1  first, each variant's logits of 16 tokens, one a pass
#             (`ringlm logits --prefill-chunk 1`), compared byte for byte
#             with the first variant's: a switch that must keep every bit
#             shows here that it does
#   NCU=1     then each variant's decode kernels, each timed alone by
#             Nsight Compute (ncu) over two tokens without the graph, as
#             bench/ncu_kernels.py's table: where a token's time goes
#   BATCH (32,64; empty: no batched rows), ROUNDS (2), HEAD (8),
#   RINGLM (build-cuda/ringlm)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-/tmp/ringlm-bench}
bin=${RINGLM:-build-cuda/ringlm}
batch=${BATCH-32,64}
qgemv=${QGEMV:-build-cuda/tests/test_cuda_qgemv}
rounds=${ROUNDS:-2}
head=${HEAD:-8}
variants=${VARIANTS:-"-;RINGLM_CUDA_MERGE_KEEP=0;RINGLM_CUDA_ATTN_SHORT_PARTS=0;RINGLM_CUDA_I8_FAST=0 RINGLM_CUDA_I8_WIDE=32 RINGLM_CUDA_I8_WAVES=0;RINGLM_CUDA_EARLY_POS=0;RINGLM_CUDA_QGEMM_MULTI=1;RINGLM_CUDA_SUM_QKV=1;RINGLM_CUDA_I8_OCC4=1;RINGLM_CUDA_SUM_LATE=0"}
depth=${DEPTH:-}
kv_bits=${KV_BITS:+--kv-bits $KV_BITS}
[ -n "${OLD:-}" ] && variants="old;$variants"
[ -d build-cuda/devlib ] && export LD_LIBRARY_PATH=$PWD/build-cuda/devlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
case ${DTYPE:-4bit} in
4bit) model=$dir/llama3.1-8b-4bit-h$head acts=8 ;;
bf16) model=$dir/llama3.1-8b acts=0 ;;
*) echo "cuda_switches: DTYPE is 4bit or bf16, not '$DTYPE'" >&2 && exit 2 ;;
esac
mkdir -p "$dir"
[ -f "$dir/llama3.1-8b/model.safetensors" ] || python3 scripts/make_bench_models.py "$dir" llama3.1-8b --no-gguf --parallel
[ -f "$model/model.safetensors" ] ||
  "$bin" quantize "$dir/llama3.1-8b" "$model" --bits 4 --group-size 64 --quantize-embeddings \
    --override embed_tokens="$head" >/dev/null

# one variant's command: its environment, then the program (ringlm's
# subcommand, or the old binary with its own libraries; "qgemv": the
# token of products, which the old binary has no copy of), run under
# the words of the array `wrap` if any (ncu)
wrap=()
run() {
  local v=$1 sub=$2
  shift 2
  local prog=("$bin" "$sub" -m "$model" --device cuda --act-bits "$acts")
  [ "$sub" = qgemv ] && prog=("$qgemv" --bench-token)
  if [ "$v" = old ]; then
    [ "$sub" = qgemv ] && return 0
    env ${OLD_LIB:+LD_LIBRARY_PATH=$OLD_LIB} "${wrap[@]}" "$OLD" "$sub" -m "$model" --device cuda --act-bits "$acts" "$@"
  elif [ "$v" = - ]; then
    "${wrap[@]}" "${prog[@]}" "$@"
  else
    env $v "${wrap[@]}" "${prog[@]}" "$@"
  fi
}

echo "model $model; batch ${batch:-none}; $rounds rounds"
IFS=';' read -ra vs <<<"$variants"
if [ "${LOGITS:-0}" = 1 ]; then
  # a variant's logits against the first's, byte for byte
  ref=""
  for i in "${!vs[@]}"; do
    out=$dir/switch-logits-$i.npy
    rm -f "$out"
    run "${vs[$i]}" logits --ids 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16 --prefill-chunk 1 -o "$out" >/dev/null 2>&1 || true
    if [ ! -s "$out" ]; then
      verdict="no logits (the run failed)"
    elif [ -z "$ref" ]; then
      ref=$out verdict="the reference"
    elif cmp -s "$ref" "$out"; then
      verdict="identical to ${vs[0]}'s"
    else
      verdict="DIFFERENT from ${vs[0]}'s"
    fi
    printf 'logits  %-70s %s\n' "${vs[$i]}" "$verdict"
  done
fi
if [ "${NCU:-0}" = 1 ]; then
  command -v ncu >/dev/null || { echo "cuda_switches: NCU=1 needs ncu (Nsight Compute) on PATH" >&2 && exit 2; }
  wrap=(ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --print-units base)
  for i in "${!vs[@]}"; do
    csv=$dir/switch-ncu-$i.csv
    echo "kernels of ${vs[$i]}"
    run "${vs[$i]}" bench -p 0 -n 2 -r 1 --no-graph >"$csv" 2>/dev/null || true
    python3 bench/ncu_kernels.py "$csv" --top 16 || true
  done
  wrap=()
fi
for r in $(seq 1 "$rounds"); do
  for v in "${vs[@]}"; do
    # the table's rows: | pp | tg | B | ... | S_TG | ...; tg128's row: its mean
    s=""
    [ -n "$batch" ] && s=$(run "$v" bench --batch "$batch" -p 128 -n 128 -r 1 2>/dev/null | tr '\r' '\n' |
      awk -F'|' '/^\|   128/ {gsub(/ /, "", $4); gsub(/ /, "", $9); printf "B=%s %s  ", $4, $9}')
    t=$(run "$v" bench -p 0 -n 128 -r 2 2>/dev/null | tr '\r' '\n' | awk -F'|' '/tg128/ {gsub(/^ +| +$/, "", $6); print $6}')
    # at depth: the tg64 rows' test column ("tg64 @ d4096") and tokens/s
    dd=""
    [ -n "$depth" ] && dd=$(run "$v" bench -p 0 -n 64 -d "$depth" -r 1 $kv_bits 2>/dev/null | tr '\r' '\n' |
      awk -F'|' '/tg64/ {gsub(/^ +| +$/, "", $5); gsub(/^ +| +$/, "", $6); printf "%s %s  ", $5, $6}')
    # the products alone: each model's "us ... floor ...: N%" line, shortened
    tk=""
    [ "${TOKEN:-0}" = 1 ] && tk=$(run "$v" qgemv 2>/dev/null | sed -n 's/^\(.*\), one token.s products in a graph: \([0-9.]* us\).*: \([0-9.]*%\)$/\1 \2 \3/p' |
      tr '\n' ';')
    printf 'round %d  %-70s %s tg128 %s  %s%s\n' "$r" "$v" "$s" "$t" "$dd" "${tk:+ token: $tk}"
  done
done
