#!/usr/bin/env bash
# CPU throughput of quintet against PyTorch at the same shapes, and against the sgemm rate.
#
#   scripts/bench.sh            REPEATS rounds (default 3) per deck, medians reported
#   scripts/bench.sh --quick    one round, no tp/pp runs
#   Then scripts/bench_parallel.sh: medium at tp=1/2 (+sp) and pp=2/4 (1f1b, gpipe, interleaved)
#
# For each deck (inputs/bench_small.deck, inputs/bench_medium.deck) and each round:
#   1. quintet: OMP_NUM_THREADS=2 build/quintet train inputs/bench_<x>.deck (one process);
#      steady state = median of /train/tokens_per_s and /train/mfu in runs/bench_<x>/metrics.h5
#      over the steps after the first 2;
#   2. scripts/torch_reference.py bench at the same shapes, 2 threads, under three runtimes:
#      OMP_WAIT_POLICY=PASSIVE, the default policy, and BLIS preloaded as its BLAS
#      (LD_PRELOAD of Debian's libblis4-openmp, installed here when missing and apt-get can;
#      the run fails unless the BLAS mapped into the process really is BLIS) -- 2 untimed
#      steps, then as many timed steps as quintet's measured ones. quintet is compared with the
#      best of the three.
# Then `build/quintet peak` (prints sgemm_gflops=<float>) REPEATS times.
#
# With BASELINE=path/to/another/quintet, each round also runs that binary on the same deck right
# after this one (side by side, interleaved) and the table adds its tok/s and the ratio: the
# "no slower than the commit before" check of a refactor. BASELINE_GEMM=blas|avx2|avx512 runs the
# baseline with that QUINTET_CPU_GEMM (quintet itself takes QUINTET_CPU_GEMM from the
# environment): BASELINE=build/quintet BASELINE_GEMM=blas QUINTET_CPU_GEMM=avx2 compares the two
# GEMMs in one binary.
#
# BENCH_TORCH=0 leaves PyTorch out (a quintet-only A/B check with BASELINE; the torch columns read nan).
# Environment: REPEATS (3), BENCH_DECKS ("small medium"; "medium_mha", "mla", "moe" for inputs/bench_{medium_mha,mla,moe}.deck), BENCH_THREADS (2), BASELINE, BASELINE_GEMM,
#   BENCH_CORPUS (text for `quintet prepare`; default ../shared/data/tinyshakespeare.txt if
#   present, else data/quickstart.txt), PYTHON (an interpreter with torch, numpy and h5py).
# Output: the table on stdout; raw numbers, logs and the table under runs/bench_results/.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

REPEATS=${REPEATS:-3}
DECKS=${BENCH_DECKS:-"small medium"}
THREADS=${BENCH_THREADS:-2}
QUINTET=build-dev/quintet
OUT=runs/bench_results

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }
for arg in "$@"; do
    case "$arg" in
        --quick) REPEATS=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench.sh: unknown argument '$arg' (valid: --quick, --help)" >&2; exit 2 ;;
    esac
done

# ---- python with torch + h5py (Debian's python3-torch lives in /usr/bin/python3) -----------
PY=""
for p in "${PYTHON:-}" python3 /usr/bin/python3; do
    if [[ -n "$p" ]] && command -v "$p" >/dev/null 2>&1 \
        && "$p" -c 'import torch, h5py, numpy' >/dev/null 2>&1; then
        PY=$p; break
    fi
done
if [[ -z "$PY" ]]; then
    echo "bench.sh: no python3 with torch, numpy and h5py (set PYTHON=...; Debian: apt-get install python3-torch python3-h5py)" >&2
    exit 1
fi

# ---- BLIS for PyTorch's third runtime (Debian: libblis4-openmp) -------------------------------
BLIS=/usr/lib/x86_64-linux-gnu/blis-openmp/libblas.so.3
if [[ ! -f $BLIS ]] && command -v apt-get >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
    echo "bench.sh: installing libblis4-openmp (PyTorch's BLIS runtime)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libblis4-openmp >&2 || true
fi
if [[ ! -f $BLIS ]]; then
    echo "bench.sh: warning: $BLIS not found (apt-get install libblis4-openmp); PyTorch runs without BLIS" >&2
    BLIS=""
fi

# ---- quintet binary ---------------------------------------------------------------------------
if [[ ! -x "$QUINTET" ]]; then
    if [[ ! -f build/CMakeCache.txt ]]; then
        cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
    fi
    cmake --build build -j2
fi

# ---- data -------------------------------------------------------------------------------------
if [[ -n "${BENCH_CORPUS:-}" ]]; then
    CORPUS=$BENCH_CORPUS
elif [[ -f ../shared/data/tinyshakespeare.txt ]]; then
    CORPUS=../shared/data/tinyshakespeare.txt
else
    CORPUS=data/quickstart.txt
fi
mkdir -p data
if [[ ! -f data/bench_byte.h5 || ! -f data/bench_bpe8192.h5 ]]; then
    [[ -f "$CORPUS" ]] || { echo "bench.sh: corpus '$CORPUS' not found (set BENCH_CORPUS)" >&2; exit 1; }
fi
if [[ ! -f data/bench_byte.h5 ]]; then
    "$QUINTET" prepare --input "$CORPUS" --tokenizer byte --output data/bench_byte.h5 >&2
fi
if [[ ! -f data/bench_bpe8192.h5 ]]; then
    "$QUINTET" prepare --input "$CORPUS" --tokenizer bpe --vocab-size 8192 --output data/bench_bpe8192.h5 >&2
fi

mkdir -p "$OUT"
RAW=$OUT/raw.tsv
printf 'deck\tround\tmetric\tvalue\n' > "$RAW"
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$RAW"; }

# torch_reference.py bench arguments from a deck (+ its data file's vocab_size).
torch_args() {
    "$PY" - "$1" <<'EOF'
import sys, h5py
sys.path.insert(0, "scripts")
from torch_reference import parse_deck
kv = parse_deck(open(sys.argv[1]).read())
g = lambda k, d=None: kv.get(k, d)
with h5py.File(g("data.path"), "r") as f:
    vocab = int(f.attrs["vocab_size"])
dp = int(g("parallel.dp", "0")) or 1
gb = dp * int(g("parallel.microbatches", "1")) * int(g("data.micro_batch_size"))
steps = int(g("train.steps"))
print(f"--vocab {vocab} --d-model {g('model.d_model')} --n-layers {g('model.n_layers')} "
      f"--n-heads {g('model.n_heads')} --n-kv-heads {g('model.n_kv_heads', '0')} "
      f"--ffn-dim {g('model.ffn_dim', '0')} --seq-len {g('data.seq_len')} --micro-batch {gb} "
      f"--warmup-steps 2 --steps {max(steps - 2, 1)}"
      + (f" --attention mla --kv-lora-rank {g('model.kv_lora_rank')} --q-lora-rank {g('model.q_lora_rank', '0')}"
         f" --qk-nope-dim {g('model.qk_nope_dim')} --qk-rope-dim {g('model.qk_rope_dim')}"
         f" --v-head-dim {g('model.v_head_dim')}" if g("model.attention", "mha") == "mla" else "")
      + (f" --moe-experts {g('moe.experts')} --moe-top-k {g('moe.top_k', '2')} --moe-shared {g('moe.shared_experts', '0')}"
         f" --moe-ffn-dim {g('moe.ffn_dim', '0')} --moe-balance {g('moe.balance', 'aux_loss')}"
         if int(g("moe.experts", "0")) > 0 else ""))
EOF
}

# Steady-state medians of quintet's metrics.h5: "<tokens_per_s> <mfu>".
quintet_metrics() {
    "$PY" - "$1" <<'EOF'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    tps = np.asarray(f["/train/tokens_per_s"][()], dtype=float).ravel()
    mfu = np.asarray(f["/train/mfu"][()], dtype=float).ravel()
skip = 2 if len(tps) > 2 else 0
print(f"{np.median(tps[skip:]):.6g} {np.median(mfu[skip:]):.6g}")
EOF
}

# key=value field of a torch_reference.py bench line.
field() { tr ' ' '\n' <<< "$1" | sed -n "s/^$2=//p"; }

for deck in $DECKS; do
    deckfile=inputs/bench_$deck.deck
    [[ -f "$deckfile" ]] || { echo "bench.sh: $deckfile not found" >&2; exit 1; }
    targs=()
    if [[ ${BENCH_TORCH:-1} != 0 ]]; then
        targs_line=$(torch_args "$deckfile")
        read -r -a targs <<< "$targs_line"
    fi
    : > "$OUT/torch_${deck}.log"
    for ((r = 1; r <= REPEATS; r++)); do
        echo "== $deck round $r/$REPEATS: quintet" >&2
        rm -rf "runs/bench_$deck"
        env -u OMP_WAIT_POLICY OMP_NUM_THREADS="$THREADS" "$QUINTET" train "$deckfile" \
            --output.run_dir="runs/bench_$deck" --checkpoint.resume=none --checkpoint.every=0 \
            2>&1 | tee "$OUT/quintet_${deck}_r$r.log" >&2
        q_line=$(quintet_metrics "runs/bench_$deck/metrics.h5")
        read -r q_tps q_mfu <<< "$q_line"
        record "$deck" "$r" quintet_tok_s "$q_tps"
        record "$deck" "$r" quintet_mfu "$q_mfu"
        echo "   quintet tokens/s=$q_tps mfu=$q_mfu" >&2
        if [[ -n "${BASELINE:-}" ]]; then
            echo "== $deck round $r/$REPEATS: baseline $BASELINE" >&2
            rm -rf "runs/bench_${deck}_baseline"
            env -u OMP_WAIT_POLICY OMP_NUM_THREADS="$THREADS" \
                ${BASELINE_GEMM:+QUINTET_CPU_GEMM="$BASELINE_GEMM"} "$BASELINE" train "$deckfile" \
                --output.run_dir="runs/bench_${deck}_baseline" --checkpoint.resume=none \
                --checkpoint.every=0 > "$OUT/baseline_${deck}_r$r.log" 2>&1
            b_line=$(quintet_metrics "runs/bench_${deck}_baseline/metrics.h5")
            read -r b_tps b_mfu <<< "$b_line"
            record "$deck" "$r" baseline_tok_s "$b_tps"
            echo "   baseline tokens/s=$b_tps" >&2
        fi

        for policy in PASSIVE default blis; do
            [[ ${BENCH_TORCH:-1} != 0 ]] || continue
            echo "== $deck round $r/$REPEATS: torch ($policy)" >&2
            if [[ $policy == default ]]; then
                line=$(env -u OMP_WAIT_POLICY OMP_NUM_THREADS="$THREADS" \
                    "$PY" scripts/torch_reference.py bench "${targs[@]}" --threads "$THREADS" | tail -n 1)
            elif [[ $policy == blis ]]; then
                [[ -n "$BLIS" ]] || continue
                line=$(env -u OMP_WAIT_POLICY LD_PRELOAD="$BLIS" OMP_NUM_THREADS="$THREADS" \
                    "$PY" scripts/torch_reference.py bench "${targs[@]}" --threads "$THREADS" | tail -n 1)
                if [[ $(field "$line" blas) != blis ]]; then
                    echo "bench.sh: LD_PRELOAD=$BLIS did not take effect (the process maps '$(field "$line" blas)')" >&2
                    exit 1
                fi
            else
                line=$(env OMP_WAIT_POLICY=$policy OMP_NUM_THREADS="$THREADS" \
                    "$PY" scripts/torch_reference.py bench "${targs[@]}" --threads "$THREADS" | tail -n 1)
            fi
            echo "   $line" >&2
            echo "$line" >> "$OUT/torch_${deck}.log"
            record "$deck" "$r" "torch_${policy}_tok_s" "$(field "$line" torch_tokens_per_s)"
            record "$deck" "$r" torch_runtime "$(field "$line" runtime)"
            record "$deck" "$r" torch_version "$(field "$line" torch_version)"
            record "$deck" "$r" flops_per_token "$(field "$line" flops_per_token)"
        done
    done
done

for ((r = 1; r <= REPEATS; r++)); do
    echo "== sgemm peak round $r/$REPEATS" >&2
    if peak=$(OMP_NUM_THREADS="$THREADS" "$QUINTET" peak 2>&1); then
        g=$(grep -o 'sgemm_gflops=[0-9.eE+-]*' <<< "$peak" | tail -n 1 | cut -d= -f2 || true)
        fma=$(grep -o 'fma_gflops_per_core=[0-9.eE+-]*' <<< "$peak" | tail -n 1 | cut -d= -f2 || true)
        echo "   sgemm_gflops=${g:-?} fma_gflops_per_core=${fma:-?}" >&2
        if [[ -n "$g" ]]; then record all "$r" sgemm_gflops "$g"; fi
        if [[ -n "$fma" ]]; then record all "$r" fma_gflops_per_core "$fma"; fi
    else
        echo "bench.sh: '$QUINTET peak' failed; sgemm columns left empty" >&2
        echo "$peak" | tail -n 5 >&2
    fi
done

lscpu > "$OUT/lscpu.txt" 2>/dev/null || true
HOST="$(sed -n 's/^Model name: *//p' "$OUT/lscpu.txt" | head -n 1), $(nproc) cores, $(grep -qw avx512f /proc/cpuinfo && echo AVX-512 || (grep -qw avx2 /proc/cpuinfo && echo AVX2 || echo no-AVX2))"
"$PY" - "$RAW" "$REPEATS" "$THREADS" "$HOST" <<'EOF' | tee "$OUT/table.txt"
import sys, csv, statistics
from collections import defaultdict
raw, repeats, threads, host = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
vals = defaultdict(list)
decks = []
with open(raw) as f:
    for row in csv.DictReader(f, delimiter="\t"):
        vals[(row["deck"], row["metric"])].append(row["value"])
        if row["deck"] != "all" and row["deck"] not in decks:
            decks.append(row["deck"])

def med(deck, metric):
    xs = [float(v) for v in vals.get((deck, metric), []) if v not in ("", "nan")]
    return statistics.median(xs) if xs else float("nan")

def word(deck, metric):
    xs = vals.get((deck, metric), [])
    return xs[0] if xs else "?"

sgemm = med("all", "sgemm_gflops")
# The FMA peak of the cores the run uses (quintet peak: measured once per host, cached).
fma = med("all", "fma_gflops_per_core") * min(int(threads), __import__("os").cpu_count() or 1)
hdr = ["deck", "quintet tok/s", "torch tok/s (best)", "torch PASSIVE", "torch default", "torch BLIS",
       "quintet/torch", "quintet MFU", "model GFLOP/s", "sgemm GFLOP/s", "of sgemm"]
baseline = any(m == "baseline_tok_s" for (_, m) in vals)
if baseline:
    hdr += ["baseline tok/s", "quintet/baseline"]
rows = []
for d in decks:
    q = med(d, "quintet_tok_s")
    tp, td, tb = med(d, "torch_PASSIVE_tok_s"), med(d, "torch_default_tok_s"), med(d, "torch_blis_tok_s")
    best, pol = max([(x, n) for x, n in ((tp, "PASSIVE"), (td, "default"), (tb, "BLIS")) if x == x] or [(float("nan"), "?")])
    fpt = med(d, "flops_per_token")
    gf = q * fpt / 1e9
    rows.append([d, f"{q:.1f}", f"{best:.1f} ({word(d, 'torch_runtime')},{pol})", f"{tp:.1f}",
                 f"{td:.1f}", f"{tb:.1f}", f"{q / best:.3f}", f"{med(d, 'quintet_mfu'):.4g}", f"{gf:.2f}",
                 f"{sgemm:.2f}", f"{gf / sgemm:.3f}"])
    if baseline:
        b = med(d, "baseline_tok_s")
        rows[-1] += [f"{b:.1f}", f"{q / b:.3f}"]
w = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(hdr)]
print(f"# host: {host} (lscpu in runs/bench_results/lscpu.txt); FMA peak {fma:.1f} GFLOP/s "
      f"({threads} cores), sgemm {sgemm:.1f} GFLOP/s = {sgemm / fma:.2f} of it; quintet MFU is against the FMA peak")
print(f"# medians over {repeats} round(s); {threads} threads; torch "
      f"{word(decks[0], 'torch_version') if decks else '?'}; model GFLOP/s = quintet tok/s x "
      f"(6P + 6 L T NH (dqk+dv)) per token")
print("  ".join(h.ljust(w[i]) for i, h in enumerate(hdr)))
for r in rows:
    print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))
EOF

# Tensor- and pipeline-parallel figures of the medium deck (skipped with --quick or BENCH_PARALLEL=0).
if [[ $REPEATS -gt 1 && ${BENCH_PARALLEL:-1} != 0 && " $DECKS " == *" medium "* ]]; then
    bash scripts/bench_parallel.sh
fi
