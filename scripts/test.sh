#!/usr/bin/env bash
# Runs the test suite (unit, MPI end-to-end, PyTorch reference) with CTest, as CI does:
# everything except the tests labelled `slow` (minutes of training each; their figures are in
# docs/) and `gpu_bundle` (a 5-15-minute build in a Debian chroot, as root: docs/cuda.md records its
# run; `ctest -L gpu_bundle`). `--all` runs those too. `--sanitize` builds build-asan/ with the address and
# undefined-behaviour sanitizers (CPU only) and runs the unit tests there. Other arguments go to
# ctest, e.g. `scripts/test.sh -L unit`.
set -euo pipefail
cd "$(dirname "$0")/.."
select=(-LE 'slow|gpu_bundle')
args=()
sanitize=0
for a in "$@"; do
  if [ "$a" = "--all" ]; then select=(); elif [ "$a" = "--sanitize" ]; then sanitize=1; else args+=("$a"); fi
done
if [ "$sanitize" = 1 ]; then
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQUINTET_CUDA=OFF -DQUINTET_NATIVE=OFF \
    -DQUINTET_SANITIZE=address,undefined > /dev/null
  cmake --build build-asan -j"$(nproc)"
  # MPI and OpenMP runtimes keep allocations until exit: leaks are not this suite's to report.
  # allocator_may_return_null: HDF5 answers a corrupt size in a fuzzed file with a failed malloc,
  # which it handles (a clean error); ASan would abort on the size alone.
  export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  ctest --test-dir build-asan --output-on-failure -L unit "${args[@]}"
  exit
fi
[ -f build/CTestTestfile.cmake ] || { echo "test: no build/: run scripts/setup.sh first" >&2; exit 1; }
cmake --build build -j"$(nproc)"
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
ctest --test-dir build --output-on-failure "${select[@]}" "${args[@]}"
