#!/usr/bin/env bash
# A fresh, minimal Debian 12 (bookworm) system in a folder, for proving what a bare machine needs
# (scripts/gpu_bundle.sh derives the GPU bundle's package list against one; the test
# tests/gpu_bundle/test_gpu_bundle.sh builds quintet in one with the network cut). Needs root.
#
#   scripts/debian_chroot.sh create DIR              unpack a fresh minbase system into DIR (DIR must
#                                                    not exist); the first call runs debootstrap
#                                                    (~3 min, network) and caches it as a tarball
#   scripts/debian_chroot.sh run DIR [--offline] CMD run the shell command CMD as root inside DIR with
#                                                    a clean environment; --offline: in a new network
#                                                    namespace (loopback only: no route anywhere)
#   scripts/debian_chroot.sh destroy DIR             unmount what `run` mounted and remove DIR
#
# Environment: QUINTET_DEBIAN_TARBALL (cache; default /var/tmp/quintet-debian-bookworm-minbase.tar),
#   QUINTET_DEBIAN_MIRROR (default: this machine's first Debian mirror, else deb.debian.org).
# /proc, /sys, a private /dev (device nodes, /dev/shm, /dev/pts) are mounted for each `run` and
# unmounted after it, never bind mounts of this machine's trees, so removing DIR cannot reach them.
set -euo pipefail

die() { echo "debian_chroot: $*" >&2; exit 2; }
usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }

tarball=${QUINTET_DEBIAN_TARBALL:-/var/tmp/quintet-debian-bookworm-minbase.tar}

[[ $# -ge 1 ]] || { usage >&2; exit 2; }
verb=$1; shift
case "$verb" in
    -h|--help) usage; exit 0 ;;
    create|run|destroy) ;;
    *) die "unknown command '$verb' (valid: create, run, destroy; --help)" ;;
esac
[[ $# -ge 1 ]] || die "$verb: missing DIR"
dir=$1; shift
dir=$(realpath -m -- "$dir")
[[ $dir != / ]] || die "DIR must be a folder other than /"
[[ $(id -u) -eq 0 ]] || die "must run as root (chroot, mount, debootstrap)"

host_mirror() {
    local m=${QUINTET_DEBIAN_MIRROR:-}
    [[ -n $m ]] || m=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
    [[ -n $m ]] || m=$(awk '$1 == "deb" && $2 !~ /^\[/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
    echo "${m:-http://deb.debian.org/debian}"
}

mounts_under() {  # mount points at or below $1, deepest first
    awk -v d="$1" '$2 == d || index($2, d "/") == 1 {print $2}' /proc/self/mounts | sort -r
}

unmount_all() {
    local m
    for m in $(mounts_under "$1"); do umount "$m" 2>/dev/null || umount -l "$m"; done
    [[ -z $(mounts_under "$1") ]] || die "could not unmount everything under $1: $(mounts_under "$1" | tr '\n' ' ')"
}

case "$verb" in
create)
    [[ $# -eq 0 ]] || die "create: unexpected argument '$1'"
    [[ ! -e $dir ]] || die "create: $dir exists (destroy it first)"
    if [[ ! -s $tarball ]]; then
        if ! command -v debootstrap >/dev/null; then
            echo "debian_chroot: installing debootstrap" >&2
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null ||
                die "debootstrap is missing and apt-get could not install it"
        fi
        mirror=$(host_mirror)
        bs="$tarball.bootstrap.$$"
        rm -rf "$bs"
        echo "debian_chroot: debootstrap --variant=minbase bookworm from $mirror (once; cached in $tarball)" >&2
        if ! debootstrap --variant=minbase bookworm "$bs" "$mirror" > "$tarball.log" 2>&1; then
            unmount_all "$bs"; rm -rf --one-file-system "$bs"
            die "debootstrap failed: see $tarball.log"
        fi
        unmount_all "$bs"
        tar -C "$bs" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
        rm -rf --one-file-system "$bs"
    fi
    mkdir -p "$dir"
    tar -C "$dir" -xf "$tarball"
    ;;
run)
    offline=0
    if [[ ${1:-} == --offline ]]; then offline=1; shift; fi
    [[ $# -eq 1 ]] || die "run: give the command as one argument (run DIR [--offline] 'CMD')"
    cmd=$1
    [[ -x $dir/bin/bash ]] || die "run: $dir is not a Debian system (no bin/bash): create it first"
    [[ -z $(mounts_under "$dir") ]] || die "run: $dir has mounts already (another run going on?)"
    trap 'unmount_all "$dir"' EXIT
    mount -t proc proc "$dir/proc"
    mount -t sysfs sysfs "$dir/sys"
    mount -t tmpfs -o mode=755,size=64m tmpfs "$dir/dev"
    for n in "null 1 3" "zero 1 5" "full 1 7" "random 1 8" "urandom 1 9" "tty 5 0"; do
        read -r name major minor <<< "$n"
        mknod -m 666 "$dir/dev/$name" c "$major" "$minor"
    done
    mkdir "$dir/dev/shm" "$dir/dev/pts"
    mount -t tmpfs -o mode=1777 tmpfs "$dir/dev/shm"
    mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$dir/dev/pts"
    ln -s pts/ptmx "$dir/dev/ptmx"
    ln -s /proc/self/fd "$dir/dev/fd"
    [[ $offline == 1 ]] || cp /etc/resolv.conf "$dir/etc/resolv.conf" 2>/dev/null || true
    inner=(chroot "$dir" /usr/bin/env -i HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive
           PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin /bin/bash -c "$cmd")
    if [[ $offline == 1 ]]; then
        # A new network namespace has only a loopback interface, down: bring it up (a GPU machine
        # without a network still has one; Open MPI's processes talk over it), nothing else.
        unshare --net -- /bin/bash -c 'ip link set lo up && exec "$@"' inner "${inner[@]}"
    else
        "${inner[@]}"
    fi
    ;;
destroy)
    [[ $# -eq 0 ]] || die "destroy: unexpected argument '$1'"
    [[ -e $dir ]] || exit 0
    unmount_all "$dir"
    rm -rf --one-file-system "$dir"
    ;;
esac
