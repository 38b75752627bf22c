// metrics.h5: extendible 1-D datasets, one row per step, flushed every step so a killed job
// keeps its history. Written by one rank (the grid's rank 0) with serial HDF5.
// /train/{step, loss, ce_loss, aux_loss, lr, grad_norm, tokens_per_s, mfu, step_time_s}
// /eval/{step, loss}    /timing/<phase> (seconds per step, aligned with /train/step)
// /pipeline/stage<s>_{idle_fraction, activation_mib} (aligned with /train/step)
// /memory/<category>_bytes [step, rank] (Trainer::memory_account, train/trainer.cpp)
// /moe/expert_load [step, layer, expert], /moe/{imbalance, dead_experts, dropped_tokens, aux}
// [step, layer, 1], /moe/ep_tokens [step, layer, ep] (aligned with /train/step)
// /data/source_samples [step, source] (aligned with /train/step), /eval/<source>/loss (with /eval/step)
// /checkpoint/{step, blocked_s, write_s} (one row per checkpoint written, its own step column)
#pragma once
#include <map>
#include <string>
#include <vector>

#include "quintet/io/h5.hpp"

namespace quintet {

class MetricsFile {
public:
    // Opens run_dir/metrics.h5; when resuming from `first_step` > 0 an existing file is kept and
    // rows after step first_step are dropped (they will be recomputed). Never lost silently: an
    // unreadable file is moved aside and the history rebuilt from `snapshot` (the copy kept
    // beside the resumed checkpoint); a fresh run (first_step 0) moves an existing file aside.
    // What happened is in `warnings`.
    MetricsFile(const std::string& run_dir, const std::string& deck_text, long first_step,
                const std::string& snapshot = "");
    std::vector<std::string> warnings;
    // A consistent copy of the file (flushed first) at `to`, written as to.tmp, fsync'd, renamed.
    // durable = false: only to.tmp is written (not fsync'd): the caller makes it durable and
    // renames it (the checkpoint writer does, off the training thread). Returns the path written.
    std::string snapshot_to(const std::string& to, bool durable = true);
    ~MetricsFile();
    // Appends one row to each named dataset of `group` (creating it on first use).
    void append(const std::string& group, const std::vector<std::pair<std::string, double>>& row);
    // Appends one [rows, cols] slice to the 3-D dataset `path` [step, rows, cols]
    // (e.g. /moe/expert_load [step, layer, expert]).
    void append_matrix(const std::string& path, const std::vector<double>& v, int rows, int cols);
    // Appends one row of v.size() values to the 2-D dataset `path` [step, n] (/memory/* [step, rank]).
    void append_vector(const std::string& path, const std::vector<double>& v);
    // Sets string attribute `name` of the dataset or group `path` (which must exist).
    void set_attr(const std::string& path, const std::string& name, const std::string& value);
    void flush();
    // Every value of the dataset `path`, row-major (empty when it does not exist): the history a
    // resumed run rebuilds its counters from (/moe/expert_load for the dead-expert count).
    std::vector<double> read_all(const std::string& path);

private:
    void append_value(const std::string& path, double v);
    void append_slab(const std::string& path, const std::vector<double>& v, const std::vector<hsize_t>& inner);
    // The dataset [step, inner...] at `path`, opened or created (extendible in its first dim).
    hid_t extendible(const std::string& path, const std::vector<hsize_t>& inner, hsize_t chunk_rows);
    h5::Handle file_;
    std::map<std::string, h5::Handle> open_;
};

}  // namespace quintet
