#!/usr/bin/env bash
# Checks that core/'s areas only include downwards (base <- model <- program <- ipc <- planner,
# core/CMakeLists.txt) and that core includes nothing from the layers above it (shm, services,
# deploy, cli). Prints every include that runs up, with its file and line, and exits 1 if any does.
# Usage: tools/check_core_layers.sh [repo root]
set -euo pipefail
root=${1:-$(dirname "$0")/..}
cd "$root"
areas=(base model program ipc planner)
rank() {
  local i
  for i in "${!areas[@]}"; do
    [[ ${areas[$i]} == "$1" ]] && { echo "$i"; return; }
  done
  echo -1
}
bad=0
for area in "${areas[@]}"; do
  mine=$(rank "$area")
  for f in core/"$area"/*.h core/"$area"/*.cpp; do
    [[ -e $f ]] || continue
    while IFS=: read -r line inc; do
      target=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$inc")
      case $target in
        core/*/*)
          other=${target#core/}
          other=${other%%/*}
          r=$(rank "$other")
          if ((r < 0 || r > mine)); then
            echo "$f:$line: $area includes $target (core/$other is not below core/$area)"
            bad=1
          fi
          ;;
        core/*)
          echo "$f:$line: includes $target, which is in no area"
          bad=1
          ;;
        shm/* | services/* | deploy/* | cli/* | tests/* | bench/*)
          echo "$f:$line: core includes $target from a layer above it"
          bad=1
          ;;
      esac
    done < <(grep -n '#include "' "$f" || true)
  done
done
if ((bad)); then
  echo "core layering: includes run up (see above)" >&2
  exit 1
fi
echo "core layering: every include points down"
