#!/usr/bin/env bash
# Fitting a scaling law (docs/benchmarks.md and docs/scaling-laws.md, "How long a fit takes"):
# `quintet laws` on 250 points drawn from Hoffmann et al.'s law with 1% noise (10 budgets x 25
# shapes), L-BFGS from the 4500-point grid of starts and 1000 bootstrap resamples, on one core
# (taskset; the fitter is single-threaded). Prints each repeat's wall seconds and the median.
# Usage: bash scripts/bench_laws.sh [REPEATS]   (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
Q=${QUINTET:-$PWD/build/quintet}
REPEATS=${1:-5}
W=$(mktemp -d /tmp/quintet-bench-laws.XXXXXX)
trap 'rm -rf "$W"' EXIT
lscpu | head -20
python3 - "$W/points.csv" <<'PY'
import math, random, sys
E, A, B, al, be = 1.69, 406.4, 410.7, 0.34, 0.28
G = (al * A / (be * B)) ** (1 / (al + be))
random.seed(1)
with open(sys.argv[1], "w") as f:
    f.write("N,D,loss,budget\n")
    for i in range(10):
        C = 1e18 * 10 ** (i / 3)
        nopt = G * (C / 6) ** (be / (al + be))
        for k in range(25):
            N = nopt * math.exp(0.15 * (k - 12))
            D = C / (6 * N)
            loss = (E + A / N ** al + B / D ** be) * math.exp(random.gauss(0, 0.01))
            f.write(f"{N!r},{D!r},{loss!r},{C!r}\n")
PY
echo "points: $(($(wc -l < "$W/points.csv") - 1))"
# Wall seconds and CPU seconds (user + system) of each repeat: on a shared machine the CPU time
# is the figure that does not depend on what else runs; the wall time equals it on an idle core.
: > "$W/times"
for r in $(seq "$REPEATS"); do
    OMP_NUM_THREADS=1 /usr/bin/time -f "%e %U %S" -o "$W/t" taskset -c 0 "$Q" laws "$W/points.csv" --bootstrap 1000 --json \
        > "$W/law.json" 2>/dev/null
    read -r wall user sys < "$W/t"
    cpu=$(echo "$user + $sys" | bc)
    echo "$wall $cpu" >> "$W/times"
    echo "repeat $r: wall ${wall} s, cpu ${cpu} s"
done
sort -n -k2 "$W/times" | awk '{c[NR]=$2} END {print "median cpu: " c[int((NR+1)/2)] " s"}'
sort -n -k1 "$W/times" | awk '{w[NR]=$1} END {print "median wall: " w[int((NR+1)/2)] " s"}'
# Where the time goes: the grid alone (no bootstrap).
OMP_NUM_THREADS=1 /usr/bin/time -f "%U %S" -o "$W/t0" taskset -c 0 "$Q" laws "$W/points.csv" --bootstrap 0 > /dev/null 2>&1
read -r user sys < "$W/t0"
echo "the 4500 starts alone (--bootstrap 0): cpu $(echo "$user + $sys" | bc) s"
python3 - "$W/law.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
for k in ("E", "A", "B", "alpha", "beta", "a", "b"):
    v = j[k]
    print(f"{k:6s} {v['value']:.4g}  [{v['ci_low']:.4g}, {v['ci_high']:.4g}]")
print("starts", j["fit"]["starts"], "bootstrap", j["fit"]["bootstrap"], "converged", j["fit"]["replicates"])
PY
