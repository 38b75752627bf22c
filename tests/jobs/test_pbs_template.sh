#!/usr/bin/env bash
# The PBS job template (jobs/pbs/train.pbs) without a PBS server (Debian has none): syntax,
# the shellcheck linter where it is installed, and dry runs outside PBS with the variables a PBS job sees
# (PBS_JOBID, PBS_O_WORKDIR, PBS_NODEFILE, NCPUS, DECK, OVERRIDES), started from another folder
# as a copy of the script (as PBS runs it), with a fake `qsub` that records its arguments and a
# fake `qstat -f` that reports the job's select and walltime (docs/jobs.md):
#
#   1. a run trains to completion (exit 0, 2 ranks x 1 thread from the node file and NCPUS),
#      no resubmission;
#   2. a transient fault (exit 4: a rank stops answering) resubmits once: qsub -v carries
#      QUINTET_RESUBMITS=1, DECK, OVERRIDES, QUINTET_BIN; -l select/walltime from qstat;
#   3. the walltime: SIGUSR1 QUINTET_SIGNAL_MARGIN s before it, a checkpoint, exit 0 and a
#      resubmission -- which, run with the variables qsub was given, resumes and finishes
#      (its deck says checkpoint.resume = none: a resubmitted job resumes anyway);
#   4. bad input (exit 2: an unknown deck key, an unreadable deck) is not resubmitted;
#   5. the resubmission bound QUINTET_MAX_REQUEUES: no qsub, the fault's status stays 4.
#
#   bash tests/jobs/test_pbs_template.sh [QUINTET_BIN]      # ctest -R test_pbs_template
set -uo pipefail

here=$(cd "$(dirname "$0")/../.." && pwd -P)
cd "$here" || exit 1
QUINTET_BIN=${1:-${QUINTET_BIN:-build/quintet}}
QUINTET_BIN=$(realpath "$QUINTET_BIN" 2>/dev/null) || QUINTET_BIN=
if [[ ! -x $QUINTET_BIN ]]; then
    echo "FAIL: quintet binary '${1:-build/quintet}' is not an executable"
    exit 1
fi
if [[ $(id -u) -eq 0 ]]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
keep_tmp=${QUINTET_KEEP_TMP:-0}
while read -r v; do unset "$v"; done < <(compgen -e | grep -E '^(PBS_|SLURM_|QUINTET_)')
unset DECK OVERRIDES NCPUS OMP_NUM_THREADS

tmp=$(mktemp -d /tmp/quintet-pbs.XXXXXX)
failures=0
cleanup() {
    if ((failures)) || [[ $keep_tmp == 1 ]]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
t_start=$SECONDS
pass() { echo "PASS: $1 ($((SECONDS - t0)) s)"; }
fail() {
    echo "FAIL: $1 ($((SECONDS - t0)) s)"
    failures=$((failures + 1))
}
show() {
    [[ -r $1 ]] && { echo "---- last lines of $1"; grep -v '^[a-z_0-9]* = \|^\[.*\]$\|^$' "$1" | tail -n 25; }
}

# 0. Syntax and shellcheck ---------------------------------------------------------------------
t0=$SECONDS
if bash -n jobs/pbs/train.pbs && bash -n jobs/common.sh && bash -n jobs/slurm/train.sbatch; then
    pass "bash -n jobs/pbs/train.pbs jobs/common.sh jobs/slurm/train.sbatch"
else
    fail "bash -n: syntax errors in the job templates"
fi
t0=$SECONDS
if command -v shellcheck >/dev/null; then
    if shellcheck -x jobs/pbs/train.pbs jobs/slurm/train.sbatch jobs/common.sh; then
        pass "shellcheck -x jobs/pbs/train.pbs jobs/slurm/train.sbatch jobs/common.sh"
    else
        fail "shellcheck reports the job templates"
    fi
else
    echo "SKIP: shellcheck is not installed"
fi

# Fake PBS ------------------------------------------------------------------------------------
mkdir -p "$tmp/bin" "$tmp/home"
# qsub: each call's arguments, one a line, in $tmp/qsub.N; prints a job id like PBS does.
cat >"$tmp/bin/qsub" <<EOF
#!/usr/bin/env bash
n=0
for f in "$tmp"/qsub.*; do [[ -e \$f ]] && n=\$((n + 1)); done
printf '%s\n' "\$@" >"$tmp/qsub.\$((n + 1))"
echo "\$((n + 100)).fakepbs"
EOF
# qstat -f JOBID: the two fields the template reads.
cat >"$tmp/bin/qstat" <<'EOF'
#!/usr/bin/env bash
[[ ${1:-} == -f ]] || exit 1
echo "Job Id: ${2:-?}"
echo "    Job_Name = quintet"
echo "    Resource_List.select = 1:ncpus=2:mpiprocs=2:ompthreads=1"
echo "    Resource_List.walltime = ${FAKE_WALLTIME:-01:00:00}"
EOF
chmod +x "$tmp/bin/qsub" "$tmp/bin/qstat"
printf '%s\n%s\n' "$(hostname)" "$(hostname)" >"$tmp/nodefile"
cp jobs/pbs/train.pbs "$tmp/home/job.SC"  # PBS runs a copy of the script, from $HOME

t0=$SECONDS
"$QUINTET_BIN" prepare --input README.md --tokenizer byte --output "$tmp/data.h5" >"$tmp/prepare.log" 2>&1 ||
    { cat "$tmp/prepare.log"; fail "quintet prepare"; exit 1; }
cat >"$tmp/tiny.deck" <<EOF
[model]
d_model = 32
n_layers = 2
n_heads = 4
n_kv_heads = 2
ffn_dim = 64
[data]
path = $tmp/data.h5
seq_len = 32
micro_batch_size = 2
order = random
[train]
steps = 20
lr = 1e-2
lr_min = 1e-3
warmup = 2
seed = 5
[eval]
every = 0
[checkpoint]
every = 10
[output]
log_every = 5
EOF
sed 's/^\[checkpoint\]$/[checkpoint]\nresume = none/' "$tmp/tiny.deck" >"$tmp/resume_none.deck"
printf '[model]\nd_modle = 32\n' >"$tmp/bad.deck"

# run_job NAME [VAR=VALUE ...]: the template as PBS would run job NAME, from $HOME, with the
# fake qsub/qstat first on PATH; output in $tmp/NAME.log, exit status in $rc.
run_job() {
    local name=$1
    shift
    rc=0
    (cd "$tmp/home" && env PATH="$tmp/bin:$PATH" HOME="$tmp/home" PBS_JOBID="$name.fakepbs" PBS_JOBNAME=quintet \
        PBS_O_WORKDIR="$here" PBS_NODEFILE="$tmp/nodefile" NCPUS=2 QUINTET_BIN="$QUINTET_BIN" "$@" \
        bash "$tmp/home/job.SC") >"$tmp/$name.log" 2>&1 || rc=$?
}
qsub_calls() {
    local f n=0
    for f in "$tmp"/qsub.*; do [[ -e $f ]] && n=$((n + 1)); done
    echo "$n"
}
# The -v list of the last qsub call.
qsub_vars() { awk 'p { print; exit } $0 == "-v" { p = 1 }' "$tmp/qsub.$(qsub_calls)"; }
steps_of() {
    /usr/bin/python3 -c 'import sys, h5py; print(len(h5py.File(sys.argv[1], "r")["/train/loss"]))' "$1/metrics.h5" 2>/dev/null ||
        grep -c '^step ' "$2"
}

# 1. Completes ---------------------------------------------------------------------------------
t0=$SECONDS
run_job complete DECK="$tmp/tiny.deck" OVERRIDES="--output.run_dir=$tmp/complete --train.steps=20"
n=$(steps_of "$tmp/complete" "$tmp/complete.log")
if ((rc == 0)) && [[ $n == 20 ]] && (($(qsub_calls) == 0)) && grep -q '2 ranks x 1 threads' "$tmp/complete.log" &&
    grep -q -- "--hostfile $tmp/nodefile" "$tmp/complete.log"; then
    pass "1. PBS dry run trains to completion: exit 0, 20 steps, 2 ranks x 1 thread, no resubmission"
else
    show "$tmp/complete.log"
    fail "1. PBS dry run: exit $rc, $n steps, $(qsub_calls) qsub call(s) (want 0, 20, 0)"
fi

# 2. Exit 4 resubmits --------------------------------------------------------------------------
t0=$SECONDS
ov="--output.run_dir=$tmp/fault --train.collective_timeout_s=2"
run_job fault DECK="$tmp/tiny.deck" OVERRIDES="$ov" QUINTET_INJECT_FAULT="rank=0,step=2,mode=hang"
calls=$(qsub_calls)
vars=$(qsub_vars 2>/dev/null)
want=("DECK=$tmp/tiny.deck" "OVERRIDES=$ov" "QUINTET_RESUBMITS=1" "QUINTET_BIN=$QUINTET_BIN")
missing=()
for w in "${want[@]}"; do [[ ,$vars, == *",$w,"* ]] || missing+=("$w"); done
if ((calls == 1)) && grep -qx 'select=1:ncpus=2:mpiprocs=2:ompthreads=1' "$tmp/qsub.1" &&
    grep -qx 'walltime=01:00:00' "$tmp/qsub.1" && [[ $(tail -n 1 "$tmp/qsub.1") == "$here/jobs/pbs/train.pbs" ]] &&
    ((${#missing[@]} == 0)) && [[ $vars != *QUINTET_INJECT_FAULT* ]]; then
    if ((rc == 4)); then
        pass "2. exit 4 (a rank hung) resubmits: qsub -v $vars -l select=... -l walltime=... train.pbs"
    else
        show "$tmp/fault.log"
        fail "2. the run with a hung rank exited $rc, want 4 (resubmitted: ok)"
    fi
else
    show "$tmp/fault.log"
    [[ -r $tmp/qsub.1 ]] && { echo "---- qsub arguments:"; cat "$tmp/qsub.1"; }
    fail "2. exit $rc: $calls qsub call(s) (want 1); -v '$vars' lacks: ${missing[*]:-nothing}"
fi
rm -f "$tmp"/qsub.*

# 3. Walltime: SIGUSR1, checkpoint, resubmit; the resubmission resumes ---------------------------
t0=$SECONDS
# Slow steps (about 0.1-0.5 s each; 0.06 on a Zen 4 host, where 30 steps ended before the signal)
# so that the signal, 3 s after the start, comes mid-run; the resubmission runs the rest.
ov="--output.run_dir=$tmp/wall --train.steps=120 --model.d_model=256 --model.ffn_dim=512 --data.seq_len=256 --output.log_every=1"
run_job wall DECK="$tmp/resume_none.deck" OVERRIDES="$ov" FAKE_WALLTIME=00:00:06 QUINTET_SIGNAL_MARGIN=3
vars=$(qsub_vars 2>/dev/null)
if ((rc == 0)) && (($(qsub_calls) == 1)) && grep -q 'SIGUSR1 to be sent 3 s before the walltime of 6 s' "$tmp/wall.log" &&
    grep -q 'received SIGUSR1' "$tmp/wall.log" && grep -q 'stop signal received: checkpointed step' "$tmp/wall.log" &&
    [[ ,$vars, == *,QUINTET_RESUBMITS=1,* && ,$vars, == *,QUINTET_SIGNAL_MARGIN=3,* ]]; then
    first=$(grep -o 'checkpointed step [0-9]*' "$tmp/wall.log" | tr -dc 0-9)
    # The resubmitted job: exactly the variables qsub -v carries (values hold no commas).
    IFS=, read -r -a assign <<<"$vars"
    run_job wall2 "${assign[@]}" FAKE_WALLTIME=01:00:00
    n=$(steps_of "$tmp/wall" "$tmp/wall2.log")
    if ((rc == 0)) && [[ $n == 120 ]] && grep -q "resumed from .*step_$(printf %08d "$first").h5" "$tmp/wall2.log" &&
        grep -q 'resubmission 1)' "$tmp/wall2.log" && (($(qsub_calls) == 1)); then
        pass "3. walltime: SIGUSR1 3 s before it, checkpoint at step $first, resubmitted (QUINTET_RESUBMITS=1); the resubmission resumed under checkpoint.resume = none and finished 120 steps"
    else
        show "$tmp/wall2.log"
        fail "3. the resubmitted job: exit $rc, $n steps (want 0, 120, 'resumed from' step $first, no further qsub)"
    fi
else
    show "$tmp/wall.log"
    fail "3. walltime: exit $rc, $(qsub_calls) qsub call(s), -v '$vars' (want 0, 1 with QUINTET_RESUBMITS=1)"
fi
rm -f "$tmp"/qsub.*

# 4. Bad input is not resubmitted ----------------------------------------------------------------
t0=$SECONDS
run_job bad DECK="$tmp/bad.deck" OVERRIDES="--output.run_dir=$tmp/bad"
rc_bad=$rc
run_job nodeck DECK="$tmp/no_such.deck"
if ((rc_bad == 2 && rc == 2)) && (($(qsub_calls) == 0)) && grep -q "unknown key" "$tmp/bad.log" &&
    grep -q "is not readable" "$tmp/nodeck.log"; then
    pass "4. bad input (unknown deck key; unreadable deck): exit 2, not resubmitted"
else
    show "$tmp/bad.log"
    show "$tmp/nodeck.log"
    fail "4. bad input: exit $rc_bad and $rc, $(qsub_calls) qsub call(s) (want 2, 2, 0)"
fi

# 5. The resubmission bound ------------------------------------------------------------------
t0=$SECONDS
run_job bound DECK="$tmp/tiny.deck" OVERRIDES="--output.run_dir=$tmp/bound --train.collective_timeout_s=2" \
    QUINTET_INJECT_FAULT="rank=0,step=2,mode=hang" QUINTET_RESUBMITS=3 QUINTET_MAX_REQUEUES=3
if ((rc == 4)) && (($(qsub_calls) == 0)) && grep -q 'not resubmitting: 3 resubmissions (QUINTET_MAX_REQUEUES=3)' "$tmp/bound.log"; then
    pass "5. QUINTET_MAX_REQUEUES reached: not resubmitted, the job ends with the fault's status 4"
else
    show "$tmp/bound.log"
    fail "5. bound: exit $rc, $(qsub_calls) qsub call(s) (want 4, 0, 'not resubmitting')"
fi

echo "test_pbs_template: $failures failure(s), $((SECONDS - t_start)) s in all"
((failures == 0))
