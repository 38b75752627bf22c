#include "quintet/io/checkpoint.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "quintet/core/error.hpp"
#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/io/h5.hpp"

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

// Tensors of at most this many floats are written with independent I/O by the ranks that hold
// them (no collective per tiny tensor: norms, and later thousands of small experts); larger ones
// with one collective H5Dwrite each, which MPI-IO can aggregate.
constexpr hsize_t kIndependentMax = 1 << 16;

// Collective: every rank creates every dataset (HDF5 metadata is collective); each writes the
// parts of its writer shards that fall in `writes`. `data` is params (moments = false) or a
// moment array, indexed through the ranges' state_index.
void write_group(hid_t file, const std::string& group, const ParamTable& table, const float* data,
                 bool moments, const std::vector<ArenaRange>& writes, hid_t coll, hid_t indep) {
    for (const auto& lt : table.logical) {
        if (moments && !lt.trainable) continue;
        const std::string path = group + "/" + lt.name;
        auto shape = logical_shape(lt.rows, lt.cols, lt.ndim);
        h5::Handle fs = h5::space(
            h5::check(H5Screate_simple(int(shape.size()), shape.data(), nullptr), "dataspace of " + path));
        h5::Handle ds = h5::dataset(h5::check(
            H5Dcreate2(file, path.c_str(), H5T_IEEE_F32LE, fs, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
            "create dataset " + path));
        const ParamSpec* s = table.writer_spec(lt.name);
        const bool collective = lt.numel() > kIndependentMax;
        // The pieces of this tensor in the write ranges (at most one per range).
        bool any = false;
        for (const auto& w : writes) {
            if (!s) break;
            const size_t a = std::max(w.arena.lo, s->offset), b = std::min(w.arena.hi, s->offset + s->numel());
            if (a >= b) continue;
            select_local(fs, *s, a - s->offset, b - s->offset);
            hsize_t n = b - a;
            h5::Handle ms = h5::space(h5::check(H5Screate_simple(1, &n, nullptr), "memory dataspace"));
            const float* src = moments ? data + w.state_index + (a - w.arena.lo) : data + a;
            h5::check(H5Dwrite(ds, H5T_NATIVE_FLOAT, ms, fs, collective ? coll : indep, src),
                      "write " + path);
            any = true;
            if (collective) break;  // collective: one call per rank (a writer's part is one range)
        }
        if (collective && !any) {  // take part in the collective write with nothing
            h5::check(H5Sselect_none(fs), "select none in " + path);
            hsize_t zero = 0;
            h5::Handle ms = h5::space(h5::check(H5Screate_simple(1, &zero, nullptr), "dataspace"));
            h5::check(H5Sselect_none(ms), "select none in " + path);
            h5::check(H5Dwrite(ds, H5T_NATIVE_FLOAT, ms, fs, coll, data), "write " + path);
        }
    }
}

// Reads the local elements in `ranges` (all of the arena for params) of every shard held here.
void read_group(hid_t file, const std::string& group, const ParamTable& table, float* data,
                bool moments, const std::vector<ArenaRange>& ranges) {
    for (const auto& s : table.specs) {
        if (moments && !s.trainable()) continue;
        for (const auto& w : ranges) {
            const size_t a = std::max(w.arena.lo, s.offset), b = std::min(w.arena.hi, s.offset + s.numel());
            if (a >= b) continue;
            const std::string path = group + "/" + s.name;
            h5::Handle ds = h5::dataset(h5::check(H5Dopen2(file, path.c_str(), H5P_DEFAULT), "open " + path));
            h5::Handle fs = h5::space(h5::check(H5Dget_space(ds), "dataspace of " + path));
            select_local(fs, s, a - s.offset, b - s.offset);
            hsize_t n = b - a;
            h5::Handle ms = h5::space(h5::check(H5Screate_simple(1, &n, nullptr), "memory dataspace"));
            float* dst = moments ? data + w.state_index + (a - w.arena.lo) : data + a;
            h5::check(H5Dread(ds, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, dst), "read " + path);
        }
    }
}

void write_text_atomically(const fs::path& path, const std::string& text) {
    fs::path tmp = path;
    tmp += ".tmp";
    {
        std::ofstream f(tmp);
        f << text;
        if (!f) rank_fail("cannot write " + tmp.string());
    }
    fs::rename(tmp, path);
}

}  // namespace

std::string checkpoint_save(MPI_Comm comm, const std::string& run_dir, const CheckpointMeta& meta,
                            const ParamTable& table, const float* params, const float* m,
                            const float* v, const std::vector<ArenaRange>& writes, int keep) {
    int rank = 0;
    QUINTET_MPI(MPI_Comm_rank(comm, &rank));
    fs::path dir = fs::path(run_dir) / "checkpoints";
    if (rank == 0) fs::create_directories(dir);
    QUINTET_MPI(MPI_Barrier(comm));
    fs::path final_path = dir / step_name(meta.step);
    fs::path tmp_path = final_path;
    tmp_path += ".tmp";

    h5::Handle fapl = h5::plist(h5::check(H5Pcreate(H5P_FILE_ACCESS), "file access property list"));
    h5::check(H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL), "H5Pset_fapl_mpio");
    // Metadata (thousands of dataset headers for MoE models) written collectively, in few calls.
    h5::check(H5Pset_coll_metadata_write(fapl, true), "H5Pset_coll_metadata_write");
    h5::Handle file = h5::file(h5::check(
        H5Fcreate(tmp_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl), "create " + tmp_path.string()));
    h5::Handle coll = h5::plist(h5::check(H5Pcreate(H5P_DATASET_XFER), "transfer property list"));
    h5::check(H5Pset_dxpl_mpio(coll, H5FD_MPIO_COLLECTIVE), "H5Pset_dxpl_mpio");
    h5::Handle indep = h5::plist(h5::check(H5Pcreate(H5P_DATASET_XFER), "transfer property list"));
    h5::check(H5Pset_dxpl_mpio(indep, H5FD_MPIO_INDEPENDENT), "H5Pset_dxpl_mpio");
    h5::write_attr_i64(file, "step", meta.step);
    h5::write_attr_i64(file, "tokens_seen", meta.tokens_seen);
    h5::write_attr_string(file, "deck", meta.deck);
    h5::write_attr_i64(file, "format_version", kCheckpointFormatVersion);
    h5::write_attr_string(file, "layout", meta.layout);
    h5::write_attr_i64(file, "trained_context", meta.trained_context);
    for (const char* g : {"/params", "/optim", "/optim/exp_avg", "/optim/exp_avg_sq"})
        h5::group(h5::check(H5Gcreate2(file, g, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), g));
    write_group(file, "/params", table, params, false, writes, coll, indep);
    write_group(file, "/optim/exp_avg", table, m, true, writes, coll, indep);
    write_group(file, "/optim/exp_avg_sq", table, v, true, writes, coll, indep);
    h5::check(H5Fflush(file, H5F_SCOPE_GLOBAL), "flush " + tmp_path.string());
    h5::check(H5Fclose(file.release()), "close " + tmp_path.string());
    QUINTET_MPI(MPI_Barrier(comm));
    if (rank == 0) {
        fs::rename(tmp_path, final_path);
        write_text_atomically(dir / "latest", final_path.filename().string() + "\n");
        if (keep > 0) {
            std::vector<fs::path> all;
            for (auto& e : fs::directory_iterator(dir)) {
                auto n = e.path().filename().string();
                if (n.rfind("step_", 0) == 0 && e.path().extension() == ".h5") all.push_back(e.path());
            }
            std::sort(all.begin(), all.end());
            for (size_t i = 0; i + keep < all.size(); ++i) fs::remove(all[i]);
        }
    }
    QUINTET_MPI(MPI_Barrier(comm));
    return final_path.string();
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

CheckpointMeta read_meta(hid_t file) {
    CheckpointMeta meta;
    meta.step = h5::read_attr_i64(file, "step");
    meta.tokens_seen = h5::read_attr_i64(file, "tokens_seen");
    meta.deck = h5::read_attr_string(file, "deck");
    meta.layout = h5::read_attr_string(file, "layout");
    if (h5::has_attr(file, "trained_context")) meta.trained_context = h5::read_attr_i64(file, "trained_context");
    return meta;
}

}  // namespace

CheckpointMeta checkpoint_read_meta(const std::string& path) {
    h5::Handle file = open_checkpoint(path);
    return read_meta(file);
}

CheckpointMeta checkpoint_inspect(const std::string& path, const ParamTable& table,
                                  bool with_optimizer) {
    h5::Handle file = open_checkpoint(path);
    for (const char* group : {"/params/", "/optim/exp_avg/", "/optim/exp_avg_sq/"}) {
        if (!with_optimizer && group != std::string("/params/")) continue;
        for (const auto& s : table.logical) {
            if (!s.trainable && group != std::string("/params/")) continue;
            std::string p = group + s.name;
            if (!h5::exists(file, p))
                throw ConfigError("checkpoint '" + path + "': has no tensor " + p +
                                  " -- it was written for another model (compare its 'deck' attribute with this deck)");
            h5::Handle ds = h5::dataset(h5::check(H5Dopen2(file, p.c_str(), H5P_DEFAULT), "open " + p));
            auto have = h5::dataset_shape(ds);
            auto want = logical_shape(s.rows, s.cols, s.ndim);
            if (have != want) {
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
    return read_meta(file);
}

void checkpoint_load(const std::string& path, const ParamTable& table, float* params,
                     float* m, float* v, const std::vector<ArenaRange>& state) {
    h5::silence_errors();
    h5::Handle file = h5::file(h5::check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "open " + path));
    read_group(file, "/params", table, params, false, {ArenaRange{Range{0, table.total}, 0}});
    if (m) read_group(file, "/optim/exp_avg", table, m, true, state);
    if (v) read_group(file, "/optim/exp_avg_sq", table, v, true, state);
}

}  // namespace quintet
