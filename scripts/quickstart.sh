#!/usr/bin/env bash
# The quickstart: makes the bundled corpus (Debian's licence texts), tokenises it, trains
# inputs/quickstart.deck on 2 MPI ranks and samples some text from the result.
# Re-running continues the same run from its latest checkpoint (checkpoint.resume = auto).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/quintet ] || { echo "quickstart: build/quintet missing: run scripts/setup.sh first" >&2; exit 1; }
if [ "$(id -u)" -eq 0 ]; then  # Open MPI refuses root unless told it is intended (containers, CI)
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
[ -f data/quickstart.txt ] || bash scripts/make_corpus.sh data/quickstart.txt
[ -f data/quickstart.h5 ] || build/quintet prepare --input data/quickstart.txt --tokenizer byte \
  --output data/quickstart.h5
mpirun --oversubscribe -n 2 build/quintet train inputs/quickstart.deck "$@"
run_dir=$(sed -n 's/^run_dir *= *//p' inputs/quickstart.deck)
latest=$(cat "$run_dir/checkpoints/latest")
echo
echo "--- sample from $run_dir/checkpoints/$latest ---"
build/quintet generate --checkpoint "$run_dir/checkpoints/$latest" --prompt "The licensee" \
  --tokens 200 --temperature 0.7
