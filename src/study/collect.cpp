#include "quintet/study/collect.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include "quintet/core/process.hpp"
#include "quintet/data/dataset.hpp"
#include "quintet/io/h5.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/perf/host_peak.hpp"
#include "quintet/perf/planner.hpp"
#include "quintet/study/laws_study.hpp"
#include "quintet/study/run_metrics.hpp"

namespace quintet {

namespace fs = std::filesystem;

namespace {

MachineModel machine_model() {
    MachineModel mm;
    mm.cores = host_cores();
    mm.matmul_gflops_per_core = host_sgemm_gflops_per_core();
    LinkFigures l;
    if (read_link_cache(&l)) mm.link_gbs = l.gbs, mm.link_latency_s = l.latency_s;
    mm.runtime_base_bytes = runtime_base_estimate();
    return mm;
}

}  // namespace

// DIR/study.h5 (written whole to a temporary name and renamed) and the plots.
Collected collect(const Study& st, const std::vector<Case>& cases, bool parity) {
    const MachineModel mm0 = machine_model();
    const std::string commit = source_commit();
    const std::string tmp = st.dir + "/study.h5.tmp", out = st.dir + "/study.h5";
    h5::silence_errors();
    h5::Handle f = h5::file(h5::check(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, h5::file_create_plist(), H5P_DEFAULT), "create " + tmp));
    h5::write_attr_string(f, "scaling", st.scaling);
    h5::write_attr_string(f, "study", st.text);
    h5::write_attr_string(f, "base_deck", st.base);
    if (st.laws.present) {
        h5::write_attr_string(f, "kind", "laws");
        h5::write_attr_string(f, "laws_params", st.laws.params);
        h5::write_attr_string(f, "laws_family", st.laws.family_text());
    }
    std::map<std::string, RunResult> results;
    int n_done = 0, n_missing = 0, n_failed = 0;
    std::string missing;
    for (const auto& c : cases) {
        if (!c.skip.empty()) continue;
        RunResult r = read_run(st, c);
        results[c.name] = r;
        if (c.is_reference) continue;
        if (r.exit_status < 0) {
            ++n_missing;
            missing += (missing.empty() ? "" : ",") + c.name;
            continue;
        }
        h5::Handle g = h5::group(h5::create_groups(f, "/runs/" + c.name));
        if (c.laws.budget > 0) {
            // What a law is fitted to (docs/formats.md): N counted three ways, D, C = 6 N D, the
            // exact model FLOPs (attention included), and the final losses.
            const LawsRun& L = c.laws;
            h5::write_attr_f64(g, "budget", L.budget);
            h5::write_attr_f64(g, "N", L.n);
            h5::write_attr_f64(g, "N_total", L.counts.total);
            h5::write_attr_f64(g, "N_non_embedding", L.counts.non_embedding);
            h5::write_attr_f64(g, "N_active", L.counts.active);
            h5::write_attr_f64(g, "D", L.tokens);
            h5::write_attr_f64(g, "C", 6.0 * L.n * L.tokens);
            h5::write_attr_i64(g, "steps", L.steps);
            h5::write_attr_string(g, "shape", L.shape);
            MachineModel mm = mm0;
            mm.threads_per_rank = c.threads;
            const PlanRow pr = plan_layout(c.deck, c.world, mm);
            h5::write_attr_f64(g, "flops", pr.valid ? pr.flops_per_step * double(L.steps) : std::nan(""));
            h5::write_attr_f64(g, "val_loss", r.eval_loss.empty() ? std::nan("") : r.eval_loss.back());
            h5::write_attr_f64(g, "train_loss_smoothed", smoothed_final(r.loss, st.laws.smooth));
        }
        if (r.exit_status != 0) {
            // A failed run: listed with its status, no series (a law leaves it out).
            h5::write_attr_i64(g, "world", c.world), h5::write_attr_i64(g, "exit_status", r.exit_status);
            h5::write_attr_string(g, "deck", deck_to_text(c.deck));
            h5::write_attr_string(g, "status", "failed");
            ++n_failed;
            continue;
        }
        const auto& p = c.deck.parallel;
        h5::write_attr_i64(g, "tp", p.tp), h5::write_attr_i64(g, "cp", p.cp), h5::write_attr_i64(g, "dp", p.dp);
        h5::write_attr_i64(g, "pp", p.pp), h5::write_attr_i64(g, "ep", p.ep), h5::write_attr_i64(g, "world", c.world);
        h5::write_attr_i64(g, "threads", c.threads), h5::write_attr_i64(g, "seed", c.deck.train.seed);
        h5::write_attr_i64(g, "microbatches", p.microbatches), h5::write_attr_i64(g, "exit_status", r.exit_status);
        h5::write_attr_string(g, "layout", "tp" + std::to_string(p.tp) + " cp" + std::to_string(p.cp) + " pp" +
                                               std::to_string(p.pp) + " dp" + std::to_string(p.dp) + " ep" + std::to_string(p.ep));
        h5::write_attr_string(g, "commit", commit);
        h5::write_attr_string(g, "deck", deck_to_text(c.deck));
        h5::write_attr_string(g, "status", r.done ? "done" : "failed");
        const double st_med = median(steady(r.step_time));
        h5::write_attr_f64(g, "tokens_per_s", median(steady(r.tps)));
        h5::write_attr_f64(g, "mfu", median(steady(r.mfu)));
        h5::write_attr_f64(g, "mfu_matmul", median(steady(r.mfu_matmul)));
        h5::write_attr_f64(g, "step_time_s", st_med);
        auto tmed = [&](std::initializer_list<const char*> ks) {
            double s = 0;
            for (const char* k : ks) {
                const double m = median(steady(r.timing[k]));
                if (std::isfinite(m)) s += m;
            }
            return s;
        };
        const double ttp = tmed({"tp_comm"}), tcp = tmed({"cp_exposed"}), tdp = tmed({"dp_reduce"});
        const double tep = tmed({"ep_dispatch", "ep_combine"}), tbub = tmed({"pipeline_wait"});
        h5::write_attr_f64(g, "time_tp_s", ttp), h5::write_attr_f64(g, "time_cp_s", tcp);
        h5::write_attr_f64(g, "time_dp_s", tdp), h5::write_attr_f64(g, "time_ep_s", tep);
        h5::write_attr_f64(g, "time_bubble_s", tbub);
        h5::write_attr_f64(g, "time_compute_s", std::isfinite(st_med) ? std::max(0.0, st_med - ttp - tcp - tdp - tep - tbub) : std::nan(""));
        MachineModel mm = mm0;
        mm.threads_per_rank = c.threads;
        mm.data_bytes = data_buffer_bytes(c.deck.data,
                                          int64_t(c.deck.parallel.microbatches) * c.deck.data.micro_batch_size,
                                          c.deck.model.vocab_size > 0 ? c.deck.model.vocab_size : 65536);
        const PlanRow pr = plan_layout(c.deck, c.world, mm);
        h5::write_attr_f64(g, "predicted_tokens_per_s", pr.valid ? pr.tokens_per_s : std::nan(""));
        h5::write_attr_f64(g, "predicted_step_time_s", pr.valid ? pr.step_time_s : std::nan(""));
        h5::write_attr_f64(g, "predicted_peak_rss_bytes", pr.valid ? pr.memory.total : std::nan(""));
        double rss = std::nan("");
        for (int q = 0; q < r.ranks; ++q) rss = std::isfinite(rss) ? std::max(rss, r.memory[size_t(q) * 6 + 5]) : r.memory[size_t(q) * 6 + 5];
        h5::write_attr_f64(g, "peak_rss_bytes", rss);
        h5::write_f64(g, "step", r.step), h5::write_f64(g, "loss", r.loss), h5::write_f64(g, "grad_norm", r.grad_norm);
        h5::write_f64(g, "tokens_per_s", r.tps);
        h5::write_f64(g, "memory_bytes", r.memory, {hsize_t(r.ranks), 6});
        {
            h5::Handle ds = h5::dataset(H5Dopen2(g, "memory_bytes", H5P_DEFAULT));
            h5::write_attr_string(ds, "columns", "params,grads,optimizer,activations,buffers,peak_rss");
        }
        if (r.done) ++n_done;
    }
    if (parity) {
        std::printf("\nparity against the single-rank run of the same global batch (max relative difference):\n");
        std::printf("  %-40s %12s %12s %12s\n", "run", "loss", "grad_norm", "expert_load");
        for (const auto& c : cases) {
            if (c.is_reference || !c.skip.empty() || c.reference.empty()) continue;
            const RunResult& a = results[c.name];
            const RunResult& b = results[c.reference];
            if (!a.done || !b.done) {
                std::printf("  %-40s (not finished)\n", c.name.c_str());
                continue;
            }
            const double l = max_rel(a.loss, b.loss), gn = max_rel(a.grad_norm, b.grad_norm);
            const double el = c.deck.model.moe.experts > 0 ? max_rel(a.expert_load, b.expert_load) : std::nan("");
            h5::Handle g = h5::group(h5::create_groups(f, "/parity/" + c.name));
            h5::write_attr_f64(g, "loss_rel", l), h5::write_attr_f64(g, "grad_norm_rel", gn);
            h5::write_attr_f64(g, "expert_load_rel", el);
            h5::write_attr_string(g, "reference", c.reference);
            std::printf("  %-40s %12.3g %12.3g %12s\n", c.name.c_str(), l, gn,
                        std::isfinite(el) ? std::to_string(el).c_str() : "-");
        }
    }
    if (st.laws.present) h5::write_attr_string(f, "laws_missing", missing);
    f.reset();
    fs::rename(tmp, out);
    std::string notes;
    if (n_failed) notes += std::to_string(n_failed) + " failed";
    if (n_missing) notes += (notes.empty() ? "" : ", ") + std::to_string(n_missing) + " not finished yet";
    std::printf("study: %d run(s) collected into %s%s\n", n_done, out.c_str(), notes.empty() ? "" : (" (" + notes + ")").c_str());
    std::fflush(stdout);
    return {n_done, n_missing};
}

}  // namespace quintet
