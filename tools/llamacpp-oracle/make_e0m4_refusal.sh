#!/usr/bin/env bash
# tests/data/llamacpp/refuse-fortune-e0m4.json: llama.cpp's answer to an E0M4 file (duet's own
# tensor type 1024, core/quant_e0m4.h): `duet quantize --type e0m4` of tiny-fortune's F16 file,
# loaded by node-llama-cpp's llama.cpp (`oracle.mjs load`). Needs `npm install` here and a built
# `duet` (BUILD, default build/). Deterministic: the same file (sha256 in the record), the same
# answer.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="${BUILD:-$root/build}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$build/bin/duet" quantize --type e0m4 "$root/tests/data/tiny-fortune/fortune-f16.gguf" \
  "$tmp/fortune-e0m4.gguf" > /dev/null
cd "$here"
node oracle.mjs load --model "$tmp/fortune-e0m4.gguf" \
  --out "$root/tests/data/llamacpp/refuse-fortune-e0m4.json"
