#!/usr/bin/env python3
"""Smoke test of scripts/plot_metrics.py, plot_study.py, plot_mup_lr.py and plot_muon.py (exit status 0 = pass).

Builds, in a temporary directory, synthetic files of the layouts the C++ writes:
  * two run dirs with metrics.h5 (/train/*, /eval/*, /train/mfu_matmul, /moe/expert_load
    [step, layer, expert], /ranks/compute_s [step, rank]) sharing a basename, so the labels must be disambiguated;
  * a study dir with study.h5: three runs (two of equal world size, different layouts), one
    failed run, and /parity groups (one with an exact 0 and a NaN);
  * a study of a single run with scaling "none" (no efficiency.png, no parity.png).
Runs both scripts with /usr/bin/python3 and checks that every PNG exists, starts with the PNG
magic bytes and is more than a few KB, that `wrote PATH` is printed, that a missing or corrupt
metrics.h5 gives exit status 2 with a message naming the path, that a failed study run is listed
on stderr, and that --help exits 0.

    /usr/bin/python3 tests/tools/test_plots.py [--keep DIR]   (--keep: build in DIR, keep it)
"""
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLOT_METRICS = os.path.join(ROOT, "scripts", "plot_metrics.py")
PLOT_STUDY = os.path.join(ROOT, "scripts", "plot_study.py")
PLOT_MUP_LR = os.path.join(ROOT, "scripts", "plot_mup_lr.py")
PLOT_MUON = os.path.join(ROOT, "scripts", "plot_muon.py")
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MIN_PNG_BYTES = 5000

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(*args):
    p = subprocess.run([PYTHON, *args], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def check_png(path):
    ok = os.path.isfile(path)
    if ok:
        with open(path, "rb") as f:
            head = f.read(8)
        ok = head == PNG_MAGIC and os.path.getsize(path) > MIN_PNG_BYTES
    check(ok, f"{os.path.basename(path)} is a PNG of more than {MIN_PNG_BYTES} bytes")


# --- synthetic files -------------------------------------------------------------------------

def write_metrics(run_dir, steps=40, layers=3, experts=4, seed=0):
    rng = np.random.default_rng(seed)
    os.makedirs(run_dir, exist_ok=True)
    s = np.arange(1, steps + 1)
    with h5py.File(os.path.join(run_dir, "metrics.h5"), "w") as f:
        f.attrs["deck"] = "model:\n  d_model: 64\n"
        f["/train/step"] = s.astype(np.int64)
        f["/train/loss"] = 5.0 * np.exp(-s / 20.0) + 0.05 * rng.random(steps) + 1.0
        f["/train/lr"] = np.minimum(s / 5.0, 1.0) * 1e-3
        f["/train/grad_norm"] = 2.0 / np.sqrt(s) + 0.1 * rng.random(steps)
        f["/train/tokens_per_s"] = 4000 + 200 * rng.random(steps)
        f["/train/mfu"] = 0.3 + 0.02 * rng.random(steps)
        f["/train/mfu_matmul"] = 0.6 + 0.02 * rng.random(steps)
        f["/eval/step"] = s[4::5].astype(np.int64)
        f["/eval/loss"] = 5.0 * np.exp(-s[4::5] / 20.0) + 1.1
        load = rng.integers(0, 500, size=(steps, layers, experts)).astype(np.float64)
        load[3] = np.nan  # a row of a run resumed on another layout
        load[:, 1, :] = 0.0  # layer 1 is dense (moe.layers leaves it out)
        f["/moe/expert_load"] = load
        compute = 0.1 + 0.01 * rng.random((steps, 4))  # /ranks/compute_s [step, rank]: rank 2 slow
        compute[:, 2] *= 1.5
        f["/ranks/compute_s"] = compute
        # Started at step 0 on dp=1, resumed at step 20 on dp=2 and at step 30 on the same layout.
        f["/runs/start_step"] = np.array([0.0, 20.0, 30.0])
        for axis, v in dict(tp=[1, 1, 1], cp=[1, 1, 1], dp=[1, 2, 2], pp=[1, 1, 1], ep=[1, 1, 1]).items():
            f[f"/runs/{axis}"] = np.array(v, dtype=np.float64)


def write_run(g, name, world, layout, status="done", seed=0):
    rng = np.random.default_rng(seed)
    tp, cp, pp, dp, ep = (int(tok[2:]) for tok in layout.split())
    for key, v in dict(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, world=world, threads=2,
                       seed=7, exit_status=0 if status == "done" else 1).items():
        g.attrs[key] = np.int64(v)
    g.attrs.update(layout=layout, commit="abc123", deck="model: {}\n", status=status)
    step_time = 1.0 / world ** 0.8
    times = dict(time_tp_s=0.05 * (tp > 1), time_cp_s=0.03 * (cp > 1), time_dp_s=0.04 * (dp > 1),
                 time_ep_s=0.02 * (ep > 1), time_bubble_s=0.06 * (pp > 1))
    times = {k: v * step_time for k, v in times.items()}
    times["time_compute_s"] = step_time - sum(times.values())
    tps = 8192.0 / step_time
    scalars = dict(tokens_per_s=tps, mfu=0.3 / world ** 0.2, mfu_matmul=0.6 / world ** 0.2,
                   step_time_s=step_time, predicted_tokens_per_s=tps * 1.1,
                   predicted_step_time_s=step_time / 1.1,
                   predicted_peak_rss_bytes=(2.0e9 / world) if world > 1 else np.nan,
                   peak_rss_bytes=2.2e9 / world, **times)
    for key, v in scalars.items():
        g.attrs[key] = np.float64(v)
    n = 20
    g["step"] = np.arange(1, n + 1, dtype=np.float64)
    g["loss"] = 5.0 * np.exp(-np.arange(n) / 10.0) + 1.0 + 0.01 * rng.random(n)
    g["grad_norm"] = 1.0 + rng.random(n)
    g["tokens_per_s"] = tps * (1 + 0.01 * rng.random(n))
    g["memory_bytes"] = np.full((world, 6), 1.0e8)
    g["memory_bytes"].attrs["columns"] = "params,grads,optimizer,activations,buffers,peak_rss"


def write_study(study_dir):
    os.makedirs(study_dir, exist_ok=True)
    with h5py.File(os.path.join(study_dir, "study.h5"), "w") as f:
        f.attrs.update(scaling="strong", study="runs: ...\n", base_deck="inputs/small.yaml")
        write_run(f.create_group("runs/w1"), "w1", 1, "tp1 cp1 pp1 dp1 ep1", seed=1)
        write_run(f.create_group("runs/w2_tp"), "w2_tp", 2, "tp2 cp1 pp1 dp1 ep1", seed=2)
        write_run(f.create_group("runs/w2_dp"), "w2_dp", 2, "tp1 cp1 pp1 dp2 ep1", seed=3)
        write_run(f.create_group("runs/w4_bad"), "w4_bad", 4, "tp1 cp1 pp2 dp2 ep1",
                  status="failed", seed=4)
        for name, rels in dict(w2_tp=(1e-7, 3e-6, np.nan), w2_dp=(0.0, 2e-7, 5e-6)).items():
            g = f.create_group(f"parity/{name}")
            for key, v in zip(("loss_rel", "grad_norm_rel", "expert_load_rel"), rels):
                g.attrs[key] = np.float64(v)
            g.attrs["reference"] = "w1"


# --- the checks ------------------------------------------------------------------------------

def test_plot_metrics(tmp):
    a, b = os.path.join(tmp, "x", "run"), os.path.join(tmp, "y", "run")
    write_metrics(a, seed=1)
    write_metrics(b, steps=25, seed=2)
    rc, out, err = run(PLOT_METRICS, a)
    default = os.path.join(a, "metrics.png")
    check(rc == 0, f"plot_metrics one run exits 0 (rc={rc}, stderr={err.strip()!r})")
    check(out.strip().splitlines()[-1:] == [f"wrote {default}"], "plot_metrics prints `wrote PATH`")
    check_png(default)
    # What the figure marks: the resumes (and the layout moved to), the dense layer of the heatmap.
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import plot_metrics
    run_data = plot_metrics.read_run(a)
    check(plot_metrics.resumes(run_data) == [(20.0, "resumed on dp=2"), (30.0, "resumed")],
          f"resumes marked at 20 (on dp=2) and 30 ({plot_metrics.resumes(run_data)})")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    plot_metrics.moe_heatmap_panel(fig, ax, "a", run_data)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    check(labels == ["0", "1 (dense)", "2"], f"the heatmap labels the dense layer ({labels})")
    plt.close(fig)
    fig, ax = plt.subplots()
    plot_metrics.rank_compute_panel(ax, "a", run_data)
    legend = ax.get_legend().get_title().get_text()
    check(len(ax.get_lines()) == 4 and legend == "slowest: rank 2",
          f"the per-rank compute panel draws 4 ranks and names rank 2 the slowest ({legend})")
    plt.close(fig)
    two = os.path.join(tmp, "two.png")
    rc, out, err = run(PLOT_METRICS, a, b, "-o", two)
    check(rc == 0, f"plot_metrics two runs exits 0 (rc={rc}, stderr={err.strip()!r})")
    check_png(two)

    missing = os.path.join(tmp, "nothing_here")
    rc, out, err = run(PLOT_METRICS, missing)
    check(rc == 2 and os.path.join(missing, "metrics.h5") in err,
          f"missing metrics.h5: exit 2 naming the path (rc={rc}, stderr={err.strip()!r})")
    corrupt = os.path.join(tmp, "corrupt")
    os.makedirs(corrupt)
    with open(os.path.join(corrupt, "metrics.h5"), "wb") as f:
        f.write(b"not an hdf5 file")
    rc, out, err = run(PLOT_METRICS, corrupt)
    check(rc == 2 and os.path.join(corrupt, "metrics.h5") in err,
          f"corrupt metrics.h5: exit 2 naming the path (rc={rc}, stderr={err.strip()!r})")
    rc, out, _ = run(PLOT_METRICS, "--help")
    check(rc == 0 and "usage" in out, "plot_metrics --help exits 0")


def test_plot_study(tmp):
    study = os.path.join(tmp, "study")
    write_study(study)
    rc, out, err = run(PLOT_STUDY, study)
    check(rc == 0, f"plot_study exits 0 (rc={rc}, stderr={err.strip()!r})")
    check("w4_bad" in err, "plot_study lists the failed run on stderr")
    names = ["throughput", "efficiency", "mfu", "comm_fraction", "predicted", "loss", "parity"]
    for name in names:
        path = os.path.join(study, "plots", name + ".png")
        check(f"wrote {path}" in out.splitlines(), f"plot_study prints `wrote {name}.png`")
        check_png(path)
    single = os.path.join(tmp, "single")
    os.makedirs(single)
    with h5py.File(os.path.join(single, "study.h5"), "w") as f:
        f.attrs.update(scaling="none", study="", base_deck="d.yaml")
        write_run(f.create_group("runs/only"), "only", 1, "tp1 cp1 pp1 dp1 ep1")
    rc, out, err = run(PLOT_STUDY, single)
    check(rc == 0, f"plot_study with one run, scaling none, exits 0 (rc={rc}, stderr={err.strip()!r})")
    for name in names:
        path = os.path.join(single, "plots", name + ".png")
        if name in ("efficiency", "parity"):
            check(not os.path.exists(path), f"one-run study: no {name}.png")
        else:
            check_png(path)
    rc, out, err = run(PLOT_STUDY, os.path.join(tmp, "no_study"))
    check(rc == 2 and "study.h5" in err, f"missing study.h5: exit 2 (rc={rc})")
    rc, out, _ = run(PLOT_STUDY, "--help")
    check(rc == 0 and "usage" in out, "plot_study --help exits 0")


def test_plot_mup_lr(tmp):
    """A learning-rate sweep over two widths and two schemes with a known optimum per curve: a
    parabola in log10(lr) whose minimum sits at 10**c, plus one diverged (NaN) run and one
    failed run. The script must find each optimum inside its bracket and write CSV/JSON/PNG."""
    import json
    study = os.path.join(tmp, "mup_study")
    os.makedirs(study, exist_ok=True)
    lrs = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1]
    # scaled at width 256: the optimum below the grid, so the best point is its edge
    centre = {("scaled", 64): -2.3, ("scaled", 256): -3.3, ("mup", 64): -2.3, ("mup", 256): -2.2}
    with h5py.File(os.path.join(study, "study.h5"), "w") as f:
        f.attrs.update(scaling="none", study="", base_deck="mup_sweep.deck")
        for (scheme, d), c in centre.items():
            for lr in lrs:
                name = f"{scheme}_{d}_{lr:g}"
                g = f.create_group(f"/runs/{name}")
                g.attrs.update(status="done", deck=f"[model]\nd_model = {d}\n[train]\nlr = {lr:g}\n"
                                                   f"[init]\nscheme = {scheme}  # comment\n")
                loss = 2.0 + 0.3 * (np.log10(lr) - c) ** 2
                if scheme == "mup" and lr == 1e-1:
                    loss = float("nan")
                os.makedirs(os.path.join(study, "runs", name), exist_ok=True)
                with h5py.File(os.path.join(study, "runs", name, "metrics.h5"), "w") as m:
                    m["/eval/step"] = np.array([10, 20], dtype=np.int64)
                    m["/eval/loss"] = np.array([3.0, loss])
        g = f.create_group("/runs/failed_one")
        g.attrs.update(status="failed", deck="")
    prefix = os.path.join(tmp, "sweep")
    rc, out, err = run(PLOT_MUP_LR, study, prefix)
    check(rc == 0, f"plot_mup_lr exits 0 (rc={rc}, stderr={err.strip()!r})")
    check("failed_one" in err, "plot_mup_lr lists the failed run on stderr")
    check_png(prefix + ".png")
    with open(prefix + ".csv") as f:
        rows = f.read().splitlines()
    check(len(rows) == 1 + 20 and "inf" in "".join(rows), "CSV: a row per run, the diverged one as inf")
    with open(prefix + ".json") as f:
        summary = json.load(f)
    edge = summary["scaled"]["256"]
    check(edge["at_grid_edge"] and edge["fitted_lr"] is None and edge["grid_best_lr"] == 1e-3,
          "an optimum beyond the grid is reported at the edge, not fitted")
    del centre[("scaled", 256)]
    for (scheme, d), c in centre.items():
        o = summary[scheme][str(d)]
        fitted = o["fitted_lr"]
        check(fitted is not None and abs(np.log10(fitted) - c) < 1e-6,
              f"{scheme} width {d}: the parabola's optimum is 10**{c} (got {fitted})")
        lo, hi = o["bracket"]
        check(lo < 10 ** c < hi, f"{scheme} width {d}: the optimum lies in its bracket {lo}..{hi}")
    rc, _, err = run(PLOT_MUP_LR, os.path.join(tmp, "no_study"), prefix)
    check(rc == 2 and "study.h5" in err, f"plot_mup_lr on a missing study: exit 2 (rc={rc})")


def test_plot_muon(tmp):
    """A sweep of known optima: adamw best at 2e-3, muon at 8e-3; the summary and the CPU line."""
    import json
    d = os.path.join(tmp, "muon")
    os.makedirs(d, exist_ok=True)
    sweep, curves, lscpu = (os.path.join(d, n) for n in ("sweep.csv", "curves.csv", "lscpu.txt"))
    with open(sweep, "w") as fs, open(curves, "w") as fc:
        fs.write("optimizer,lr,step,eval_loss\n")
        fc.write("optimizer,lr,step,train_loss\n")
        for opt, best in (("adamw", 2e-3), ("muon", 8e-3)):
            for lr in (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2):
                off = abs(np.log2(lr / best)) * 0.1
                for step in range(1, 101):
                    fc.write(f"{opt},{lr},{float(step)},{2.0 + 3.0 / step + off}\n")
                    if step % 25 == 0:
                        fs.write(f"{opt},{lr},{float(step)},{2.0 + 3.0 / step + off + 0.01}\n")
    with open(lscpu, "w") as f:
        f.write("Architecture:  x86_64\nModel name:    Test CPU 9000\n")
    png, summary = os.path.join(d, "m.png"), os.path.join(d, "m.json")
    rc, out, err = run(PLOT_MUON, sweep, curves, "--lscpu", lscpu, "-o", png, "--summary", summary)
    check(rc == 0, f"plot_muon exits 0 (rc={rc}, stderr={err.strip()!r})")
    check(out.strip().splitlines()[-1:] == [f"wrote {png}"], "plot_muon prints `wrote PATH`")
    check_png(png)
    with open(summary) as f:
        js = json.load(f)
    check(js["best_lr"] == {"adamw": 2e-3, "muon": 8e-3}, f"plot_muon finds each optimizer's best rate ({js['best_lr']})")
    check(js["cpu"] == "Test CPU 9000", f"plot_muon names the CPU from lscpu ({js['cpu']!r})")
    check(abs(js["final_eval_loss"]["muon"]["0.008"] - 2.04) < 1e-9, "plot_muon's summary holds the final losses")
    empty = os.path.join(d, "empty.csv")
    with open(empty, "w") as f:
        f.write("optimizer,lr,step,eval_loss\n")
    rc, _, err = run(PLOT_MUON, empty, curves, "-o", os.path.join(d, "x.png"))
    check(rc == 2 and "no runs" in err, f"plot_muon on a sweep without runs exits 2 naming it (rc={rc})")


def main():
    keep = sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "--keep" else None
    if keep:
        os.makedirs(keep, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=keep)
        test_plot_metrics(tmp)
        test_plot_study(tmp)
        test_plot_mup_lr(tmp)
        test_plot_muon(tmp)
        print(f"kept {tmp}")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            test_plot_metrics(tmp)
            test_plot_study(tmp)
            test_plot_mup_lr(tmp)
            test_plot_muon(tmp)
    print(f"{len(failures)} failure(s)" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
