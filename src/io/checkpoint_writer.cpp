#include "quintet/io/checkpoint_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint_checksum.hpp"
#include "quintet/core/error.hpp"
#include "quintet/io/h5.hpp"
#include "quintet/io/tokenizer_store.hpp"
#include "quintet/model/param_groups.hpp"

namespace fs = std::filesystem;

namespace quintet {

// The datasets are float32 little-endian, and the writer copies this host's floats as they are.
static_assert(std::endian::native == std::endian::little, "checkpoints are written from little-endian hosts");

namespace {

namespace cs = checkpoint_checksum;

std::string step_name(int64_t step) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "step_%08lld.h5", (long long)step);
    return buf;
}

std::string errno_text(int err) { return std::strerror(err); }

// fsync of a file or a directory (the rename and `latest` must reach the disk in order).
void sync_path(const fs::path& p) {
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw IoError("cannot open " + p.string() + " to fsync it: " + errno_text(errno));
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) throw IoError("fsync of " + p.string() + " failed: " + errno_text(err));
}

void write_text_atomically(const fs::path& path, const std::string& text) {
    fs::path tmp = path;
    tmp += ".tmp";
    {
        std::ofstream f(tmp);
        f << text;
        f.flush();
        if (!f) throw IoError("cannot write " + tmp.string() + ": " + errno_text(errno));
    }
    sync_path(tmp);
    fs::rename(tmp, path);
}

std::vector<hsize_t> logical_shape(const LogicalTensor& lt) {
    if (lt.ndim == 1) return {hsize_t(lt.rows)};
    return {hsize_t(lt.rows), hsize_t(lt.cols)};
}

// The groups of tensors, in file order: every tensor's parameters; AdamW's two moments of every
// trainable tensor but, under Muon, the matrices Muon takes (model/param_groups.hpp muon_takes),
// whose momentum is the last group (written only under Muon).
enum Group { kParams, kExpAvg, kExpAvgSq, kMomentum, kNumGroups };
constexpr const char* kGroups[kNumGroups] = {"/params", "/optim/exp_avg", "/optim/exp_avg_sq", "/optim/momentum"};

// f(group, index in table.logical, logical tensor, dataset index) for every dataset, in file order.
template <typename F>
void for_each_dataset(const ParamTable& table, bool muon, F f) {
    size_t k = 0;
    for (int g = 0; g < kNumGroups; ++g)
        for (size_t i = 0; i < table.logical.size(); ++i) {
            const LogicalTensor& lt = table.logical[i];
            const bool muons = muon && lt.trainable && muon_takes(lt);
            if (g != kParams && (!lt.trainable || muons != (g == kMomentum))) continue;
            f(g, i, lt, k++);
        }
}

// The whole of [buf, buf + n) at `off`; "" or the error.
std::string pwrite_all(int fd, const void* buf, size_t n, off_t off) {
    const char* p = static_cast<const char*>(buf);
    while (n > 0) {
        const ssize_t w = ::pwrite(fd, p, std::min<size_t>(n, size_t(1) << 30), off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return errno_text(w < 0 ? errno : ENOSPC);
        p += w, n -= size_t(w), off += w;
    }
    return "";
}

}  // namespace

// Rank 0's HDF5 objects of the file being written: created in phase 1, the checksums written
// and everything closed in phase 3 (both on the thread that owns HDF5).
struct CheckpointWriter::Open {
    h5::Handle file;
    std::vector<h5::Handle> datasets;
};

CheckpointWriter::CheckpointWriter(const MpiCommunicator& comm, const std::string& run_dir, const CheckpointMeta& meta,
                                   const ParamTable& table, std::vector<CheckpointSource> sources,
                                   std::vector<CheckpointWhole> momentum, int keep, const std::string& metrics_tmp)
    : comm_(comm), run_dir_(run_dir), metrics_tmp_(metrics_tmp), step_(meta.step), keep_(keep),
      sources_(std::move(sources)) {
    const fs::path dir = fs::path(run_dir) / "checkpoints";
    final_path_ = (dir / step_name(meta.step)).string();
    tmp_path_ = final_path_ + ".tmp";
    const bool muon = meta.optimizer == "muon";
    // What this rank writes: the part of its writer shard of every tensor inside its sources
    // (the sources of that group's values), and the whole matrices whose momentum it keeps.
    for_each_dataset(table, muon, [&](int g, size_t i, const LogicalTensor& lt, size_t k) {
        datasets_ = k + 1;
        if (g == kMomentum) {
            for (const CheckpointWhole& w : momentum)
                if (w.logical == i) {
                    pieces_.push_back({k, nullptr, 0, lt.numel(), w.data});
                    bytes_ += lt.numel() * sizeof(float);
                }
            return;
        }
        const ParamSpec* s = table.writer_spec(lt.name);
        if (!s) return;
        for (const CheckpointSource& src : sources_) {
            const float* base = g == kParams ? src.params : g == kExpAvg ? src.exp_avg : src.exp_avg_sq;
            if (!base) continue;
            const size_t a = std::max(src.arena.lo, s->offset), b = std::min(src.arena.hi, s->offset + s->numel());
            if (a >= b) continue;
            pieces_.push_back({k, s, a - s->offset, b - s->offset, base + (a - src.arena.lo)});
            bytes_ += (b - a) * sizeof(float);
        }
    });
    checksums_.assign(datasets_, 0);
    offsets_.assign(datasets_, 0);
    // Room for the file first (a clear error before anything is written): the tensors and the
    // optimizer state of the trainable ones (two moments, or Muon's momentum), in fp32, plus a
    // margin for HDF5's metadata.
    char err[1024] = {0};
    if (comm.rank() == 0) {
        std::error_code ec;
        fs::create_directories(dir, ec);
        double need = 0;
        for (const auto& lt : table.logical)
            need += double(lt.numel()) * 4 * (!lt.trainable ? 1 : muon && muon_takes(lt) ? 2 : 3);
        need = need * 1.02 + 65536 + 1024.0 * double(table.logical.size());
        need += double(meta.tokenizer.file.size() + 8 * meta.tokenizer.merges.size());  // the tokenizer group
        need += 8.0 * double(meta.spike_window.size());
        const fs::space_info sp = fs::space(dir, ec);
        if (!ec && double(sp.available) < need) {
            std::snprintf(err, sizeof err,
                          "the checkpoint of step %lld needs about %.1f MiB and the file system of %s has "
                          "%.1f MiB free (No space left on device); nothing was written, the earlier "
                          "checkpoints are intact (latest: %s)",
                          (long long)meta.step, need / 1048576.0, dir.c_str(), double(sp.available) / 1048576.0,
                          checkpoint_latest(run_dir).c_str());
            discard();  // the metrics snapshot made for it
        } else {
            errno = 0;
            try {
                create_file(meta, table, offsets_);
            } catch (const std::exception& e) {
                const int e_no = errno;
                discard();
                std::snprintf(err, sizeof err,
                              "the checkpoint of step %lld could not be created (%s%s%s); nothing is left of it, the "
                              "earlier checkpoints are intact (latest: %s)",
                              (long long)meta.step, e.what(), e_no ? "; " : "", e_no ? std::strerror(e_no) : "",
                              checkpoint_latest(run_dir).c_str());
            }
        }
    }
    comm.broadcast(err, sizeof err, 0);
    if (err[0]) throw IoError(err);
    comm.broadcast(offsets_.data(), offsets_.size() * sizeof(uint64_t), 0);
}

CheckpointWriter::~CheckpointWriter() {
    if (!committed_) discard();
}

void CheckpointWriter::create_file(const CheckpointMeta& meta, const ParamTable& table,
                                   std::vector<uint64_t>& offsets) {
    h5::silence_errors();
    open_ = std::make_unique<Open>();
    open_->file = h5::file(
        h5::check(H5Fcreate(tmp_path_.c_str(), H5F_ACC_TRUNC, h5::file_create_plist(), H5P_DEFAULT), "create " + tmp_path_));
    hid_t file = open_->file;
    h5::write_attr_i64(file, "step", meta.step);
    h5::write_attr_i64(file, "tokens_seen", meta.tokens_seen);
    h5::write_attr_string(file, "deck", meta.deck);
    h5::write_attr_i64(file, "format_version", kCheckpointFormatVersion);
    h5::write_attr_string(file, "layout", meta.layout);
    h5::write_attr_i64(file, "trained_context", meta.trained_context);
    if (!meta.param_groups.empty()) h5::write_attr_string(file, "param_groups", meta.param_groups);
    h5::write_attr_string(file, "optimizer", meta.optimizer);
    if (!meta.blend.empty()) h5::write_attr_string(file, "data_blend", meta.blend);
    if (!meta.tokenizer.empty()) tokenizer_store_write(file, "tokenizer", meta.tokenizer, true);
    const bool muon = meta.optimizer == "muon";
    for (const char* g : {"/params", "/optim", "/optim/exp_avg", "/optim/exp_avg_sq", "/optim/momentum"})
        if (muon || std::string(g) != "/optim/momentum")
            h5::group(h5::check(H5Gcreate2(file, g, H5P_DEFAULT, h5::group_create_plist(), H5P_DEFAULT), g));
    // Contiguous storage allocated now and never filled by HDF5: the ranks write the bytes
    // themselves (phase 2), and the checksums go into the attributes created here (phase 3).
    h5::Handle dcpl = h5::dataset_create_plist();
    h5::check(H5Pset_layout(dcpl, H5D_CONTIGUOUS), "H5Pset_layout");
    h5::check(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY), "H5Pset_alloc_time");
    h5::check(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER), "H5Pset_fill_time");
    for_each_dataset(table, muon, [&](int g, size_t, const LogicalTensor& lt, size_t k) {
        const std::string path = std::string(kGroups[g]) + "/" + lt.name;
        const auto shape = logical_shape(lt);
        h5::Handle sp = h5::space(
            h5::check(H5Screate_simple(int(shape.size()), shape.data(), nullptr), "dataspace of " + path));
        h5::Handle ds = h5::dataset(h5::check(
            H5Dcreate2(file, path.c_str(), H5T_IEEE_F32LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT), "create dataset " + path));
        h5::write_attr_i64(ds, "checksum", 0);
        const haddr_t at = H5Dget_offset(ds);
        if (at == HADDR_UNDEF) throw IoError("no storage was allocated for " + path + " in " + tmp_path_);
        offsets[k] = uint64_t(at);
        open_->datasets.push_back(std::move(ds));
    });
    // The run state beside the tensors (train/spikes): the spike window, written whole here.
    h5::Handle state = h5::group(h5::check(H5Gcreate2(file, kCheckpointStateGroup, H5P_DEFAULT, h5::group_create_plist(), H5P_DEFAULT),
                                           kCheckpointStateGroup));
    h5::write_attr_i64(state, "skips_in_row", meta.skips_in_row);
    const std::string window = std::string(kCheckpointStateGroup) + "/" + kCheckpointSpikeWindow;
    const hsize_t dims[2] = {hsize_t(meta.spike_window.size() / 2), 2};
    h5::Handle sp = h5::space(h5::check(H5Screate_simple(2, dims, nullptr), "dataspace of " + window));
    h5::Handle ds = h5::dataset(h5::check(
        H5Dcreate2(file, window.c_str(), H5T_IEEE_F64LE, sp, H5P_DEFAULT, h5::dataset_create_plist(), H5P_DEFAULT), "create " + window));
    if (!meta.spike_window.empty())
        h5::check(H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, meta.spike_window.data()),
                  "write " + window);
    const uint64_t sum = cs::run(meta.spike_window.data(), 0, meta.spike_window.size());
    int64_t as_i64;
    std::memcpy(&as_i64, &sum, 8);
    h5::write_attr_i64(ds, "checksum", as_i64);
}

std::string CheckpointWriter::write(const std::atomic<bool>* cancel) noexcept {
    auto cancelled = [&] { return cancel && cancel->load(std::memory_order_relaxed); };
    try {
        if (cancelled()) return "cancelled";
        // The metrics history beside the checkpoint reaches the disk before the checkpoint does.
        if (comm_.rank() == 0 && !metrics_tmp_.empty()) {
            sync_path(metrics_tmp_);
            const std::string to = checkpoint_metrics_path(final_path_);
            if (std::rename(metrics_tmp_.c_str(), to.c_str()) != 0)
                return "rename of " + metrics_tmp_ + ": " + errno_text(errno);
            metrics_tmp_ = to;  // discard() removes it if the checkpoint fails
        }
        const int fd = ::open(tmp_path_.c_str(), O_WRONLY | O_CLOEXEC);
        if (fd < 0) return "cannot open " + tmp_path_ + " for writing: " + errno_text(errno);
        std::string why;
        for (const Piece& p : pieces_) {
            if (cancelled()) {
                why = "cancelled";
                break;
            }
            // A shard is a [lrows, lcols] block at (row0, col0) of the logical [rows, cols]
            // tensor: whole rows are one run of the file, a column block one run per row. A
            // whole tensor (no spec) is one run.
            const ParamSpec whole{};
            const ParamSpec& s = p.spec ? *p.spec : whole;
            const size_t lc = p.spec ? size_t(s.lcols) : p.b, cols = p.spec ? size_t(s.cols) : p.b;
            uint64_t sum = 0;
            for (size_t j = p.a; j < p.b && why.empty();) {
                if (cancelled()) {
                    why = "cancelled";
                    break;
                }
                const size_t row = j / lc, col = j % lc;
                const size_t n = lc == cols ? p.b - j : std::min(p.b, (row + 1) * lc) - j;
                const uint64_t first = (uint64_t(s.row0) + row) * cols + uint64_t(s.col0) + col;
                const float* v = p.src + (j - p.a);
                sum += cs::run(v, first, n);
                const std::string e =
                    pwrite_all(fd, v, n * sizeof(float), off_t(offsets_[p.dataset] + first * sizeof(float)));
                if (!e.empty()) why = "write of " + tmp_path_ + ": " + e;
                j += n;
            }
            checksums_[p.dataset] += sum;
            if (!why.empty()) break;
        }
        if (why.empty() && ::fdatasync(fd) != 0) why = "fdatasync of " + tmp_path_ + ": " + errno_text(errno);
        if (::close(fd) != 0 && why.empty()) why = "close of " + tmp_path_ + ": " + errno_text(errno);
        return why;
    } catch (const std::exception& e) {
        return e.what();
    } catch (...) {
        return "an unknown error";
    }
}

std::string CheckpointWriter::commit(const std::string& error) {
    const int rank = comm_.rank(), size = comm_.size();
    // 1. A failure anywhere is every rank's: the first rank with a real error names it (a
    //    write cancelled because another rank failed is not the cause).
    int code = error.empty() ? 2 * size : error == "cancelled" ? size + rank : rank;
    comm_.all_reduce_min(&code, 1);
    if (code < 2 * size) {
        const int from = code % size;
        char buf[1024] = {0};
        if (rank == from) std::snprintf(buf, sizeof buf, "%s", error.c_str());
        comm_.broadcast(buf, sizeof buf, from);
        discard();
        throw IoError("the checkpoint of step " + std::to_string(step_) + " could not be written (rank " +
                      std::to_string(from) + ": " + buf + "); its partial file is removed and the earlier "
                      "checkpoints are intact (latest: " + checkpoint_latest(run_dir_) + ")");
    }
    // 2. The checksums, completed over the ranks.
    comm_.all_reduce_sum(checksums_.data(), checksums_.size());
    // 3. Rank 0 finishes the file. The file reaches the disk before its name, the name before
    //    `latest`, and `latest` before any older checkpoint is pruned: a crash at any point
    //    leaves `latest` naming a complete checkpoint.
    char err[1024] = {0};
    if (rank == 0) {
        errno = 0;
        try {
            for (size_t k = 0; k < datasets_; ++k) {
                int64_t as_i64;
                std::memcpy(&as_i64, &checksums_[k], 8);
                h5::Handle a = h5::attr(h5::check(H5Aopen(open_->datasets[k], "checksum", H5P_DEFAULT), "open checksum"));
                h5::check(H5Awrite(a, H5T_NATIVE_INT64, &as_i64), "write checksum");
            }
            open_->datasets.clear();
            h5::check(H5Fclose(open_->file.release()), "close " + tmp_path_);
            open_.reset();
            const fs::path dir = fs::path(final_path_).parent_path();
            sync_path(tmp_path_);
            fs::rename(tmp_path_, final_path_);
            sync_path(dir);
            write_text_atomically(dir / "latest", fs::path(final_path_).filename().string() + "\n");
            sync_path(dir);
            committed_ = true;
            std::vector<fs::path> all;
            for (auto& e : fs::directory_iterator(dir)) {
                auto n = e.path().filename().string();
                if (n.rfind("step_", 0) == 0 && e.path().extension() == ".h5") all.push_back(e.path());
                // A .tmp of a job killed while writing is never a checkpoint.
                if (n.rfind("step_", 0) == 0 && e.path().extension() == ".tmp") fs::remove(e.path());
            }
            std::sort(all.begin(), all.end());
            if (keep_ > 0)
                for (size_t i = 0; i + keep_ < all.size(); ++i) {
                    fs::remove(all[i]);
                    std::error_code ec;
                    fs::remove(checkpoint_metrics_path(all[i].string()), ec);
                }
        } catch (const std::exception& e) {
            const int e_no = errno;
            std::snprintf(err, sizeof err, "%s%s%s", e.what(), e_no ? "; " : "", e_no ? std::strerror(e_no) : "");
            if (!committed_) discard();
        }
    }
    comm_.broadcast(err, sizeof err, 0);
    committed_ = true;  // on every rank: nothing is left to discard
    if (err[0])
        throw IoError("the checkpoint of step " + std::to_string(step_) + " could not be completed (" + err +
                      "); the earlier checkpoints are intact (latest: " + checkpoint_latest(run_dir_) + ")");
    return final_path_;
}

void CheckpointWriter::discard() noexcept {
    if (comm_.rank() != 0) return;
    try {
        if (open_) {
            open_->datasets.clear();
            open_->file.reset();
            open_.reset();
        }
        std::error_code ec;
        fs::remove(tmp_path_, ec);
        if (!metrics_tmp_.empty()) fs::remove(metrics_tmp_, ec);
    } catch (...) {
    }
}

std::string checkpoint_save(const MpiCommunicator& comm, const std::string& run_dir, const CheckpointMeta& meta_in,
                            const ParamTable& table, const float* params, const std::vector<ArenaRange>& writes,
                            const OptimizerStateIo& state, int keep) {
    CheckpointMeta meta = meta_in;
    meta.optimizer = state.optimizer;
    std::vector<CheckpointSource> sources;
    for (const ArenaRange& w : writes) sources.push_back({w.arena, params + w.arena.lo});
    for (const ArenaRange& r : state.ranges)
        sources.push_back({r.arena, nullptr, state.exp_avg + r.state_index, state.exp_avg_sq + r.state_index});
    std::vector<CheckpointWhole> momentum;
    for (const auto& w : state.momentum) momentum.push_back({w.logical, w.data});
    CheckpointWriter writer(comm, run_dir, meta, table, std::move(sources), std::move(momentum), keep);
    return writer.commit(writer.write());
}

}  // namespace quintet
