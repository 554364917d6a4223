#!/usr/bin/env bash
# The main job: build ringlm (Release) and run it. Until a model runs, the
# job is `ringlm quantize` on a generated random-weight model: bf16 weights
# in, MLX 4-bit (group 64) out, then `ringlm inspect` on the result.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DRINGLM_TESTS=ON >/dev/null
cmake --build build
work=build/demo
rm -rf "$work" && mkdir -p "$work"
./build/tests/make_test_model "$work/model-bf16" --dtype bf16 --layers 4 --hidden 512 --inter 1536 --vocab 4096
./build/ringlm quantize "$work/model-bf16" "$work/model-4bit" --bits 4 --group-size 64
./build/ringlm inspect "$work/model-4bit" | grep -E 'layers\.0\.self_attn\.q_proj|embed|tensors'
./build/kv_ring
