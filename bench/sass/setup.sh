#!/usr/bin/env bash
# A disassembler for sm_90 machine code on a machine without a GPU (the
# CUDA 13 toolkit here ships neither cuobjdump nor nvdisasm): nvdisasm from
# Debian's non-free nvidia-cuda-toolkit 11.8, downloaded and unpacked into
# a cache folder, not installed. bench/sass/loop.py uses it to count the
# instructions of a kernel's main loop (docs/cuda-notes.md, "Eight
# switches": the int8 product's 1,428 instructions a chunk).
#   bench/sass/setup.sh      prints the nvdisasm path (fetching it once)
set -euo pipefail
dir=${RINGLM_SASS_CACHE:-$HOME/.cache/ringlm-sass}
bin=$dir/x/usr/bin/nvdisasm
if [ ! -x "$bin" ]; then
  mkdir -p "$dir/lists/partial"
  printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' >"$dir/non-free.sources"
  apt_opts=(-o "Dir::Etc::sourcelist=$dir/non-free.sources" -o Dir::Etc::sourceparts=/dev/null -o "Dir::State::Lists=$dir/lists")
  apt-get "${apt_opts[@]}" update >/dev/null
  (cd "$dir" && apt-get "${apt_opts[@]}" download nvidia-cuda-toolkit >/dev/null 2>&1)
  dpkg-deb -x "$dir"/nvidia-cuda-toolkit_*.deb "$dir/x"
fi
echo "$bin"
