#!/usr/bin/env bash
# The GPU bundle proven without a GPU: what fails here would fail on the bare GPU machine
# (docs/cuda.md, "The first GPU run").
#
#   1. the bundle .gpu-bundle/ (made with scripts/gpu_bundle.sh when missing: network);
#   2. a fresh minimal Debian 12 (scripts/debian_chroot.sh) given only what the GPU image is known
#      to have: a C++ compiler, CMake, Python 3 (apt-get, network) -- no MPI, HDF5, Boost, BLIS,
#      GoogleTest (checked);
#   3. the network cut: every later step runs in a new network namespace with only a loopback
#      interface (checked: apt-get update fails there);
#   4. the repository copied in as the device call sends it -- tracked and untracked-not-ignored
#      files -- plus .gpu-bundle/;
#   5. there, offline: scripts/gpu_check.sh --cpu -- unpack the bundle into a private prefix, build
#      quintet and two MPI tests (-DQUINTET_CUDA=OFF: no CUDA there), run them (an MPI singleton,
#      4 ranks under the bundled mpiexec), train the quickstart deck for 20 steps on 1 rank (fp32,
#      bf16) and on 2 ranks (tp=2) through the bundled mpirun, compare the losses, write the report;
#   6. checks: gpu_check succeeded, its libraries came from the bundle, quintet's MPI and HDF5
#      libraries resolve into the prefix, nothing of Open MPI is installed in the system;
#   7. every package unpacked (QUINTET_BUNDLE_UNPACK_ALL=1), as on a machine with none of the
#      bundle's libraries (e.g. Ubuntu 24.04 has libunistring.so.5, not .so.2): quintet's libraries,
#      fallbacks included, resolve into that prefix and it trains 3 steps on 2 ranks.
#
#   bash tests/gpu_bundle/test_gpu_bundle.sh        # or: ctest -L gpu_bundle (not in scripts/test.sh's default run)
# Needs root, chroot, unshare, and the network for steps 1-2; exit 77 (skipped) without them.
# Takes 5-15 minutes on 2 cores (mostly the build; +3 the first time, for debootstrap).
# Environment: QUINTET_KEEP_CHROOT=1 keeps the chroot (its path is printed),
# QUINTET_GPU_BUNDLE_JOBS (build jobs, default 2). The report is copied to
# ${TMPDIR:-/tmp}/quintet-gpu-bundle-report.md.
set -uo pipefail

here=$(cd "$(dirname "$0")/../.." && pwd -P)
cd "$here" || exit 1
T0=$(date +%s)
say() { echo "[test_gpu_bundle $(( $(date +%s) - T0 ))s] $*"; }
fail() { say "FAIL: $*"; exit 1; }

[[ $(id -u) -eq 0 ]] || { echo "SKIPPED: test_gpu_bundle needs root (a chroot, mounts, a network namespace)"; exit 77; }
for tool in chroot unshare ip mount tar; do
    command -v "$tool" >/dev/null 2>&1 || { echo "SKIPPED: test_gpu_bundle needs '$tool'"; exit 77; }
done
git rev-parse --is-inside-work-tree >/dev/null 2>&1 ||
    { echo "SKIPPED: test_gpu_bundle copies the git working tree (as the device call does): no git checkout here"; exit 77; }
# The registry is needed to prepare (the bundle, the chroot's compiler); its address is also what
# the offline check below must fail to reach.
mirror_host=$(sed -n 's|^URIs: *[a-z]*://\([^/]*\).*|\1|p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
mirror_host=${mirror_host:-deb.debian.org}
mirror_ip=$(getent ahostsv4 "$mirror_host" 2>/dev/null | awk '{print $1; exit}')
[[ -n $mirror_ip ]] || { echo "SKIPPED: test_gpu_bundle needs the network to prepare (cannot resolve $mirror_host)"; exit 77; }
jobs=${QUINTET_GPU_BUNDLE_JOBS:-2}
[[ $jobs =~ ^[1-9][0-9]*$ ]] || fail "QUINTET_GPU_BUNDLE_JOBS='$jobs' is not a positive integer"

# ---- 1. the bundle ----------------------------------------------------------------------------
if [[ ! -f .gpu-bundle/MANIFEST.txt ]]; then
    say "no .gpu-bundle/: making it (scripts/gpu_bundle.sh)"
    bash scripts/gpu_bundle.sh || fail "scripts/gpu_bundle.sh failed"
fi
say "bundle: $(ls .gpu-bundle/debs | wc -l) packages, $(du -cb .gpu-bundle/debs/*.deb | tail -1 | awk '{printf "%.1f MiB", $1 / 1048576}')"

# ---- 2. a minimal Debian with what the GPU image has ------------------------------------------
work=$(mktemp -d /var/tmp/quintet-gpu-bundle-test.XXXXXX)
root="$work/root"
cleanup() {
    if [[ ${QUINTET_KEEP_CHROOT:-0} == 1 ]]; then
        say "kept the chroot: $root"
    else
        bash "$here/scripts/debian_chroot.sh" destroy "$root" && rm -rf --one-file-system "$work"
    fi
}
trap cleanup EXIT
ch() { bash "$here/scripts/debian_chroot.sh" run "$root" "$@"; }
bash scripts/debian_chroot.sh create "$root" || fail "could not create the Debian chroot"
say "chroot $root: installing g++ cmake python3 (the GPU image's known set)"
ch 'apt-get update -qq && apt-get install -y -qq --no-install-recommends g++ cmake python3 > /root/apt.log 2>&1 ||
    { tail -20 /root/apt.log; exit 1; }' || fail "apt-get in the chroot failed (network?)"
ch 'for p in openmpi-bin libopenmpi3 libhdf5-openmpi-dev libboost-program-options-dev libblis-openmp-dev libgtest-dev make; do
        dpkg-query -W -f="\${Status}" $p 2>/dev/null | grep -q "install ok installed" && { echo "$p is installed"; exit 1; }
    done; ! command -v mpirun && ! command -v make' > /dev/null ||
    fail "the chroot is not bare: a library of the bundle is installed"

# ---- 3. cut the network -----------------------------------------------------------------------
# Online, the chroot reaches the registry (so the offline failure below means something)...
ch "getent hosts $mirror_host > /dev/null && timeout 20 bash -c 'echo > /dev/tcp/$mirror_ip/80'" ||
    fail "the chroot cannot reach $mirror_host ($mirror_ip) even online: the offline check would prove nothing"
# ...offline it can neither resolve the name nor open a connection to the address.
ch --offline "getent hosts $mirror_host > /dev/null" && fail "$mirror_host resolves offline: the network is not cut"
ch --offline "timeout 20 bash -c 'echo > /dev/tcp/$mirror_ip/80' 2>/dev/null" &&
    fail "$mirror_ip:80 is reachable offline: the network is not cut"
say "network cut: offline, $mirror_host does not resolve and $mirror_ip:80 cannot be reached (online both work)"

# ---- 4. the repository as the device call sends it --------------------------------------------
mkdir -p "$root/root/quintet"
git ls-files -z -co --exclude-standard | tar --null --ignore-failed-read -T - -cf - 2>/dev/null |
    tar -C "$root/root/quintet" -xf - || fail "copying the working tree failed"
tar -cf - .gpu-bundle | tar -C "$root/root/quintet" -xf - || fail "copying .gpu-bundle failed"
say "copied the working tree ($(du -sh "$root/root/quintet" | cut -f1) with the bundle)"

# ---- 5. offline: gpu_check.sh --cpu -----------------------------------------------------------
say "offline: JOBS=$jobs scripts/gpu_check.sh --cpu (unpack, build, tests, 2-rank quickstart)"
ch --offline "cd /root/quintet && JOBS=$jobs nice -n 10 bash scripts/gpu_check.sh --cpu" > "$work/gpu_check.out" 2>&1
rc=$?
out="$root/root/quintet/runs/gpu_check"
report=${TMPDIR:-/tmp}/quintet-gpu-bundle-report.md
cp "$out/report.md" "$report" 2>/dev/null
grep '^\[gpu_check' "$work/gpu_check.out"
echo "---- report.md ----"
cat "$out/report.md" 2>/dev/null || echo "(no report)"
echo "-------------------"
[[ $rc -eq 0 ]] || { tail -40 "$work/gpu_check.out"; fail "gpu_check.sh --cpu exited $rc"; }

# ---- 6. checks --------------------------------------------------------------------------------
grep -q '^- libraries: bundle:' "$out/report.md" || fail "gpu_check did not use the bundle"
for s in '| libraries (system, or the bundle) | ok |' '| build (-DQUINTET_CUDA=OFF) | ok |' \
         'test_communicator (MPI singleton, mpiexec -n 4) | ok |' '2 ranks (tp=2) | ok ('; do
    grep -qF "$s" "$out/report.md" || fail "report lacks '$s'"
done
grep -q "train_2_cpu_fp32 vs train_1_cpu_fp32: .* ok$" "$out/train_compare.txt" || fail "the 2-rank run does not match"
# quintet's MPI, HDF5, BLIS and Boost libraries come from the prefix (the loader, offline).
ch --offline 'cd /root/quintet && source scripts/bundle_env.sh && bundle_activate .gpu-bundle build-gpu/bundle-prefix 2>/dev/null &&
    ldd build-gpu/quintet' > "$work/ldd.txt" 2>&1 || fail "ldd failed: $(tail -3 "$work/ldd.txt")"
for lib in libmpi.so libhdf5_openmpi.so libblis.so libboost_program_options.so; do
    grep -E "^\s*$lib" "$work/ldd.txt" | grep -q "/root/quintet/build-gpu/bundle-prefix/" ||
        fail "$lib does not resolve into the bundle's prefix: $(grep "$lib" "$work/ldd.txt")"
done
grep -q "not found" "$work/ldd.txt" && fail "unresolved libraries: $(grep 'not found' "$work/ldd.txt")"
ch 'dpkg-query -W -f="\${Status}" libopenmpi3 2>/dev/null | grep -q "install ok installed"' &&
    fail "Open MPI got installed into the system"

# ---- 7. every fallback in use -----------------------------------------------------------------
# As on a machine that has none of the bundle's libraries, only the C library and the compiler's
# runtime: every package (fallbacks included) unpacked into a second prefix, whose folders then
# come first on the loader's path; the quintet just built must find everything there and train.
ch --offline 'cd /root/quintet && source scripts/bundle_env.sh &&
    QUINTET_BUNDLE_UNPACK_ALL=1 bundle_activate .gpu-bundle /root/all-prefix > /dev/null 2>&1 &&
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 &&
    ldd build-gpu/quintet > /root/ldd-all.txt &&
    mpiexec --oversubscribe -n 2 build-gpu/quintet train inputs/quickstart.deck --train.steps=3 --train.warmup=1 --eval.every=0 \
        --output.log_every=1 --output.run_dir=/root/all-run > /root/all-train.log 2>&1' ||
    fail "with every package unpacked: $(tail -5 "$root/root/all-train.log" 2>/dev/null)"
grep -q "not found" "$root/root/ldd-all.txt" && fail "with every package unpacked, unresolved: $(grep 'not found' "$root/root/ldd-all.txt")"
for lib in libmpi.so libhdf5_openmpi.so libcurl.so libpsl.so libunistring.so libgnutls.so libssl.so libz.so libudev.so; do
    grep -E "^\s*$lib" "$root/root/ldd-all.txt" | grep -q "=> /root/all-prefix/" ||
        fail "with every package unpacked, $lib does not resolve into it: $(grep "$lib" "$root/root/ldd-all.txt")"
done
grep -q "step      3/3 | loss" "$root/root/all-train.log" || fail "the run with every package unpacked did not finish: $(tail -5 "$root/root/all-train.log")"
say "every fallback in use: $(grep -c '=> /root/all-prefix/' "$root/root/ldd-all.txt") of quintet's $(grep -c '=>' "$root/root/ldd-all.txt") libraries from the bundle; 3 steps on 2 ranks: $(grep -o 'step      3/3 | loss [0-9.]*' "$root/root/all-train.log")"
say "PASS: quintet built and trained on 2 ranks from the bundle alone, offline (report: $report)"
exit 0
