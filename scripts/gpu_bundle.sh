#!/usr/bin/env bash
# Downloads the Debian 12 packages quintet needs to build and run on a machine that has only a
# C++ compiler, CMake and Python 3 and no package registry (the GPU machine: docs/cuda.md), into
# an ignored folder of the repository, .gpu-bundle/ (scripts/gpu_check.sh unpacks it there).
#
#   scripts/gpu_bundle.sh              derive the list, download, write .gpu-bundle/MANIFEST.txt
#   scripts/gpu_bundle.sh --list       derive and print apt's list only (no download, no fallbacks)
#   scripts/gpu_bundle.sh --out DIR    another folder than .gpu-bundle
#
# The list is not written by hand: in a fresh minimal Debian 12 (scripts/debian_chroot.sh) with
# only what every such machine is assumed to have -- g++ and python3 (CMake is not assumed to
# bring libraries: it may be a standalone binary there) -- apt-get resolves the build and run
# packages of scripts/setup.sh (TOP below) and the bundle is exactly the packages it would
# install. EXCLUDE names packages that apt would pull in but quintet does not use; they are
# declared present (stubs without dependencies, pinned) for the resolution, so what only they
# need drops out too. The libraries those packages load from the minimal system (libssl, gnutls,
# krb5, libunistring...) come along as fallbacks, transitively, less the compiler's runtime and
# the C library: gpu_check.sh unpacks a fallback only where the machine lacks its sonames.
# tests/gpu_bundle/test_gpu_bundle.sh proves the result complete: quintet builds and trains from
# it in a minimal Debian with the network cut, and runs with every fallback in use.
#
# Needs root (chroot) and the Debian registry. Bundle size limit: 48 MiB (the device call
# carries the repository and this folder, 64 MiB in all).
# Outputs: DIR/debs/*.deb, DIR/MANIFEST.txt (packages, versions, sizes, purpose; the libraries
# the bundle expects from the system), DIR/system-libs.txt (those sonames, one a line),
# DIR/fallbacks.txt (the fallback packages).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$(pwd -P)

die() { echo "gpu_bundle: $*" >&2; exit 2; }
out=.gpu-bundle
list_only=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --list) list_only=1 ;;
        --out) [[ $# -ge 2 && -n $2 ]] || die "--out needs a folder"; out=$2; shift ;;
        -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument '$1' (valid: --list, --out DIR, --help)" ;;
    esac
    shift
done
[[ $(id -u) -eq 0 ]] || die "must run as root (it derives the list in a Debian chroot)"
LIMIT_MIB=48

# What quintet's build and runs need (scripts/setup.sh's list without the compiler, CMake,
# Python, git, the optional OpenBLAS and ICU): make is CMake's default generator's tool. ICU
# (libicu-dev and libicu72, about 20 MiB) would not fit the limit; it serves only tokenizer.json
# files with an NFC normalizer, so gpu_check.sh builds with -DQUINTET_NFC=OFF where it is absent.
TOP=(openmpi-bin libopenmpi-dev libhdf5-openmpi-dev libboost-program-options-dev
     libblis-openmp-dev libgtest-dev libpcre2-dev libsentencepiece-dev nlohmann-json3-dev liblbfgs-dev
     zlib1g-dev libzstd-dev liblzma-dev make)
# What the machine is assumed to have (the GPU image: a C++ compiler and Python 3).
BASELINE=(g++ python3)
# Packages apt would pull in that quintet does not use: "regex<TAB>reason" (whole package names).
EXCLUDE="gfortran-12|libgfortran-12-dev|libhdf5-openmpi-fortran-102|libhdf5-openmpi-hl-fortran-100	Fortran compiler and HDF5's Fortran bindings (quintet is C++)
libhwloc-dev|libevent-dev|libpmix-dev|libibverbs-dev|libjpeg-dev	headers of Open MPI's and HDF5's own dependencies: mpi.h and hdf5.h include none of them, and neither mpicxx nor h5pcc names them on the link line (only -lmpi; -lhdf5 -lcrypto -lcurl -lsz -lz)
libjs-jquery|libjs-jquery-ui	JavaScript for Open MPI's HTML documentation
googletest	GoogleTest's sources (libgtest-dev ships the built libraries and CMake files)
openssh-client	mpirun's launcher for other hosts (one machine here; gpu_check.sh sets plm_rsh_agent)
libhwloc-plugins	hwloc's optional X11, OpenCL, NV-CONTROL and PCI plugins (CPU topology needs none)"

work=$(mktemp -d /var/tmp/quintet-gpu-bundle.XXXXXX)
root="$work/root"
cleanup() { bash "$repo/scripts/debian_chroot.sh" destroy "$root" || true; rm -rf --one-file-system "$work"; }
trap cleanup EXIT
bash scripts/debian_chroot.sh create "$root"
mkdir -p "$root/root/bundle"
printf '%s\n' "$EXCLUDE" > "$root/root/bundle/exclude.tsv"

# Runs inside the chroot: resolve, download, describe.
cat > "$root/root/derive.sh" <<'EOF'
set -euo pipefail
cd /root/bundle
top=$1 baseline=$2 list_only=$3
echo "gpu_bundle: apt-get update; installing the baseline: $baseline" >&2
apt-get update -qq || { echo "gpu_bundle: apt-get update failed: is the Debian registry reachable?" >&2; exit 3; }
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $baseline > baseline.log 2>&1 ||
    { tail -20 baseline.log >&2; exit 3; }
# The exclusions as installed stubs (no dependencies) in a copy of dpkg's status file, pinned
# (priority -1) so that apt keeps the stub instead of installing the real package over it.
cp /var/lib/dpkg/status status.stubs
: > preferences.stubs
while IFS=$'\t' read -r re reason; do
    [[ -n $re ]] || continue
    for p in $(apt-cache pkgnames | grep -xE "$re" | sort); do
        apt-cache show --no-all-versions "$p" |
            awk '/^(Package|Version|Architecture|Multi-Arch):/ {print} END {print "Status: install ok installed\n"}' >> status.stubs
        printf 'Package: %s\nPin: release *\nPin-Priority: -1\n\n' "$p" >> preferences.stubs
    done
done < exclude.tsv
# shellcheck disable=SC2086
apt-get -o Dir::State::status=/root/bundle/status.stubs -o Dir::Etc::Preferences=/root/bundle/preferences.stubs \
    install --simulate --no-install-recommends $top > simulate.log 2>&1 || { cat simulate.log >&2; exit 3; }
awk '/^Inst /{v=$3; gsub(/[()]/, "", v); print $2 "=" v}' simulate.log > packages.txt
if [[ $list_only == 1 ]]; then cat packages.txt; exit 0; fi
mkdir -p debs
(cd debs && xargs apt-get -o APT::Sandbox::User=root download -qq < ../packages.txt)
# The libraries the unpacked packages in folder $1 need but do not contain.
missing_libs() {
    find "$1" -type f \( -name '*.so*' -o -path '*/bin/*' \) -print0 |
        { xargs -0 readelf -d 2>/dev/null || true; } | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u > needed.txt
    { find "$1" \( -type f -o -type l \) -name 'lib*.so*' -printf '%f\n'
      find "$1" -type f -name '*.so*' -print0 | { xargs -0 readelf -d 2>/dev/null || true; } |
          sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p'; } | sort -u > provided.txt
    comm -23 needed.txt provided.txt
}
mkdir x
for d in debs/*.deb; do dpkg-deb -x "$d" x; done
# Fallbacks: the packages of the libraries the bundle expects from this minimal system, and of
# what those load in turn, less the compiler's runtime (the image's own must serve). gpu_check.sh
# unpacks a fallback only where the machine lacks its sonames -- e.g. Ubuntu 24.04 has
# libunistring.so.5, not the .so.2 that Debian's libpsl5 (libcurl4 <- HDF5) loads.
core=" libc6 libgcc-s1 libstdc++6 libgomp1 libatomic1 "
: > fallbacks.txt
todo=$(missing_libs x)
ldconfig -p > ldcache.txt
seen=" "
while [[ -n $todo ]]; do
    next=""
    for so in $todo; do
        [[ $seen == *" $so "* ]] && continue
        seen+="$so "
        path=$(awk -v s="$so" '$1 == s && /x86-64/ {print $NF; exit}' ldcache.txt)
        [[ -n $path ]] || { echo "gpu_bundle: $so is not on the minimal system either" >&2; continue; }
        real=$(readlink -f "$path")
        pkg=$({ dpkg -S "/lib/x86_64-linux-gnu/${real##*/}" "/usr/lib/x86_64-linux-gnu/${real##*/}" 2>/dev/null || true; } |
              head -1 | cut -d: -f1)
        [[ -n $pkg ]] || { echo "gpu_bundle: no package owns $real" >&2; continue; }
        [[ $core == *" $pkg "* ]] && continue
        grep -qx "$pkg" fallbacks.txt || echo "$pkg" >> fallbacks.txt
        next+=" $(readelf -d "$real" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
    done
    todo=$next
done
sort -o fallbacks.txt fallbacks.txt
if [[ -s fallbacks.txt ]]; then
    (cd debs && xargs apt-get -o APT::Sandbox::User=root download -qq < ../fallbacks.txt)
    while read -r p; do dpkg-deb -x debs/"${p}"_*.deb x; done < fallbacks.txt
fi
# What is left to the system: the compiler's runtime and the C library.
missing_libs x > system-libs.txt
describe() {  # package lines: name version KiB: purpose
    local p v f
    while read -r p v; do
        f=$(ls debs/"${p}"_*.deb)
        printf '%s %s %d: %s\n' "$p" "$v" $(( $(stat -c %s "$f") / 1024 )) \
            "$(apt-cache show --no-all-versions "$p" | sed -n 's/^Description\(-en\)\{0,1\}: //p' | head -1)"
    done
}
{
    echo "# quintet GPU bundle (scripts/gpu_bundle.sh)"
    echo "made: $(date -u +%Y-%m-%dT%H:%MZ) from Debian $(cat /etc/debian_version) ($(apt-cache policy | sed -n 's/.*release.*o=Debian,a=\([^,]*\),n=\([^,]*\).*/\1 \2/p' | head -1))"
    echo "resolved against: debootstrap minbase + $baseline; top-level: $top"
    echo
    echo "## packages (name version KiB: purpose)"
    tr '=' ' ' < packages.txt | describe
    echo
    echo "## fallbacks: the libraries above need these from the system; unpacked only where it lacks them"
    while read -r p; do
        echo "$p $(apt-cache show --no-all-versions "$p" | sed -n 's/^Version: //p' | head -1)"
    done < fallbacks.txt | describe
    echo
    echo "total: $(ls debs/*.deb | wc -l) packages, $(du -cb debs/*.deb | tail -1 | cut -f1) bytes"
    echo
    echo "## excluded (apt would install them; quintet does not use them)"
    while IFS=$'\t' read -r re reason; do
        [[ -n $re ]] && echo "- ${re//|/, }: $reason"
    done < exclude.tsv
    echo
    echo "## libraries expected from the system (needed by the bundle, not in it: the compiler's runtime, the C library)"
    tr '\n' ' ' < system-libs.txt; echo
} > MANIFEST.txt
rm -rf x
EOF

bash scripts/debian_chroot.sh run "$root" \
    "bash /root/derive.sh '${TOP[*]}' '${BASELINE[*]}' $list_only"
b="$root/root/bundle"
[[ $list_only == 1 ]] && exit 0

bytes=$(du -cb "$b"/debs/*.deb | tail -1 | cut -f1)
mib=$(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}')
if (( bytes > LIMIT_MIB * 1048576 )); then
    echo "gpu_bundle: the bundle is $mib MiB, over the $LIMIT_MIB MiB limit:" >&2
    ls -S -s --block-size=K "$b"/debs | head -12 >&2
    exit 1
fi
# Replace the previous bundle only if the folder is one (never an unrelated folder).
if [[ -e $out ]]; then
    [[ -f $out/MANIFEST.txt || -z $(ls -A "$out") ]] ||
        die "$out exists and is not a GPU bundle (no MANIFEST.txt): not replacing it"
    rm -rf --one-file-system "$out"
fi
mkdir -p "$out"
mv "$b/debs" "$b/MANIFEST.txt" "$b/system-libs.txt" "$b/fallbacks.txt" "$out/"
echo "gpu_bundle: $out: $(ls "$out"/debs | wc -l) packages, $mib MiB (limit $LIMIT_MIB); see $out/MANIFEST.txt"
