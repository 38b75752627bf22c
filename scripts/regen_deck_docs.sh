#!/usr/bin/env bash
# Regenerates inputs/reference.deck and the key table of docs/deck.md from the option table
# (src/deck/deck.cpp), after a deck key was added or changed. tests/deck/test_deck.cpp fails
# until they match.
set -euo pipefail
cd "$(dirname "$0")/.."
build/quintet deck --reference > inputs/reference.deck
python3 - <<'PY'
import subprocess
table = subprocess.run(["build/quintet", "deck", "--markdown"], check=True, capture_output=True, text=True).stdout
doc = open("docs/deck.md").read()
head = doc[:doc.index("| key | default | meaning |")]
rest = doc[doc.index("| key | default | meaning |"):]
lines = rest.split("\n")
i = 0
while i < len(lines) and lines[i].startswith("|"):
    i += 1
open("docs/deck.md", "w").write(head + table.rstrip("\n") + "\n" + "\n".join(lines[i:]))
PY
echo "regenerated inputs/reference.deck and docs/deck.md"
