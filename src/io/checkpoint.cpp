#include "quintet/io/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <type_traits>
#include <vector>

#include "checkpoint_checksum.hpp"
#include "quintet/core/error.hpp"
#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/io/h5.hpp"
#include "quintet/model/param_groups.hpp"
#include "quintet/io/tokenizer_store.hpp"
#include "quintet/tokenizer/tokenizer_spec.hpp"

namespace fs = std::filesystem;

namespace quintet {

namespace {

std::string step_name(int64_t step) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "step_%08lld.h5", (long long)step);
    return buf;
}

std::vector<hsize_t> logical_shape(int rows, int cols, int ndim) {
    if (ndim == 1) return {hsize_t(rows)};
    return {hsize_t(rows), hsize_t(cols)};
}

// Selects, in `fspace` of the logical tensor, the local elements [a, b) of this rank's shard
// (row-major over its [lrows, lcols] block at logical offset (row0, col0)): up to three
// hyperslabs (the tail of a row, whole rows, the head of a row). HDF5 visits selected elements
// in row-major order of the file, which is the order of the contiguous memory buffer.
void select_local(hid_t fspace, const ParamSpec& s, size_t a, size_t b) {
    if (a >= b) {
        h5::check(H5Sselect_none(fspace), "select none in " + s.name);
        return;
    }
    if (s.ndim == 1) {
        hsize_t start = s.row0 + a, count = b - a;
        h5::check(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &start, nullptr, &count, nullptr),
                  "select in " + s.name);
        return;
    }
    const size_t cols = s.lcols;
    bool first = true;
    auto add = [&](size_t r, size_t c, size_t nr, size_t nc) {
        if (nr == 0 || nc == 0) return;
        hsize_t start[2] = {hsize_t(s.row0 + r), hsize_t(s.col0 + c)}, count[2] = {nr, nc};
        h5::check(H5Sselect_hyperslab(fspace, first ? H5S_SELECT_SET : H5S_SELECT_OR, start,
                                      nullptr, count, nullptr),
                  "select in " + s.name);
        first = false;
    };
    size_t r0 = a / cols, c0 = a % cols, r1 = b / cols, c1 = b % cols;
    if (r0 == r1) {
        add(r0, c0, 1, c1 - c0);
        return;
    }
    size_t full_from = r0;
    if (c0 != 0) {
        add(r0, c0, 1, cols - c0);
        full_from = r0 + 1;
    }
    add(full_from, 0, r1 - full_from, cols);
    add(r1, 0, c1 ? 1 : 0, c1);
}

// Which tensors a group of the file holds: /params every tensor; AdamW's moments the trainable
// tensors but Muon's matrices; Muon's momentum those matrices.
enum class Part { params, moments, momentum };
template <typename T>
bool in_part(Part p, const T& t, const OptimizerStateIo* st) {
    if (p == Part::params) return true;
    const bool trainable = [&] {
        if constexpr (std::is_same_v<T, ParamSpec>) return t.trainable();
        else return t.trainable;
    }();
    const bool muon = st && st->optimizer == "muon" && muon_takes(t);
    return trainable && (p == Part::momentum ? muon : !muon);
}

// f(range, a, b) for every range of `ranges` (sorted, disjoint) overlapping [lo, hi): [a, b) the overlap.
template <typename F>
void for_each_overlap(const std::vector<ArenaRange>& ranges, size_t lo, size_t hi, F f) {
    auto it = std::lower_bound(ranges.begin(), ranges.end(), lo,
                               [](const ArenaRange& r, size_t v) { return r.arena.hi <= v; });
    for (; it != ranges.end() && it->arena.lo < hi; ++it) {
        const size_t a = std::max(lo, it->arena.lo), b = std::min(hi, it->arena.hi);
        if (a < b) f(*it, a, b);
    }
}

std::vector<ArenaRange> sorted(std::vector<ArenaRange> r) {
    std::sort(r.begin(), r.end(), [](const ArenaRange& x, const ArenaRange& y) { return x.arena.lo < y.arena.lo; });
    return r;
}

// The tensors with a row per token id: a weights-only load into a larger vocabulary (training
// on an extended tokenizer, checkpoint.allow_tokenizer_change) reads the rows the file has.
bool is_vocab_tensor(const std::string& name) {
    return name == "model.embed_tokens.weight" || name == "lm_head.weight";
}

// This rank's shard of a vocabulary tensor whose file has fewer rows (file_rows) than the model:
// the rows the file has are read; the new rows are the mean of the file's rows, the usual start
// for added tokens (an average token), the same on every backend and layout.
void read_extended(hid_t ds, const std::string& path, const ParamSpec& s, hsize_t file_rows, float* dst) {
    const hsize_t cols = hsize_t(s.lcols), row0 = hsize_t(s.row0), row1 = row0 + hsize_t(s.lrows);
    auto read_rows = [&](hsize_t r0, hsize_t n, float* out) {
        h5::Handle fs = h5::space(h5::check(H5Dget_space(ds), "dataspace of " + path));
        hsize_t start[2] = {r0, hsize_t(s.col0)}, count[2] = {n, cols};
        h5::check(H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, nullptr, count, nullptr), "select in " + path);
        const hsize_t total = n * cols;
        h5::Handle ms = h5::space(h5::check(H5Screate_simple(1, &total, nullptr), "memory dataspace"));
        h5::check(H5Dread(ds, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, out), "read " + path);
    };
    if (row0 < file_rows) read_rows(row0, std::min(row1, file_rows) - row0, dst);
    if (row1 <= file_rows) return;
    std::vector<double> sum(cols, 0.0);
    std::vector<float> block;
    constexpr hsize_t kBlock = 1024;
    for (hsize_t r = 0; r < file_rows; r += kBlock) {
        const hsize_t n = std::min(kBlock, file_rows - r);
        block.resize(n * cols);
        read_rows(r, n, block.data());
        for (hsize_t i = 0; i < n; ++i)
            for (hsize_t c = 0; c < cols; ++c) sum[c] += block[i * cols + c];
    }
    for (hsize_t r = std::max(row0, file_rows); r < row1; ++r)
        for (hsize_t c = 0; c < cols; ++c) dst[(r - row0) * cols + c] = float(sum[c] / double(file_rows));
}

// Reads the local elements in `ranges` (all of the arena for params) of every shard of `part`
// held here. A moment the file lacks is left as it is when `missing_ok`.
void read_group(hid_t file, const std::string& group, const ParamTable& table, float* data, Part part,
                const OptimizerStateIo* st, const std::vector<ArenaRange>& ranges, bool missing_ok = false) {
    for (const auto& s : table.specs) {
        if (!in_part(part, s, st)) continue;
        const std::string path = group + "/" + s.name;
        if (missing_ok && !h5::exists(file, path)) continue;
        for_each_overlap(ranges, s.offset, s.offset + s.numel(), [&](const ArenaRange& w, size_t a, size_t b) {
            h5::Handle ds = h5::dataset(h5::check(H5Dopen2(file, path.c_str(), H5P_DEFAULT), "open " + path));
            if (part == Part::params && is_vocab_tensor(s.name) && a == s.offset && b == s.offset + s.numel()) {
                const std::vector<hsize_t> shape = h5::dataset_shape(ds);
                if (!shape.empty() && shape[0] < hsize_t(s.rows)) {
                    read_extended(ds, path, s, shape[0], data + a);
                    return;
                }
            }
            h5::Handle fs = h5::space(h5::check(H5Dget_space(ds), "dataspace of " + path));
            select_local(fs, s, a - s.offset, b - s.offset);
            hsize_t n = b - a;
            h5::Handle ms = h5::space(h5::check(H5Screate_simple(1, &n, nullptr), "memory dataspace"));
            float* dst = part != Part::params ? data + w.state_index + (a - w.arena.lo) : data + a;
            h5::check(H5Dread(ds, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, dst), "read " + path);
        });
    }
}

}  // namespace

bool OptimizerStateIo::muon_tensor(const LogicalTensor& t) const { return optimizer == "muon" && muon_takes(t); }

std::string checkpoint_path(const std::string& run_dir, int64_t step) {
    return (fs::path(run_dir) / "checkpoints" / step_name(step)).string();
}

std::string checkpoint_metrics_path(const std::string& checkpoint) {
    fs::path p(checkpoint);
    p.replace_extension(".metrics");
    return p.string();
}

std::string checkpoint_resolve(const std::string& given, const std::string& what, std::string* note) {
    std::string name = given;
    while (name.size() > 1 && name.back() == '/') name.pop_back();
    const fs::path p(name);
    std::error_code ec;
    fs::path latest;
    if (fs::is_directory(p, ec)) {
        if (fs::is_regular_file(p / "checkpoints" / "latest", ec)) latest = p / "checkpoints" / "latest";
        else if (fs::is_regular_file(p / "latest", ec)) latest = p / "latest";
        else
            throw ConfigError(what + " '" + given + "' is a folder without checkpoints/latest or latest (no complete "
                              "checkpoint was written there); give a checkpoint file (step_NNNNNNNN.h5), a run folder or "
                              "its checkpoints/ folder");
    } else if (p.filename() == "latest" && fs::is_regular_file(p, ec)) {
        latest = p;
    } else {
        return given;
    }
    std::ifstream f(latest);
    std::string file;
    std::getline(f, file);
    while (!file.empty() && std::isspace(static_cast<unsigned char>(file.back()))) file.pop_back();
    const fs::path resolved = latest.parent_path() / file;
    if (file.empty() || !fs::is_regular_file(resolved, ec))
        throw ConfigError(what + " '" + given + "': " + latest.string() + " names '" + file +
                          "', which is not there (pruned or moved?); give a checkpoint file (step_NNNNNNNN.h5)");
    if (note) *note = what + " '" + given + "': " + resolved.string() + ", the checkpoint " + latest.string() + " names";
    return resolved.string();
}

std::string checkpoint_latest(const std::string& run_dir) {
    fs::path dir = fs::path(run_dir) / "checkpoints";
    std::ifstream f(dir / "latest");
    if (!f) return "";
    std::string name;
    std::getline(f, name);
    if (name.empty()) return "";
    return (dir / name).string();
}

namespace {

h5::Handle open_checkpoint(const std::string& path) {
    h5::silence_errors();
    if (!fs::exists(path)) throw ConfigError("checkpoint '" + path + "': file does not exist");
    hid_t fid = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (fid < 0) throw ConfigError("checkpoint '" + path + "': not a readable HDF5 file (corrupt or truncated?)");
    h5::Handle file = h5::file(fid);
    if (!h5::has_attr(file, "format_version") || !h5::has_attr(file, "step"))
        throw ConfigError("checkpoint '" + path + "': not a quintet checkpoint (no format_version/step attributes)");
    int64_t ver = h5::read_attr_i64(file, "format_version");
    if (ver != kCheckpointFormatVersion)
        throw ConfigError("checkpoint '" + path + "': format_version " + std::to_string(ver) +
                          ", this build reads version " + std::to_string(kCheckpointFormatVersion));
    return file;
}

CheckpointMeta read_meta(hid_t file, const std::string& path) {
    CheckpointMeta meta;
    meta.step = h5::read_attr_i64(file, "step");
    meta.tokens_seen = h5::read_attr_i64(file, "tokens_seen");
    meta.deck = h5::read_attr_string(file, "deck");
    meta.layout = h5::read_attr_string(file, "layout");
    if (h5::has_attr(file, "trained_context")) meta.trained_context = h5::read_attr_i64(file, "trained_context");
    if (h5::has_attr(file, "param_groups")) meta.param_groups = h5::read_attr_string(file, "param_groups");
    if (h5::has_attr(file, "optimizer")) meta.optimizer = h5::read_attr_string(file, "optimizer");
    if (h5::has_attr(file, "data_blend")) meta.blend = h5::read_attr_string(file, "data_blend");
    meta.tokenizer = tokenizer_store_read(file, "tokenizer", "checkpoint '" + path + "'");
    const std::string window = std::string(kCheckpointStateGroup) + "/" + kCheckpointSpikeWindow;
    if (h5::exists(file, window)) {
        std::vector<hsize_t> dims;
        meta.spike_window = h5::read_f64(file, window, &dims);
        if (dims.size() != 2 || dims[1] != 2)
            throw ConfigError("checkpoint '" + path + "': " + window + " is not an [n, 2] array");
    }
    if (h5::exists(file, kCheckpointStateGroup)) {
        h5::Handle g = h5::group(H5Gopen2(file, kCheckpointStateGroup, H5P_DEFAULT));
        if (g.valid() && h5::has_attr(g, "skips_in_row")) meta.skips_in_row = h5::read_attr_i64(g, "skips_in_row");
    }
    return meta;
}

}  // namespace

CheckpointMeta checkpoint_read_meta(const std::string& path) {
    h5::Handle file = open_checkpoint(path);
    return read_meta(file, path);
}

CheckpointMeta checkpoint_inspect(const std::string& path, const ParamTable& table,
                                  bool with_optimizer) {
    h5::Handle file = open_checkpoint(path);
    OptimizerStateIo theirs;  // the file's own optimizer decides which state it holds
    if (h5::has_attr(file, "optimizer")) theirs.optimizer = h5::read_attr_string(file, "optimizer");
    for (const char* group : {"/params/", "/optim/exp_avg/", "/optim/exp_avg_sq/", "/optim/momentum/"}) {
        if (!with_optimizer && group != std::string("/params/")) continue;
        const Part part = group == std::string("/params/")          ? Part::params
                          : group == std::string("/optim/momentum/") ? Part::momentum
                                                                     : Part::moments;
        for (const auto& s : table.logical) {
            if (!in_part(part, s, &theirs)) continue;
            std::string p = group + s.name;
            if (!h5::exists(file, p))
                throw ConfigError("checkpoint '" + path + "': has no tensor " + p +
                                  " -- it was written for another model (compare its 'deck' attribute with this deck)");
            h5::Handle ds = h5::dataset(h5::check(H5Dopen2(file, p.c_str(), H5P_DEFAULT), "open " + p));
            auto have = h5::dataset_shape(ds);
            auto want = logical_shape(s.rows, s.cols, s.ndim);
            // Weights only into a larger vocabulary: fewer rows are read, the rest start anew.
            const bool extension = !with_optimizer && is_vocab_tensor(s.name) && have.size() == 2 &&
                                   want.size() == 2 && have[1] == want[1] && have[0] < want[0];
            if (have != want && !extension) {
                auto str = [](const std::vector<hsize_t>& v) {
                    std::string r = "[";
                    for (size_t i = 0; i < v.size(); ++i) r += (i ? ", " : "") + std::to_string(v[i]);
                    return r + "]";
                };
                throw ConfigError("checkpoint '" + path + "': tensor " + p + " has shape " + str(have) +
                                  " but this deck's model needs " + str(want) +
                                  " -- the checkpoint is from another model shape");
            }
        }
    }
    return read_meta(file, path);
}

namespace {
herr_t list_datasets(hid_t, const char* name, const H5O_info_t* info, void* op) {
    // The tensors (the tokenizer group holds bytes, not floats: it is checked when it is read).
    if (info->type == H5O_TYPE_DATASET && std::strncmp(name, "tokenizer", 9) != 0)
        static_cast<std::vector<std::string>*>(op)->push_back(std::string("/") + name);
    return 0;
}
}  // namespace

std::string checkpoint_verify(const std::string& path, const MpiCommunicator& comm) {
    const int rank = comm.rank(), size = comm.size();
    std::string why;
    h5::silence_errors();
    std::vector<std::string> names;
    hid_t fid = fs::exists(path) ? H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT) : -1;
    if (fid < 0) {
        why = fs::exists(path) ? "not a readable HDF5 file (truncated or corrupt)" : "the file does not exist";
    } else {
        h5::Handle file = h5::file(fid);
        if (!h5::has_attr(file, "format_version") || !h5::has_attr(file, "step"))
            why = "not a quintet checkpoint";
        else if (H5Ovisit2(file, H5_INDEX_NAME, H5_ITER_INC, list_datasets, &names, H5O_INFO_BASIC) < 0)
            why = "its tensors cannot be listed (corrupt)";
        std::vector<float> v;
        std::vector<double> v64;
        // Each rank checks every size-th tensor: one read of the file, shared.
        for (size_t k = size_t(rank); why.empty() && k < names.size(); k += size_t(size)) {
            const std::string& n = names[k];
            hid_t ds = H5Dopen2(file, n.c_str(), H5P_DEFAULT);
            if (ds < 0) { why = "tensor " + n + " cannot be opened"; break; }
            h5::Handle d = h5::dataset(ds);
            size_t count = 1;
            for (hsize_t x : h5::dataset_shape(d)) count *= size_t(x);
            // float32 tensors; the run state's float64 arrays (/train_state) are summed as such.
            h5::Handle type = h5::type(H5Dget_type(d));
            const bool f64 = type.valid() && H5Tget_class(type) == H5T_FLOAT && H5Tget_size(type) == 8;
            herr_t rc = 0;
            if (f64) {
                v64.resize(count);
                if (count) rc = H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v64.data());
            } else {
                v.resize(count);
                if (count) rc = H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
            }
            if (rc < 0) {
                why = "tensor " + n + " cannot be read (truncated?)";
                break;
            }
            if (!h5::has_attr(d, "checksum")) continue;  // written before checksums: readable is all we know
            const int64_t want = h5::read_attr_i64(d, "checksum");
            const uint64_t got = f64 ? checkpoint_checksum::run(v64.data(), 0, count)
                                     : checkpoint_checksum::run(v.data(), 0, count);
            int64_t got_i64;
            std::memcpy(&got_i64, &got, 8);
            if (got_i64 != want) why = "tensor " + n + " does not match its checksum";
        }
    }
    // The lowest rank with a finding reports it to all.
    int first = why.empty() ? size : rank;
    comm.all_reduce_min(&first, 1);
    if (first == size) return "";
    char buf[512] = {0};
    if (rank == first) std::snprintf(buf, sizeof buf, "%s", why.c_str());
    comm.broadcast(buf, sizeof buf, first);
    return buf;
}

std::string checkpoint_newest_valid(const std::string& run_dir, const MpiCommunicator& comm, std::vector<std::string>* skipped) {
    const fs::path dir = fs::path(run_dir) / "checkpoints";
    std::vector<std::string> candidates;
    const std::string latest = checkpoint_latest(run_dir);
    if (!latest.empty()) candidates.push_back(latest);
    std::vector<std::string> all;
    std::error_code ec;
    if (fs::is_directory(dir, ec))
        for (auto& e : fs::directory_iterator(dir)) {
            auto n = e.path().filename().string();
            if (n.rfind("step_", 0) == 0 && e.path().extension() == ".h5") all.push_back(e.path().string());
        }
    std::sort(all.rbegin(), all.rend());
    for (const auto& p : all)
        if (p != latest) candidates.push_back(p);
    const int rank = comm.rank();
    for (const auto& p : candidates) {
        const std::string why = checkpoint_verify(p, comm);
        if (why.empty()) return p;
        // Kept for the user, but no longer a checkpoint: it is neither loaded nor counted by keep.
        if (rank == 0 && fs::exists(p)) {
            std::error_code ec;
            fs::rename(p, p + ".corrupt", ec);
        }
        if (skipped) skipped->push_back(p + ": " + why + " (kept as " + p + ".corrupt)");
    }
    return "";
}

void checkpoint_load(const std::string& path, const ParamTable& table, float* params, const OptimizerStateIo* st,
                     bool missing_state_is_zero) {
    h5::silence_errors();
    h5::Handle file = h5::file(h5::check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "open " + path));
    read_group(file, "/params", table, params, Part::params, st, {ArenaRange{Range{0, table.total}, 0}});
    if (!st) return;
    const std::vector<ArenaRange> ranges = sorted(st->ranges);
    read_group(file, "/optim/exp_avg", table, st->exp_avg, Part::moments, st, ranges, missing_state_is_zero);
    read_group(file, "/optim/exp_avg_sq", table, st->exp_avg_sq, Part::moments, st, ranges, missing_state_is_zero);
    for (const auto& w : st->momentum) {
        const LogicalTensor& lt = table.logical[w.logical];
        const std::string p = "/optim/momentum/" + lt.name;
        if (missing_state_is_zero && !h5::exists(file, p)) continue;
        h5::Handle ds = h5::dataset(h5::check(H5Dopen2(file, p.c_str(), H5P_DEFAULT), "open " + p));
        h5::check(H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, w.data), "read " + p);
    }
}

std::string tokenizer_change(const CheckpointMeta& meta, const Tokenizer& data_tok) {
    if (meta.tokenizer.empty()) return "";
    if (meta.tokenizer == data_tok.state()) return "";
    std::string theirs;
    int their_vocab = -1;
    try {
        const Tokenizer t = tokenizer_from_state(meta.tokenizer, "the checkpoint's tokenizer");
        theirs = t.describe();
        their_vocab = t.vocab_size();
    } catch (const ConfigError& e) {
        theirs = meta.tokenizer.kind + " (unreadable: " + e.what() + ")";
    }
    std::string why = "the token file's tokenizer, " + data_tok.describe() + ", is not the checkpoint's, " + theirs;
    if (their_vocab >= 0 && their_vocab != data_tok.vocab_size())
        why += " (vocabulary " + std::to_string(data_tok.vocab_size()) + " against the checkpoint's " +
               std::to_string(their_vocab) + ")";
    return why;
}

int64_t checkpoint_vocab_size(const std::string& path) {
    h5::Handle file = open_checkpoint(path);
    const std::string emb = "/params/model.embed_tokens.weight";
    if (!h5::exists(file, emb)) return -1;
    h5::Handle ds = h5::dataset(H5Dopen2(file, emb.c_str(), H5P_DEFAULT));
    if (!ds.valid()) return -1;
    const std::vector<hsize_t> shape = h5::dataset_shape(ds);
    return shape.empty() ? -1 : int64_t(shape[0]);
}

std::string weights_tokenizer_check(const std::string& checkpoint, const Tokenizer& data_tok,
                                    const std::string& data_path, bool allow, bool resume) {
    const CheckpointMeta meta = checkpoint_read_meta(checkpoint);
    const int64_t rows = checkpoint_vocab_size(checkpoint), vocab = data_tok.vocab_size();
    const std::string data = "data.path '" + data_path + "'";
    const bool vocab_differs = rows >= 0 && rows != vocab;
    std::string why = tokenizer_change(meta, data_tok);
    if (why.empty() && !vocab_differs)
        return meta.tokenizer.empty() ? tokenizer_source_note(checkpoint, data + ", which cannot be compared with it")
                                      : "";
    why = why.empty() ? data + " has vocabulary " + std::to_string(vocab) + " (" + data_tok.describe() +
                            ") but checkpoint '" + checkpoint + "' was trained with vocabulary " + std::to_string(rows) +
                            " (it stores no tokenizer: written before tokenizers travelled with checkpoints)"
                      : data + ": " + why;
    if (!allow)
        throw ConfigError(why + "; training on it would give the weights' token ids another meaning. To change the "
                          "tokenizer anyway (an extended vocabulary, other special tokens), pass "
                          "--allow-tokenizer-change (checkpoint.allow_tokenizer_change = true)");
    if (!vocab_differs) return "checkpoint.allow_tokenizer_change = true: " + why + "; proceeding, the ids keep their rows";
    if (resume)
        throw ConfigError(why + "; a resumed run keeps its vocabulary: start a new run from these weights with "
                          "checkpoint.init_from");
    if (vocab < rows)
        throw ConfigError(why + "; the vocabulary would shrink from " + std::to_string(rows) + " to " +
                          std::to_string(vocab) + " tokens: only an extension (more rows) is supported");
    // Which of the old ids still stand for the same bytes: an extension keeps them all.
    std::string kept;
    if (!meta.tokenizer.empty()) {
        try {
            const Tokenizer old = tokenizer_from_state(meta.tokenizer, "the checkpoint's tokenizer");
            int64_t changed = 0;
            for (int64_t id = 0; id < rows && id < old.vocab_size(); ++id) {
                std::string a, b;
                try {
                    a = old.token_bytes(uint32_t(id));
                } catch (const ConfigError&) {
                }
                try {
                    b = data_tok.token_bytes(uint32_t(id));
                } catch (const ConfigError&) {
                }
                changed += a != b;
            }
            kept = changed == 0 ? "; ids 0 .. " + std::to_string(rows - 1) + " keep their tokens (an extension)"
                                : "; warning: " + std::to_string(changed) + " of the ids 0 .. " + std::to_string(rows - 1) +
                                      " stand for other tokens than in the checkpoint";
        } catch (const ConfigError&) {
        }
    }
    return "checkpoint.allow_tokenizer_change = true: " + why + "; the vocabulary grows from " + std::to_string(rows) +
           " to " + std::to_string(vocab) + ": rows " + std::to_string(rows) + " .. " + std::to_string(vocab - 1) +
           " of the embedding and the output layer are new, each the mean of the trained rows" + kept;
}

std::string tokenizer_source_note(const std::string& checkpoint, const std::string& taken_from) {
    return "checkpoint '" + checkpoint + "' has no tokenizer (written before tokenizers travelled with "
           "checkpoints); the tokenizer is taken from " + taken_from;
}

}  // namespace quintet
