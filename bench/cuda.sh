#!/usr/bin/env bash
# ringlm's decode and prefill speed on an NVIDIA GPU (issue 17), with the
# fraction of the memory-bandwidth floor: the bytes a decode step reads
# (every weight once; the tied embedding is the output head) over the
# device-to-device copy bandwidth measured in the same run
# (test_cuda_qgemv --bench prints it).
#
#   bench/cuda.sh [MODELS_DIR]     (default /tmp/ringlm-bench)
#
# Models: random weights with the shapes of Gemma 3 1B and Llama 3.1 8B
# (scripts/make_bench_models.py --parallel, bf16: each matrix its own seed,
# drawn on every core), quantized to MLX 4-bit g64 with the
# tied embedding/head as llama-quantize's Q4_0 has it: Gemma's at 8 bits
# (Q8_0), Llama's at 6 bits g64 (Q6_K; 6.5 against 6.56 bits a weight).
# RINGLM (default build-cuda/ringlm) and QGEMV (build-cuda/tests/
# test_cuda_qgemv) name the programs; REPS (3) the repetitions; DEPTHS
# (0,4096,16384) the context depths, with bf16 KV and with 4-bit KV; BATCH (8,32,64) the batch sizes of
# the aggregate decode test (llama-batched-bench's, 128 + 128 tokens a
# sequence; the anchor's table). Where nvcc is installed it also builds
# and runs bench/cuda_read_floor.cu (the read floor of the products'
# chain) and bench/cuda_sync_cost.cu (a dependency point as a kernel
# boundary and as a grid barrier).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-/tmp/ringlm-bench}
bin=${RINGLM:-build-cuda/ringlm}
qgemv=${QGEMV:-build-cuda/tests/test_cuda_qgemv}
reps=${REPS:-3}
depths=${DEPTHS:-0,4096,16384}
batch=${BATCH:-8,32,64}
mkdir -p "$dir"
# a GPU machine without our Debian packages: the libraries test-cuda.sh gathered
[ -d build-cuda/devlib ] && export LD_LIBRARY_PATH=$PWD/build-cuda/devlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The tied embedding (the output head) at the anchor file's width: Gemma's
# Q8_0 (its 1152 columns are no multiple of Q6_K's 256), Llama's Q6_K
# (4.35 GB against the anchor's 4.36).
for shape in gemma3-1b:8 llama3.1-8b:6; do
  head=${shape#*:} shape=${shape%:*}
  [ -f "$dir/$shape/model.safetensors" ] || python3 scripts/make_bench_models.py "$dir" "$shape" --no-gguf --parallel
  [ -f "$dir/$shape-4bit/model.safetensors" ] ||
    "$bin" quantize "$dir/$shape" "$dir/$shape-4bit" --bits 4 --group-size 64 --quantize-embeddings \
      --override embed_tokens=$head >/dev/null
done
bw=$("$qgemv" --bench | sed -n 's/^device-to-device copy: \([0-9.]*\) GB.*/\1/p' | head -1)
echo "device-to-device copy: ${bw:-?} GB/s"
# what merely reading the 8B token's weights takes in its chain of kernels
# (docs/cuda-notes.md, "The read floor of a chain of kernels")
if command -v nvcc >/dev/null; then
  nvcc -O3 -arch=sm_90 -o "$dir/read_floor" bench/cuda_read_floor.cu && "$dir/read_floor"
  # what a dependency point costs: PDL boundary against a grid barrier
  nvcc -O3 -arch=sm_90 -o "$dir/sync_cost" bench/cuda_sync_cost.cu && "$dir/sync_cost"
fi
for m in gemma3-1b-4bit llama3.1-8b-4bit gemma3-1b llama3.1-8b; do
  bytes=$(stat -c %s "$dir/$m/model.safetensors")
  acts=0
  case $m in *4bit) acts=8 ;; esac
  echo "== $m: $((bytes / 1000000)) MB of weights; floor $(awk -v b="$bytes" -v w="${bw:-0}" 'BEGIN{printf "%.0f", w*1e9/b}') tok/s"
  "$bin" bench -m "$dir/$m" --device cuda --act-bits $acts -p 512 -n 128 -d "$depths" -r "$reps"
  # 4-bit KV (MLX affine, groups of 64), llama.cpp's q4_0 K/V rows of the anchor
  "$bin" bench -m "$dir/$m" --device cuda --act-bits $acts -p 512 -n 128 -d "$depths" -r "$reps" --kv-bits 4
  "$bin" bench -m "$dir/$m" --device cuda --act-bits $acts -p 0 -n 128 -r "$reps" --no-graph
  "$bin" bench -m "$dir/$m" --device cuda --act-bits $acts --batch "$batch" -p 128 -n 128 -r "$reps"
done
