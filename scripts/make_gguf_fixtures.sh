#!/usr/bin/env bash
# Makes tests/fixtures/gguf/: what llama.cpp's own llama-quantize makes of
# the tiny models' F16 GGUF files (scripts/make_bench_models.py, which
# tests/test_gguf_model.c runs again at test time for the folders, the F16
# files and their config.json). Only these quantized files are committed
# (about 2.5 MB in all); the test's references come from
# scripts/gguf_to_hf.py.
#
#   scripts/make_gguf_fixtures.sh LLAMA_BIN_DIR
#
# Gemma 4 (tests/fixtures/gguf/gemma4_*) takes llama.cpp's own
# convert_hf_to_gguf.py, which needs torch and transformers (the device
# machine has them; this one does not), so it runs in two steps:
#
#   scripts/make_gguf_fixtures.sh gemma4-convert LLAMA_CPP_DIR OUT_DIR   # there
#   scripts/make_gguf_fixtures.sh gemma4 LLAMA_BIN_DIR OUT_DIR           # here
#
# The first stages tests/fixtures/models/gemma4_{text,keqv,moe} for the
# converter (scripts/gemma4_gguf_stage.py: a tiny Gemma-style tokenizer,
# the older config keys the converter reads), converts them (text to F32,
# the others to F16: scripts/gemma4_gguf_convert.py) and writes the
# tokenizer reference ids (scripts/gemma4_tok_cases.py). The second
# copies those into tests/fixtures/gguf/ and adds llama-quantize's Q8_0 of
# each (the 16-wide per-layer projection and the 48-wide expert down
# projection stay F16: Q8_0 needs rows of 32).
#
# LLAMA_BIN_DIR holds llama-quantize from a llama.cpp build outside this
# repository (as for the benchmarks: docs/performance.md says how; the
# files in the repository were made with upstream 34af94cd, the
# unslothai/llama.cpp mirror's d32676d77). Needs /usr/bin/python3 with
# numpy (Debian's python3-numpy).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = gemma4-convert ] && [ $# -eq 3 ]; then
  mkdir -p "$3"
  for m in text keqv moe; do
    /usr/bin/env python3 scripts/gemma4_gguf_stage.py "tests/fixtures/models/gemma4_$m" "$3/stage-$m"
    type=f16; [ $m = text ] && type=f32
    /usr/bin/env python3 scripts/gemma4_gguf_convert.py "$2" "$3/stage-$m" $type "$3/gemma4_$m-$type.gguf"
  done
  exec /usr/bin/env python3 scripts/gemma4_tok_cases.py "$3/stage-text" "$3/gemma4_tok_cases.json"
fi
if [ "${1:-}" = gemma4 ] && [ $# -eq 3 ]; then
  dest=tests/fixtures/gguf
  cp "$3"/gemma4_text-f32.gguf "$3"/gemma4_keqv-f16.gguf "$3"/gemma4_moe-f16.gguf "$3"/gemma4_tok_cases.json "$dest/"
  log=$(mktemp)
  q() {
    "$2/llama-quantize" "${@:4}" "$dest/$1" "$dest/$3" Q8_0 >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
    echo "$dest/$3: $(stat -c %s "$dest/$3") bytes"
  }
  q gemma4_text-f32.gguf "$2" gemma4_text-q8_0.gguf --tensor-type '\.proj=f16'
  q gemma4_keqv-f16.gguf "$2" gemma4_keqv-q8_0.gguf
  q gemma4_moe-f16.gguf "$2" gemma4_moe-q8_0.gguf --tensor-type 'ffn_down_exps=f16'
  rm -f "$log"
  exit 0
fi
[ $# -eq 1 ] && [ -x "$1/llama-quantize" ] || { echo "usage: $0 LLAMA_BIN_DIR (holding llama-quantize)" >&2; exit 2; }
quantize="$1/llama-quantize"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 scripts/make_bench_models.py "$tmp" tiny-llama tiny-qwen3 tiny-gemma3
dest=tests/fixtures/gguf
mkdir -p "$dest"
for spec in tiny-llama:Q8_0 tiny-llama:Q4_0 tiny-llama:Q5_0 tiny-llama:Q4_K_M tiny-llama:Q5_K_M tiny-qwen3:Q4_K_M tiny-gemma3:Q4_K_M; do
  model=${spec%%:*} type=${spec#*:}
  out="$dest/$model-$(echo "$type" | tr 'A-Z' 'a-z').gguf"
  if ! "$quantize" "$tmp/$model-f16.gguf" "$out" "$type" >"$tmp/log" 2>&1; then
    cat "$tmp/log" >&2
    exit 1
  fi
  echo "$out: $(stat -c %s "$out") bytes"
done
