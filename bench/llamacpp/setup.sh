#!/usr/bin/env bash
# Bench-only: installs node-llama-cpp (which bundles llama.cpp's prebuilt CPU build) into
# bench/llamacpp/node_modules. Never a runtime dependency of duet.
set -euo pipefail
cd "$(dirname "$0")"
[ -f package.json ] || echo '{"name":"duet-llamacpp-bench","private":true}' > package.json
npm install --no-audit --no-fund node-llama-cpp
