#!/usr/bin/env bash
# The main job: build the ringlm CLI alone (Release, the `ringlm` target:
# scripts/test.sh builds the tests, `cmake --build build` everything), show
# the embedded model as ringlm runs it (its sliding-window rings and KV
# bytes per token for each cache width), then generate text from it with a
# 4-bit KV cache, streamed, with the stats line (prefill and decode
# tokens/s, KV size, peak RSS) at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DRINGLM_TESTS=ON >/dev/null
cmake --build build --target ringlm
model=models/brown-15m-4bit
echo "== ringlm inspect -m $model"
./build/ringlm inspect -m "$model" | grep -v '^  layer '
echo
echo "== ringlm run -p ... --kv-bits 4   (default model: $model)"
./build/ringlm run -p "The jury said that the city" -n 120 --temp 0.7 --top-p 0.95 --seed 42 --kv-bits 4
