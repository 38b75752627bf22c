#!/usr/bin/env bash
# Runs the whole test suite (unit, MPI end-to-end, PyTorch reference) with CTest.
# Extra arguments go to ctest, e.g. `scripts/test.sh -L unit`.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f build/CTestTestfile.cmake ] || { echo "test: no build/: run scripts/setup.sh first" >&2; exit 1; }
cmake --build build -j"$(nproc)"
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
ctest --test-dir build --output-on-failure "$@"
