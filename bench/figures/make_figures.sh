#!/usr/bin/env bash
# Draws bench/figures/*.png and *.svg from the JSON the benches wrote (figures.py says which).
# The plotting stack is a bench dependency, not a runtime one: python3-matplotlib is installed
# here with apt-get when missing (not by deploy/install-deps.sh).
#
#   bench/figures/make_figures.sh            # the figures from the committed JSON
#   TRACE=1 bench/figures/make_figures.sh    # first re-record data/trace_tensor.json (trace.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
# Debian's python (apt installs its modules there), not another one first on PATH.
PY=/usr/bin/python3
if ! $PY -c 'import matplotlib' 2>/dev/null; then
  SUDO=$([ "$(id -u)" = 0 ] && echo || echo sudo)
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends python3-matplotlib
fi
if [ "${TRACE:-0}" = 1 ]; then bench/figures/trace.sh; fi
$PY bench/figures/figures.py --out bench/figures
