#include "quintet/io/metrics.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <cstring>
#include <cerrno>
#include <cmath>
#include <ctime>
#include <filesystem>

#include "quintet/core/error.hpp"
#include "quintet/io/metrics_schema.hpp"

namespace fs = std::filesystem;

namespace quintet {

namespace {
// Whether the history in `path` reads: the file opens and /train/step (if any) reads whole.
bool readable(const std::string& path) {
    hid_t fid = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (fid < 0) return false;
    h5::Handle f = h5::file(fid);
    if (!h5::exists(f, metrics_schema::path(metrics_schema::kTrain, metrics_schema::kStep))) return true;
    hid_t d = H5Dopen2(f, metrics_schema::path(metrics_schema::kTrain, metrics_schema::kStep).c_str(), H5P_DEFAULT);
    if (d < 0) return false;
    h5::Handle ds = h5::dataset(d);
    std::vector<double> v(h5::dataset_shape(ds)[0]);
    return v.empty() || H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) >= 0;
}

// Whether the history in `path` reaches step `first_step` with strictly increasing /train/step
// rows. A job killed between extending the datasets and writing their rows can leave a row of
// zeros (the fill value) in the middle; trimming by step would keep it.
bool consistent(const std::string& path, long first_step) {
    h5::Handle f = h5::file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    if (!f.valid()) return false;
    if (!h5::exists(f, metrics_schema::path(metrics_schema::kTrain, metrics_schema::kStep))) return true;  // nothing to align with
    const std::vector<double> v = h5::read_f64(f, metrics_schema::path(metrics_schema::kTrain, metrics_schema::kStep));
    double prev = 0;
    for (double x : v) {
        if (!(x > prev)) return false;
        if (x == double(first_step)) return true;
        if (x > double(first_step)) return false;
        prev = x;
    }
    return v.empty() ? true : false;
}

std::string aside(const std::string& path, const char* why) {
    std::string to = path + "." + why + "-" + std::to_string(std::time(nullptr));
    std::error_code ec;
    fs::rename(path, to, ec);
    return ec ? path + " (could not be moved: " + ec.message() + ")" : to;
}
}  // namespace

MetricsFile::MetricsFile(const std::string& run_dir, const std::string& deck_text, long first_step,
                         const std::string& snapshot) {
    h5::silence_errors();
    fs::create_directories(run_dir);
    std::string path = (fs::path(run_dir) / "metrics.h5").string();
    if (fs::exists(path) && first_step == 0) {
        // A fresh run: the old history is kept, not overwritten.
        warnings.push_back("a fresh run in " + run_dir + ": the existing metrics.h5 is kept as " +
                           aside(path, "previous"));
    } else if (fs::exists(path) && !readable(path)) {
        warnings.push_back("metrics.h5 is unreadable (a write was interrupted?): kept as " + aside(path, "unreadable") +
                           (snapshot.empty() || !fs::exists(snapshot) ? "; no copy in the checkpoint: the history restarts here"
                                                                       : "; the history is rebuilt from " + snapshot));
    } else if (fs::exists(path) && first_step > 0 && !snapshot.empty() && fs::exists(snapshot) &&
               !consistent(path, first_step)) {
        warnings.push_back("metrics.h5 does not hold steps 1.." + std::to_string(first_step) +
                           " in order (a write was interrupted?): kept as " + aside(path, "inconsistent") +
                           "; the history is rebuilt from " + snapshot);
    }
    if (first_step > 0 && !fs::exists(path) && !snapshot.empty() && fs::exists(snapshot)) {
        fs::copy_file(snapshot, path);
        if (warnings.empty()) warnings.push_back("metrics.h5 is missing: the history is rebuilt from " + snapshot);
    }
    bool keep = first_step > 0 && fs::exists(path);
    hid_t fid = keep ? H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT) : -1;
    if (fid < 0) {
        keep = false;
        fid = h5::check(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, h5::file_create_plist(), H5P_DEFAULT), "create " + path);
    }
    file_ = h5::file(fid);
    h5::write_attr_string(file_, "deck", deck_text);
    if (!keep) return;
    // Drop rows of steps >= first_step in every group that has a "step" column.
    // /eval and /checkpoint have their own step column; /timing (and /timing/op), /pipeline,
    // /moe and /memory rows align with /train's. (A group's subgroups are skipped: they are
    // listed themselves.)
    for (const char* group : metrics_schema::kStepGroups) {
        const std::string own = metrics_schema::path(group, metrics_schema::kStep);
        const std::string steps = h5::exists(file_, own) ? own : metrics_schema::path(metrics_schema::kTrain, metrics_schema::kStep);
        if (!h5::exists(file_, steps) || !h5::exists(file_, group)) continue;
        h5::Handle ds = h5::dataset(H5Dopen2(file_, steps.c_str(), H5P_DEFAULT));
        auto shape = h5::dataset_shape(ds);
        std::vector<double> v(shape.empty() ? 0 : shape[0]);
        if (!v.empty()) H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
        // Rows up to first_step while the steps increase: a job killed after extending the
        // datasets but before their data reached the file leaves a row of zeros, which ends
        // the kept history (its step, 0, does not increase).
        hsize_t keep_rows = 0;
        double prev = -1;
        while (keep_rows < v.size() && v[keep_rows] <= first_step && v[keep_rows] > prev) prev = v[keep_rows++];
        // Every dataset of the group, and under /eval those of its per-source subgroups.
        std::function<void(const std::string&, bool)> trim = [&](const std::string& gpath, bool into_subgroups) {
            h5::Handle g = h5::group(H5Gopen2(file_, gpath.c_str(), H5P_DEFAULT));
            H5G_info_t info;
            H5Gget_info(g, &info);
            for (hsize_t i = 0; i < info.nlinks; ++i) {
                char name[256];
                H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT);
                H5O_info_t oi;
                if (H5Oget_info_by_name2(g, name, &oi, H5O_INFO_BASIC, H5P_DEFAULT) < 0) continue;
                if (oi.type == H5O_TYPE_GROUP) {
                    if (into_subgroups) trim(gpath + "/" + name, false);
                    continue;
                }
                h5::Handle d = h5::dataset(H5Dopen2(g, name, H5P_DEFAULT));
                auto dims = h5::dataset_shape(d);  // [step, ...]: keep the trailing dims
                if (dims.empty()) continue;
                std::vector<hsize_t> ext(dims.begin(), dims.end());
                ext[0] = std::min<hsize_t>(keep_rows, ext[0]);
                H5Dset_extent(d, ext.data());
            }
        };
        trim(group, group == std::string(metrics_schema::kEval));
    }
}

MetricsFile::~MetricsFile() {
    open_.clear();
    if (file_.valid()) H5Fflush(file_, H5F_SCOPE_GLOBAL);
}

hid_t MetricsFile::extendible(const std::string& path, const std::vector<hsize_t>& inner, hsize_t chunk_rows) {
    auto it = open_.find(path);
    if (it != open_.end()) return it->second;
    hid_t id;
    if (h5::exists(file_, path)) {
        id = H5Dopen2(file_, path.c_str(), H5P_DEFAULT);
    } else {
        h5::Handle g = h5::group(h5::create_groups(file_, path.substr(0, path.rfind('/'))));
        std::vector<hsize_t> dims{0}, maxdims{H5S_UNLIMITED}, chunk{chunk_rows};
        for (hsize_t d : inner) dims.push_back(d), maxdims.push_back(d), chunk.push_back(d);
        h5::Handle sp = h5::space(H5Screate_simple(int(dims.size()), dims.data(), maxdims.data()));
        h5::Handle dcpl = h5::dataset_create_plist();
        H5Pset_chunk(dcpl, int(chunk.size()), chunk.data());
        const bool is_step = path.size() >= 5 && path.compare(path.size() - 5, 5, "/step") == 0;
        id = H5Dcreate2(file_, path.c_str(), is_step ? H5T_STD_I64LE : H5T_IEEE_F64LE, sp, H5P_DEFAULT,
                        dcpl, H5P_DEFAULT);
    }
    return open_.emplace(path, h5::dataset(h5::check(id, "metrics dataset " + path))).first->second;
}

void MetricsFile::set_attr(const std::string& path, const std::string& name, const std::string& value) {
    h5::Handle obj(h5::check(H5Oopen(file_, path.c_str(), H5P_DEFAULT), "open " + path), H5Oclose);
    if (h5::has_attr(obj, name)) H5Adelete(obj, name.c_str());
    h5::write_attr_string(obj, name, value);
}

void MetricsFile::append_value(const std::string& path, double v) {
    hid_t ds = extendible(path, {}, 256);
    hsize_t n = h5::dataset_shape(ds)[0], one = 1, newn = n + 1;
    h5::check(H5Dset_extent(ds, &newn), "extend " + path);
    h5::Handle fs = h5::space(H5Dget_space(ds));
    H5Sselect_hyperslab(fs, H5S_SELECT_SET, &n, nullptr, &one, nullptr);
    h5::Handle ms = h5::space(H5Screate_simple(1, &one, nullptr));
    h5::check(H5Dwrite(ds, H5T_NATIVE_DOUBLE, ms, fs, H5P_DEFAULT, &v), "write " + path);
}

void MetricsFile::append(const std::string& group,
                         const std::vector<std::pair<std::string, double>>& row) {
    for (auto& [name, v] : row) append_value(group + "/" + name, v);
}

void MetricsFile::append_matrix(const std::string& path, const std::vector<double>& v, int rows, int cols) {
    append_slab(path, v, {hsize_t(rows), hsize_t(cols)});
}

void MetricsFile::append_vector(const std::string& path, const std::vector<double>& v) {
    append_slab(path, v, {hsize_t(v.size())});
}

void MetricsFile::append_slab(const std::string& path, const std::vector<double>& v, const std::vector<hsize_t>& inner) {
    hsize_t n = 1;
    for (hsize_t d : inner) n *= d;
    QUINTET_CHECK(v.size() == n, "metrics: slab of the wrong size for " + path);
    hid_t ds = extendible(path, inner, 16);
    auto shape = h5::dataset_shape(ds);
    if (shape.size() != inner.size() + 1 || !std::equal(inner.begin(), inner.end(), shape.begin() + 1)) {
        // A run resumed on another layout (/moe/ep_tokens has one column per ep rank, /memory/*
        // one per rank): the history moves to <path>_<d1>x<d2>... of its shape, and the new
        // dataset starts with NaN rows for those steps, so its rows stay aligned with /train/step.
        const hsize_t before = shape.empty() ? 0 : shape[0];
        std::string old = path;
        for (size_t i = 1; i < std::max<size_t>(shape.size(), 2); ++i)
            old += (i == 1 ? "_" : "x") + std::to_string(i < shape.size() ? shape[i] : 0);
        open_.erase(path);
        if (h5::exists(file_, old)) H5Ldelete(file_, old.c_str(), H5P_DEFAULT);
        h5::check(H5Lmove(file_, path.c_str(), file_, old.c_str(), H5P_DEFAULT, H5P_DEFAULT), "move " + path);
        ds = extendible(path, inner, 16);
        std::vector<double> nan(v.size(), std::nan(""));
        for (hsize_t i = 0; i < before; ++i) append_slab(path, nan, inner);
        shape = h5::dataset_shape(ds);
    }
    const int rank = int(inner.size()) + 1;
    std::vector<hsize_t> start(size_t(rank), 0), count(size_t(rank), 1), ext(size_t(rank), 0);
    start[0] = shape[0];
    ext[0] = shape[0] + 1;
    for (size_t i = 0; i < inner.size(); ++i) count[i + 1] = ext[i + 1] = inner[i];
    h5::check(H5Dset_extent(ds, ext.data()), "extend " + path);
    h5::Handle fs = h5::space(H5Dget_space(ds));
    H5Sselect_hyperslab(fs, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
    h5::Handle ms = h5::space(H5Screate_simple(rank, count.data(), nullptr));
    h5::check(H5Dwrite(ds, H5T_NATIVE_DOUBLE, ms, fs, H5P_DEFAULT, v.data()), "write " + path);
}

std::vector<double> MetricsFile::read_all(const std::string& path) {
    std::vector<double> v;
    if (!h5::exists(file_, path)) return v;
    hid_t ds = extendible(path, {}, 1);  // opened (not created: it exists)
    size_t n = 1;
    for (hsize_t d : h5::dataset_shape(ds)) n *= size_t(d);
    v.resize(n);
    if (n) h5::check(H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), "read " + path);
    return v;
}

std::string MetricsFile::snapshot_to(const std::string& to, bool durable) {
    flush();
    ssize_t size = 0;
    H5Fget_filesize(file_, reinterpret_cast<hsize_t*>(&size));
    char name[4096];
    H5Fget_name(file_, name, sizeof name);
    const std::string tmp = to + ".tmp";
    std::error_code ec;
    fs::create_directories(fs::path(to).parent_path(), ec);
    // A plain read/write copy, so a full disk is reported as such (the kernel's in-place copy
    // calls said "Input/output error" on a full tmpfs).
    {
        const int in = ::open(name, O_RDONLY | O_CLOEXEC);
        const int out = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        std::string why = in < 0 || out < 0 ? std::strerror(errno) : "";
        std::vector<char> buf(size_t(1) << 20);
        while (why.empty()) {
            const ssize_t n = ::read(in, buf.data(), buf.size());
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                if (n < 0) why = std::strerror(errno);
                break;
            }
            for (ssize_t done = 0; why.empty() && done < n;) {
                const ssize_t w = ::write(out, buf.data() + done, size_t(n - done));
                if (w < 0 && errno == EINTR) continue;
                if (w <= 0) why = std::strerror(w < 0 ? errno : ENOSPC);
                else done += w;
            }
        }
        if (why.empty() && durable && ::fsync(out) != 0) why = std::strerror(errno);
        if (in >= 0) ::close(in);
        if (out >= 0 && ::close(out) != 0 && why.empty()) why = std::strerror(errno);
        if (!why.empty()) {
            fs::remove(tmp, ec);
            throw IoError("cannot copy the metrics to " + tmp + ": " + why);
        }
    }
    if (!durable) return tmp;
    fs::rename(tmp, to, ec);
    if (ec) throw IoError("cannot rename " + tmp + ": " + ec.message());
    return to;
}

void MetricsFile::flush() { H5Fflush(file_, H5F_SCOPE_GLOBAL); }

}  // namespace quintet
