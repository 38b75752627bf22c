#!/usr/bin/env bash
# Runs the test suite (unit, MPI end-to-end, PyTorch reference) with CTest, as CI does:
# everything except the tests labelled `slow` (minutes of training each; their figures are in
# docs/). `--all` runs those too. Other arguments go to ctest, e.g. `scripts/test.sh -L unit`.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f build/CTestTestfile.cmake ] || { echo "test: no build/: run scripts/setup.sh first" >&2; exit 1; }
select=(-LE slow)
args=()
for a in "$@"; do
  if [ "$a" = "--all" ]; then select=(); else args+=("$a"); fi
done
cmake --build build -j"$(nproc)"
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
ctest --test-dir build --output-on-failure "${select[@]}" "${args[@]}"
