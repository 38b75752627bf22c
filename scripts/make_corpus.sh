#!/usr/bin/env bash
# Writes the bundled quickstart corpus, data/quickstart.txt: the free-software licence texts
# every Debian system ships in /usr/share/common-licenses (package base-files), about 250 KB of
# English prose. Deterministic: files in name order, symbolic links (duplicates) skipped.
set -euo pipefail
out=${1:-data/quickstart.txt}
src=/usr/share/common-licenses
[ -d "$src" ] || { echo "make_corpus: $src not found (Debian package base-files)" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
tmp="$out.tmp"
: > "$tmp"
for f in $(LC_ALL=C ls "$src"); do
  [ -L "$src/$f" ] && continue
  [ -f "$src/$f" ] && cat "$src/$f" >> "$tmp"
done
mv "$tmp" "$out"
echo "make_corpus: wrote $out ($(wc -c < "$out") bytes)"
