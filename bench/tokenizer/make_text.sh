#!/usr/bin/env bash
# The benchmark text: Debian's own manual pages (roff source, decompressed) in English, German,
# French, Russian, Ukrainian, Polish, Japanese, Korean and Chinese, as shipped by the man-db,
# manpages and coreutils packages' translations on Debian 12. Files are taken in sorted order up
# to a per-language byte budget, so the same machine image gives the same text.
# usage: make_text.sh OUT [BYTES_PER_LANGUAGE]
set -euo pipefail
out=$1
budget=${2:-1000000}
: > "$out"
for lang in man1 de fr ru uk pl ja ko zh_CN; do
  dir=/usr/share/man/$lang
  [ -d "$dir" ] || continue
  written=0
  while IFS= read -r f; do
    [ "$written" -ge "$budget" ] && break
    chunk=$(zcat -f "$f" 2>/dev/null | iconv -f utf-8 -t utf-8 -c) || continue
    printf '%s\n' "$chunk" >> "$out"
    written=$((written + ${#chunk}))
  done < <(find "$dir" -type f -name '*.gz' | LC_ALL=C sort)
done
echo "$out: $(wc -c < "$out") bytes"
