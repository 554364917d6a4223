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
# LLAMA_BIN_DIR holds llama-quantize from a llama.cpp build outside this
# repository (as for the benchmarks: docs/performance.md says how; the
# files in the repository were made with upstream 34af94cd, the
# unslothai/llama.cpp mirror's d32676d77). Needs /usr/bin/python3 with
# numpy (Debian's python3-numpy).
set -euo pipefail
cd "$(dirname "$0")/.."
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
