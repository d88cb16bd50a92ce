#!/usr/bin/env bash
# Installs exactly the Debian packages duet needs that are missing (Debian 12).
# Idempotent: a machine that has them all runs no apt-get at all.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git
  libzmq3-dev cppzmq-dev
  libflatbuffers-dev flatbuffers-compiler
  libuv1-dev libspdlog-dev libfmt-dev
  ocl-icd-opencl-dev opencl-headers opencl-clhpp-headers pocl-opencl-icd clinfo
  libgtest-dev libgmock-dev
  libcli11-dev nlohmann-json3-dev libtomlplusplus-dev
  libpcre2-dev
  zlib1g-dev
  libcpp-httplib-dev
  libopenblas-dev
  clang libclang-rt-14-dev clang-format
  python3 python3-zmq python3-flatbuffers
  curl
)
# The OpenAI JavaScript client test (tests/http_svc) needs node and npm; a machine with its own
# node (nodesource's, which bundles npm) keeps it: Debian's npm package would conflict with it.
if ! command -v npm >/dev/null 2>&1; then PACKAGES+=(nodejs npm); fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
