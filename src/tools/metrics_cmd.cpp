// `quintet metrics RUN_DIR [--csv|--jsonl] [--group G]`: a run's metrics.h5 as text, for the
// tools that do not read HDF5 (spreadsheets, pandas without h5py, dashboards). One row per step
// (per evaluation for --group eval); columns are the group's datasets, a matrix dataset
// [step, i, j] spread into columns name.i.j. Runs without MPI; reads only.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <hdf5.h>

#include "quintet/core/error.hpp"
#include "quintet/core/text.hpp"
#include "quintet/io/h5.hpp"
#include "quintet/io/metrics_schema.hpp"
#include "quintet/tools/commands.hpp"

namespace quintet {

namespace {

namespace fs = std::filesystem;
namespace ms = metrics_schema;

const char* kUsage =
    "usage: quintet metrics RUN_DIR|METRICS.h5 [--csv | --jsonl] [--group GROUP]\n"
    "\n"
    "Prints the metrics of a run (its metrics.h5) as text: CSV (a header, then one row per step;\n"
    "the default) or JSON Lines (one object per step). GROUP: train (the default: loss, lr, grad\n"
    "norm, tokens/s, MFU, ...), eval (one row per evaluation; <source>/loss per validation source),\n"
    "timing (seconds and bytes per step), pipeline (idle fraction and activations per stage), moe\n"
    "(expert load, imbalance, ... per layer), memory (bytes by category per rank), data (samples\n"
    "drawn per training source), ranks (step time, compute and communication wait per rank),\n"
    "checkpoint (one row per checkpoint: seconds the step was blocked, seconds the write took).\n"
    "Matrix datasets become one column per element: moe's\n"
    "expert_load.<layer>.<expert>, memory's params_bytes.<rank>, data's source_samples.<name>\n"
    "(each training source by the name the file stores; by its index in files without names).\n";

struct Column {
    std::string name;
    std::vector<double> v;  // [rows * width]
    size_t width = 1;       // values per row
    std::vector<hsize_t> inner;
    std::vector<std::string> labels;  // one per value of a row, where the file names them
};

// The names of the training sources (/data/source_samples' attribute "sources", comma-separated),
// when there is one for each of `n` columns and no two are alike; else none.
std::vector<std::string> source_names(hid_t file, size_t n) {
    h5::Handle ds = h5::dataset(H5Dopen2(file, metrics_schema::kSourceSamples, H5P_DEFAULT));
    if (!ds.valid() || !h5::has_attr(ds, metrics_schema::kSourcesAttr)) return {};
    const std::string all = h5::read_attr_string(ds, metrics_schema::kSourcesAttr);
    std::vector<std::string> names;
    for (size_t at = 0; at <= all.size();) {
        const size_t comma = std::min(all.find(',', at), all.size());
        names.push_back(all.substr(at, comma - at));
        at = comma + 1;
    }
    std::vector<std::string> sorted = names;
    std::sort(sorted.begin(), sorted.end());
    const bool unique = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
    const bool empty = std::any_of(names.begin(), names.end(), [](const std::string& x) { return x.empty(); });
    return names.size() == n && unique && !empty ? names : std::vector<std::string>{};
}

// A header field as CSV writes it: quoted when it holds a comma, a quote or a line break.
std::string csv_field(const std::string& s) {
    if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
    std::string o = "\"";
    for (char c : s) o += c == '"' ? std::string("\"\"") : std::string(1, c);
    return o + "\"";
}

// The datasets directly in `group`, "step" first, then by name.
std::vector<std::string> datasets_in(hid_t file, const std::string& group) {
    std::vector<std::string> names;
    if (!h5::exists(file, group)) return names;
    h5::Handle g = h5::group(H5Gopen2(file, group.c_str(), H5P_DEFAULT));
    H5G_info_t info;
    if (H5Gget_info(g, &info) < 0) return names;
    for (hsize_t i = 0; i < info.nlinks; ++i) {
        char buf[256];
        if (H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, buf, sizeof buf, H5P_DEFAULT) < 0) continue;
        H5O_info_t oi;
        if (H5Oget_info_by_name2(g, buf, &oi, H5O_INFO_BASIC, H5P_DEFAULT) < 0) continue;
        if (oi.type == H5O_TYPE_DATASET) names.push_back(buf);
        // /eval/<source>/loss: each validation source's column, as <source>/loss.
        if (oi.type == H5O_TYPE_GROUP && group == ms::kEval)
            for (const auto& sub : datasets_in(file, group + "/" + buf)) names.push_back(std::string(buf) + "/" + sub);
    }
    std::stable_sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
        return (a == ms::kStep) > (b == ms::kStep);
    });
    return names;
}

std::string number(double x) {
    if (!std::isfinite(x)) return "";
    char b[40];
    std::snprintf(b, sizeof b, "%.10g", x);
    return b;
}

}  // namespace

int metrics_main(int argc, char** argv) {
    std::string where, format = "csv", group = "train";
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "-h" || a == "--help") {
            std::fputs(kUsage, stdout);
            return 0;
        }
        if (a == "--csv") format = "csv";
        else if (a == "--jsonl") format = "jsonl";
        else if (a == "--group" && i + 1 < argc) group = argv[++i];
        else if (a.rfind("--group=", 0) == 0) group = a.substr(8);
        else if (a.rfind("--", 0) == 0) throw ConfigError("metrics: unknown option '" + a + "' (see quintet metrics --help)");
        else if (where.empty()) where = a;
        else throw ConfigError("metrics: one RUN_DIR only ('" + where + "', then '" + a + "')");
    }
    if (where.empty()) throw ConfigError(std::string("metrics: no RUN_DIR given\n") + kUsage);
    const std::vector<std::string> groups = {"train", "eval",   "timing", "pipeline", "moe",
                                             "memory", "data", "ranks", "checkpoint"};
    if (std::find(groups.begin(), groups.end(), group) == groups.end())
        throw ConfigError("metrics: --group '" + group +
                          "': valid are train, eval, timing, pipeline, moe, memory, data, ranks, checkpoint");
    const bool own_steps = group == "train" || group == "eval" || group == "checkpoint";  // a step column of its own
    const fs::path file = fs::is_directory(where) ? fs::path(where) / "metrics.h5" : fs::path(where);
    if (!fs::exists(file)) throw ConfigError("metrics: '" + file.string() + "' does not exist (a run's output.run_dir holds metrics.h5)");
    h5::silence_errors();
    h5::Handle f = h5::file(H5Fopen(file.string().c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    if (!f.valid()) throw ConfigError("metrics: '" + file.string() + "' is not a readable HDF5 file");
    const std::string path = "/" + group;
    std::vector<Column> cols;
    // Rows are steps: every group but eval and checkpoint aligns with /train/step, which leads.
    if (!own_steps) {
        Column step{ms::kStep, h5::read_f64(f, ms::path(ms::kTrain, ms::kStep)), 1, {}};
        cols.push_back(step);
    }
    for (const std::string& name : datasets_in(f, path)) {
        Column c;
        c.name = name;
        std::vector<hsize_t> dims;
        c.v = h5::read_f64(f, path + "/" + name, &dims);
        for (size_t d = 1; d < dims.size(); ++d) c.width *= size_t(dims[d]), c.inner.push_back(dims[d]);
        // /data/source_samples: a column per training source, labelled with its name.
        if (path + "/" + name == ms::kSourceSamples && c.inner.size() == 1) c.labels = source_names(f, c.width);
        cols.push_back(std::move(c));
    }
    if (cols.empty() || (cols.size() == 1 && !own_steps))
        throw ConfigError("metrics: '" + file.string() + "' has no " + path + " (a run without that kind of data)");
    size_t rows = SIZE_MAX;
    for (const auto& c : cols) rows = std::min(rows, c.v.size() / c.width);
    // Column names, a matrix spread out as name.i[.j].
    std::vector<std::string> header;
    for (const auto& c : cols) {
        if (c.width == 1) {
            header.push_back(c.name);
            continue;
        }
        for (size_t k = 0; k < c.width; ++k) {
            if (!c.labels.empty()) {
                header.push_back(c.name + "." + c.labels[k]);
                continue;
            }
            std::string n = c.name;
            size_t rem = k;
            for (size_t d = 0; d < c.inner.size(); ++d) {
                size_t stride = 1;
                for (size_t e = d + 1; e < c.inner.size(); ++e) stride *= size_t(c.inner[e]);
                if (c.inner[d] > 1 || c.inner.size() == 1) n += "." + std::to_string(rem / stride);
                rem %= stride;
            }
            header.push_back(n);
        }
    }
    if (format == "csv") {
        for (size_t i = 0; i < header.size(); ++i) std::printf("%s%s", i ? "," : "", csv_field(header[i]).c_str());
        std::printf("\n");
    }
    for (size_t r = 0; r < rows; ++r) {
        size_t h = 0;
        std::string line = format == "jsonl" ? "{" : "";
        for (const auto& c : cols)
            for (size_t k = 0; k < c.width; ++k, ++h) {
                const std::string x = number(c.v[r * c.width + k]);
                if (format == "csv") line += (h ? "," : "") + x;
                else line += (h ? ", \"" : "\"") + json_escape(header[h]) + "\": " + (x.empty() ? "null" : x);
            }
        if (format == "jsonl") line += "}";
        std::printf("%s\n", line.c_str());
    }
    return 0;
}

}  // namespace quintet
