#!/usr/bin/env bash
# A real single-node Slurm cluster in one folder, for the job-template tests (docs/jobs.md).
#
#   bash scripts/slurm_local.sh start DIR   # install (root), configure, start munged/slurmctld/slurmd
#   eval "$(bash scripts/slurm_local.sh env DIR)"   # SLURM_CONF for sbatch, squeue, scontrol ...
#   bash scripts/slurm_local.sh status DIR  # sinfo and the daemons' pids
#   bash scripts/slurm_local.sh stop DIR    # cancel its jobs, stop the daemons: nothing left running
#
# Debian's slurm-wlm and munge (and libpmix-dev, whose unversioned libpmix.so the mpi/pmix
# plugin dlopens) are installed with apt-get when missing -- as root only; otherwise this says
# what is missing and exits 77 (the test suite's "skipped"). Nothing outside DIR is written
# except by that installation: slurm.conf, cgroup.conf, the munge key and socket, the state and
# spool folders, logs and pid files all live in DIR, and no systemd or init script is used, so
# it works in a container or a chroot. The cluster: ClusterName quintet-test, one node (this
# host's short name, CPUs and memory from `slurmd -C`), one partition `debug`, no accounting,
# no cgroups (proctrack/linuxproc, task/none), consumable cores (jobs share the node), requeue
# on, and a requeued job starts again after about 6 s (QUINTET_SLURM_CRED_EXPIRE, default 5).
# Ports: QUINTET_SLURM_PORT (slurmctld; slurmd gets the next one), default the first free pair
# from 6817.
set -euo pipefail

die() {
    echo "slurm_local: $*" >&2
    exit 1
}

usage() {
    echo "usage: $0 start|stop|status|env DIR" >&2
    exit 2
}

[[ $# -eq 2 ]] || usage
cmd=$1
mkdir -p "$2"
D=$(cd "$2" && pwd -P)
CONF=$D/slurm.conf
SOCK=$D/munge/munge.socket
LIBDIR=/usr/lib/$(uname -m)-linux-gnu  # Debian multiarch (x86_64, aarch64)
PLUGINS=$LIBDIR/slurm-wlm
export SLURM_CONF=$CONF

# pid in FILE if that process is alive, else nothing (and a failing status).
live_pid() {
    local pid
    [[ -r $1 ]] || return 1
    pid=$(tr -dc 0-9 <"$1")
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

# stop_pid FILE NAME: SIGTERM, up to 15 s, then SIGKILL; removes FILE.
stop_pid() {
    local pid i
    if pid=$(live_pid "$1"); then
        kill "$pid" 2>/dev/null || true
        for ((i = 0; i < 150; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            echo "slurm_local: $2 (pid $pid) did not stop in 15 s: SIGKILL" >&2
            kill -9 "$pid" 2>/dev/null || true
        fi
        echo "slurm_local: stopped $2 (pid $pid)"
    fi
    rm -f "$1"
}

# Processes run for this cluster's jobs (slurmstepd and what it started) that outlived slurmd:
# every slurmstepd whose environment names this slurm.conf, and its descendants.
stray_steps() {
    local p comm
    for p in /proc/[0-9]*; do
        p=${p#/proc/}
        comm=$(cat "/proc/$p/comm" 2>/dev/null) || continue
        [[ $comm == slurmstepd* ]] || continue
        if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$CONF"; then
            echo "$p"
        fi
    done
}

descendants() {
    local c
    for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do
        echo "$c"
        descendants "$c"
    done
}

port_free() {
    ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

log_tails() {
    local f
    for f in "$D"/log/*.log; do
        [[ -r $f ]] || continue
        echo "---- last lines of $f" >&2
        tail -n 25 "$f" >&2
    done
}

install_packages() {
    local -a need=()
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null || need+=(slurmctld slurmd)
    command -v sbatch >/dev/null || need+=(slurm-client)
    command -v munged >/dev/null || need+=(munge)
    [[ -e $PLUGINS/mpi_pmix.so ]] || need+=(slurm-wlm-basic-plugins)
    # The pmix plugin dlopens pmix2/lib/libpmix.so, the unversioned link that libpmix-dev ships.
    [[ -e $LIBDIR/pmix2/lib/libpmix.so ]] || need+=(libpmix-dev)
    command -v ps >/dev/null || need+=(procps)
    command -v hostname >/dev/null || need+=(hostname)
    ((${#need[@]})) || return 0
    if [[ $(id -u) -ne 0 ]]; then
        echo "slurm_local: skipped: ${need[*]} not installed, and installing needs root" \
            "(as root: apt-get install slurm-wlm munge libpmix-dev)" >&2
        exit 77
    fi
    command -v apt-get >/dev/null || { echo "slurm_local: skipped: no apt-get to install ${need[*]}" >&2; exit 77; }
    echo "slurm_local: installing ${need[*]}"
    # No init scripts or systemd units may start system daemons in a chroot/container: deny
    # service starts for the length of the installation (unless a policy is already there).
    local policy=/usr/sbin/policy-rc.d added=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && added=1
    fi
    local rc=0
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" \
        >"$D/apt.log" 2>&1 || {
        DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$D/apt.log" 2>&1 &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" \
                >>"$D/apt.log" 2>&1
    } || rc=$?
    ((added)) && rm -f "$policy"
    if ((rc)); then
        tail -n 20 "$D/apt.log" >&2
        die "apt-get install ${need[*]} failed (log: $D/apt.log)"
    fi
}

start_munge() {
    mkdir -p "$D/munge" "$D/log"
    chmod 700 "$D/munge"
    if live_pid "$D/munge/munged.pid" >/dev/null; then
        echo "slurm_local: munged already running (pid $(live_pid "$D/munge/munged.pid"))"
        return
    fi
    if [[ ! -s $D/munge/munge.key ]]; then
        if command -v mungekey >/dev/null; then
            mungekey --create --keyfile="$D/munge/munge.key"
        else
            dd if=/dev/urandom of="$D/munge/munge.key" bs=1024 count=1 status=none
        fi
    fi
    chmod 600 "$D/munge/munge.key"
    rm -f "$SOCK" "$SOCK.lock"
    # --force: DIR may sit below a folder that munged finds too open (e.g. group-writable).
    # --origin: this host's name need not resolve (a fresh chroot's /etc/hosts lacks it).
    munged --force --origin=127.0.0.1 --socket="$SOCK" --key-file="$D/munge/munge.key" --pid-file="$D/munge/munged.pid" \
        --log-file="$D/log/munged.log" --seed-file="$D/munge/munged.seed" ||
        { log_tails; die "munged did not start"; }
    local i
    for ((i = 0; i < 50; i++)); do
        [[ -S $SOCK ]] && break
        sleep 0.1
    done
    munge -n -S "$SOCK" | unmunge -S "$SOCK" >/dev/null || { log_tails; die "munge does not answer on $SOCK"; }
    echo "slurm_local: munged running (pid $(live_pid "$D/munge/munged.pid")), socket $SOCK"
}

write_conf() {
    local node hw port i
    node=$(hostname -s 2>/dev/null || uname -n)
    node=${node%%.*}
    # "NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=24105"
    hw=$(slurmd -C 2>/dev/null | sed -n 's/^NodeName=[^ ]* //p' | head -n 1)
    [[ $hw == *CPUs=* ]] || die "slurmd -C printed no node line"
    if [[ -n ${QUINTET_SLURM_PORT:-} ]]; then
        port=$QUINTET_SLURM_PORT
    else
        port=6817
        for ((i = 0; i < 40; i++)); do
            port_free "$port" && port_free $((port + 1)) && break
            port=$((port + 2))
        done
    fi
    mkdir -p "$D/state" "$D/spool" "$D/log" "$D/run"
    cat >"$CONF" <<EOF
# Written by scripts/slurm_local.sh: a single-node test cluster, everything under $D.
ClusterName=quintet-test
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire also sets how long a requeued job waits before it may start again (its begin
# time is now + cred_expire + 1; Slurm's default 120 s).
AuthInfo=socket=$SOCK,cred_expire=${QUINTET_SLURM_CRED_EXPIRE:-5}
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/slurmd
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups (a container or chroot has none to give), no accounting database.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
# Several 1-CPU jobs share the node; the node is what slurm.conf says (no drain for a few MB).
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
# Requeue (the job templates' scontrol requeue) on; requeued jobs start again within seconds
# (cred_expire above); finished jobs stay visible to scontrol show job for MinJobAge seconds.
JobRequeue=1
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1
MinJobAge=60
KillWait=10
InactiveLimit=0
Waittime=0
MessageTimeout=20
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=$node NodeAddr=127.0.0.1 $hw State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
    cat >"$D/cgroup.conf" <<EOF
# Written by scripts/slurm_local.sh. slurm.conf uses no cgroup plugin (proctrack/linuxproc,
# task/none); this only keeps slurmd from looking for systemd.
CgroupPlugin=autodetect
IgnoreSystemd=yes
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
EOF
    echo "$node" >"$D/node"
}

node_state() {
    sinfo -h -N -n "$(cat "$D/node")" -o %T 2>/dev/null | head -n 1
}

start() {
    install_packages
    if [[ $(id -u) -ne 0 ]]; then
        echo "slurm_local: skipped: slurmd and slurmctld (SlurmUser=root) must be started as root" >&2
        exit 77
    fi
    if live_pid "$D/run/slurmctld.pid" >/dev/null && live_pid "$D/run/slurmd.pid" >/dev/null; then
        echo "slurm_local: already running in $D"
    else
        stop_pid "$D/run/slurmd.pid" slurmd
        stop_pid "$D/run/slurmctld.pid" slurmctld
        start_munge
        write_conf
        # A fresh cluster each start: no jobs or node state from an earlier one.
        rm -rf "$D/state" "$D/spool"
        mkdir -p "$D/state" "$D/spool/slurmd"
        slurmctld -f "$CONF" || { log_tails; die "slurmctld did not start"; }
        slurmd -f "$CONF" -N "$(cat "$D/node")" || { log_tails; die "slurmd did not start"; }
    fi
    local i s=
    for ((i = 0; i < 60; i++)); do
        s=$(node_state) || s=
        case $s in
            idle* | mixed* | allocated*) break ;;
        esac
        sleep 1
    done
    case $s in
        idle* | mixed* | allocated*) ;;
        *)
            echo "slurm_local: node $(cat "$D/node") not idle after 60 s (state: '${s:-no answer}')" >&2
            sinfo -N -l >&2 || true
            log_tails
            exit 1
            ;;
    esac
    echo "slurm_local: Slurm $(sinfo -V | awk '{print $2}') up in $D: node $(cat "$D/node") $s," \
        "slurmctld port $(sed -n 's/^SlurmctldPort=//p' "$CONF")"
    echo "slurm_local: use it with: export SLURM_CONF=$CONF"
}

stop() {
    local p ids
    if live_pid "$D/run/slurmctld.pid" >/dev/null; then
        ids=$(squeue -h -o %i 2>/dev/null) || ids=
        if [[ -n $ids ]]; then
            # shellcheck disable=SC2086
            scancel $ids 2>/dev/null || true
            for ((p = 0; p < 30; p++)); do
                [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break
                sleep 0.5
            done
        fi
    fi
    stop_pid "$D/run/slurmd.pid" slurmd
    stop_pid "$D/run/slurmctld.pid" slurmctld
    local -a left=() kids
    for p in $(stray_steps); do
        mapfile -t kids < <(descendants "$p")
        left+=("$p" "${kids[@]}")
    done
    if ((${#left[@]})); then
        echo "slurm_local: ending job processes left behind: ${left[*]}" >&2
        kill -9 "${left[@]}" 2>/dev/null || true
    fi
    stop_pid "$D/munge/munged.pid" munged
}

case $cmd in
    start) start ;;
    stop) stop ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    status)
        for f in run/slurmctld run/slurmd munge/munged; do
            if p=$(live_pid "$D/$f.pid"); then echo "${f#*/}: pid $p"; else echo "${f#*/}: not running"; fi
        done
        sinfo -N -l 2>&1 || true
        ;;
    *) usage ;;
esac
