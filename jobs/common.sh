# shellcheck shell=bash
# Shared environment and launch logic for the quintet batch templates
# (jobs/slurm/train.sbatch, jobs/pbs/train.pbs). It is sourced, not executed, and holds no
# site paths or host names: everything site-specific comes from the environment below.
#
# Contract with quintet: `quintet train DECK [--section.key=value ...]` resumes from
# run_dir/checkpoints/latest when checkpoint.resume = auto (the default), and on SIGUSR1 or
# SIGTERM writes a checkpoint and exits 0. The templates send SIGUSR1 shortly before the
# time limit, then requeue (Slurm) or resubmit (PBS) the job, which resumes in the same run_dir.
#
# Environment (all optional):
#   QUINTET_BIN           executable                          (default: build/quintet)
#   QUINTET_LAUNCHER      replaces the default launcher "mpirun -n N --bind-to core
#                         --map-by slot:PE=T" (word-split), e.g. "srun --mpi=pmix" or
#                         "mpiexec -n 8" for MPICH/Intel MPI; it must forward SIGUSR1 to the ranks
#   QUINTET_MPIRUN_FLAGS  extra flags for the default mpirun (word-split), e.g. "--mca btl ^openib"
#   QUINTET_RUNS          parent folder of the default run_dir  (default: runs)
#   QUINTET_MAX_REQUEUES  stop requeueing after this many restarts (default: 20)

# quintet_env THREADS: thread and binding environment for THREADS OpenMP threads per rank.
quintet_env() {
    local threads=$1
    if ! [[ $threads =~ ^[1-9][0-9]*$ ]]; then
        echo "quintet job: threads per rank must be a positive integer, got '$threads'" >&2
        return 2
    fi
    export OMP_NUM_THREADS=$threads
    export OPENBLAS_NUM_THREADS=$threads  # pthread builds of OpenBLAS read this one
    export OMP_PLACES=cores               # each rank's threads stay on the cores mpirun bound it to
    export OMP_PROC_BIND=close
}

# quintet_deck_sets DECK SECTION KEY: succeeds when the deck file assigns SECTION.KEY.
quintet_deck_sets() {
    awk -v want_s="$2" -v want_k="$3" '
        { sub(/#.*/, "") }
        /^[[:space:]]*\[/ { s = $0; gsub(/[][[:space:]]/, "", s); next }
        /=/ {
            k = substr($0, 1, index($0, "=") - 1); gsub(/[[:space:]]/, "", k)
            if ((s == want_s && k == want_k) || (s == "" && k == want_s "." want_k)) found = 1
        }
        END { exit !found }' "$1"
}

# quintet_has_override SECTION.KEY ARGS...: succeeds when ARGS contain --SECTION.KEY=...
quintet_has_override() {
    local key=$1 a
    shift
    for a in "$@"; do
        [[ $a == "--$key="* ]] && return 0
    done
    return 1
}

# quintet_args DECK [OVERRIDES...]: sets the array QUINTET_ARGS to the quintet command line.
# Adds --train.threads=$OMP_NUM_THREADS and, unless the deck or the overrides set it,
# --output.run_dir=$QUINTET_RUNS/<deck name>, so that a requeued job resumes in the same folder.
# User overrides come last and are passed through unchanged.
quintet_args() {
    local deck=$1
    shift
    if [[ ! -r $deck ]]; then
        echo "quintet job: deck '$deck' is not readable (relative paths start at $PWD)" >&2
        return 2
    fi
    local name
    name=$(basename "$deck")
    name=${name%.deck}
    QUINTET_ARGS=(train "$deck")
    if ! quintet_has_override train.threads "$@"; then
        QUINTET_ARGS+=("--train.threads=$OMP_NUM_THREADS")
    fi
    if ! quintet_has_override output.run_dir "$@" && ! quintet_deck_sets "$deck" output run_dir; then
        QUINTET_ARGS+=("--output.run_dir=${QUINTET_RUNS:-runs}/$name")
    fi
    QUINTET_ARGS+=("$@")
}

# Signal handler: remember which signal came and pass a checkpoint request (SIGUSR1) to the
# launcher, which forwards it to every rank (Open MPI mpirun and srun both forward SIGUSR1).
# SIGTERM is also turned into SIGUSR1: the launcher's own SIGTERM handling may kill the ranks
# before they have written their checkpoint.
quintet_on_signal() {
    QUINTET_SIGNAL=$1
    QUINTET_TRAPPED=1
    echo "quintet job: received SIG$1 at $(date '+%F %T'); asking quintet to checkpoint and stop" >&2
    if [[ -n ${QUINTET_PID:-} ]]; then
        kill -s USR1 "$QUINTET_PID" 2>/dev/null || true
    fi
}

# quintet_run NRANKS [LAUNCHER_ARGS...]: runs $QUINTET_BIN "${QUINTET_ARGS[@]}" on NRANKS ranks
# in the background, forwarding SIGUSR1/SIGTERM, and returns quintet's exit status.
# Afterwards QUINTET_SIGNAL is USR1 or TERM if the run was interrupted by that signal, else empty.
quintet_run() {
    local nranks=$1
    shift
    local bin=${QUINTET_BIN:-build/quintet}
    if [[ ! -x $bin ]]; then
        echo "quintet job: '$bin' is not an executable (build it, or set QUINTET_BIN)" >&2
        return 2
    fi
    local -a launch extra=()
    if [[ -n ${QUINTET_LAUNCHER:-} ]]; then
        read -r -a launch <<<"$QUINTET_LAUNCHER"
    else
        if [[ -n ${QUINTET_MPIRUN_FLAGS:-} ]]; then
            read -r -a extra <<<"$QUINTET_MPIRUN_FLAGS"
        fi
        launch=(mpirun -n "$nranks" --bind-to core --map-by "slot:PE=$OMP_NUM_THREADS"
                "$@" "${extra[@]}")
    fi
    echo "quintet job: $(date '+%F %T') ${launch[*]} $bin ${QUINTET_ARGS[*]}"
    echo "quintet job: OMP_NUM_THREADS=$OMP_NUM_THREADS, working directory $PWD"

    QUINTET_SIGNAL=
    QUINTET_TRAPPED=0
    trap 'quintet_on_signal USR1' USR1
    trap 'quintet_on_signal TERM' TERM
    trap 'quintet_on_signal INT' INT
    local started
    started=$(date +%s)
    "${launch[@]}" "$bin" "${QUINTET_ARGS[@]}" &
    QUINTET_PID=$!
    # A trapped signal interrupts `wait` with status 128+n while the run goes on (it is
    # writing its checkpoint), so wait again until the real exit status arrives.
    local rc=0
    wait "$QUINTET_PID" || rc=$?
    while ((rc > 128 && QUINTET_TRAPPED)); do
        QUINTET_TRAPPED=0
        rc=0
        wait "$QUINTET_PID" || rc=$?
    done
    trap - USR1 TERM INT
    QUINTET_PID=
    echo "quintet job: $(date '+%F %T') quintet exited with status $rc${QUINTET_SIGNAL:+ after SIG$QUINTET_SIGNAL}"
    # Open MPI's mpirun returns 1 when it was sent SIGTERM or SIGINT itself (scancel and qdel
    # signal every process of the job), even though every rank checkpointed and exited 0. Rank 0
    # leaves run_dir/stopped in that case: then the stop was clean, and the status is 0.
    if ((rc != 0)) && [[ -n $QUINTET_SIGNAL ]]; then
        local run_dir stamp
        run_dir=$("$bin" deck --get output.run_dir "${QUINTET_ARGS[@]:1}" 2>/dev/null) || run_dir=
        stamp=$(stat -c %Y "$run_dir/stopped" 2>/dev/null) || stamp=0
        if [[ -n $run_dir ]] && ((stamp >= started)); then
            echo "quintet job: the launcher's status $rc follows the signal; quintet stopped cleanly ($(head -n 1 "$run_dir/stopped"), $run_dir/stopped): status 0"
            rc=0
        fi
    fi
    # A rank that died (killed by a signal, the node lost) makes the launcher return 128+n or
    # another status of its own; like a missed deadline that is a transient fault: status 4,
    # requeue (docs/reliability.md, "Exit statuses").
    if ((rc > 4)); then
        echo "quintet job: status $rc is not quintet's own (a rank died?): treated as a transient fault (4)" >&2
        rc=4
    fi
    return "$rc"
}
