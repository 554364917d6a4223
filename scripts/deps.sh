#!/usr/bin/env bash
# Installs the Debian packages ringlm needs to build and test, and only
# those that are missing; says what it installs. Safe to run repeatedly.
#
# The CUDA backend (-DRINGLM_CUDA=ON, issue 17) also needs NVIDIA's CUDA 13
# toolkit (nvcc, cudart, cuBLAS), which is not a Debian package: install it
# from NVIDIA (it lands in /usr/local/cuda), then configure with
#   cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release \
#     -DRINGLM_CUDA=ON -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc
# (scripts/test.sh and scripts/test-cuda.sh find it there by themselves).
set -euo pipefail
need=(gcc libc6-dev cmake ninja-build pkg-config libjansson-dev libpcre2-dev libedit-dev libmicrohttpd-dev)
# numpy for the GGUF reference decoder (scripts/gguf_ref.py, gguf_to_hf.py)
# and the tiny models the GGUF tests write (scripts/make_bench_models.py)
need+=(python3 python3-numpy)
# Node runs the server's end-to-end tests (tests/server/: real HTTP, the
# official openai client); a machine with its own Node (e.g. NodeSource's)
# keeps it, one without gets Debian's.
command -v node >/dev/null 2>&1 || need+=(nodejs npm)
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all present (${need[*]})"
  exit 0
fi
echo "deps: installing missing Debian packages: ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
