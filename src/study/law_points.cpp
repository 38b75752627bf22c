#include "quintet/study/law_points.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "quintet/core/error.hpp"
#include "quintet/core/lists.hpp"
#include "quintet/io/h5.hpp"

namespace quintet {

namespace fs = std::filesystem;

namespace {

std::string trim(const std::string& s) {
    const auto a = s.find_first_not_of(" \t\r");
    if (a == std::string::npos) return "";
    return s.substr(a, s.find_last_not_of(" \t\r") - a + 1);
}

std::vector<std::string> cells(const std::string& line) {
    std::vector<std::string> out;
    size_t at = 0;
    while (true) {
        const size_t c = line.find(',', at);
        out.push_back(trim(line.substr(at, c == std::string::npos ? std::string::npos : c - at)));
        if (c == std::string::npos) return out;
        at = c + 1;
    }
}

LawInput read_csv(const std::string& path) {
    std::ifstream f(path);
    if (!f) throw ConfigError("laws: cannot read '" + path + "'");
    LawInput in;
    in.loss = "loss";
    std::string line;
    int row = 0;
    std::map<std::string, size_t> col;
    std::vector<std::string> header;
    while (std::getline(f, line)) {
        ++row;
        const std::string t = trim(line);
        if (t.empty() || t[0] == '#') continue;
        header = cells(t);
        break;
    }
    if (header.empty()) throw ConfigError("laws: '" + path + "' is empty (a CSV needs a header row naming its columns: N, loss, and D or C)");
    for (size_t i = 0; i < header.size(); ++i) {
        if (header[i].empty()) continue;
        if (col.count(header[i])) throw ConfigError("laws: '" + path + "': column '" + header[i] + "' is named twice in the header");
        col[header[i]] = i;
    }
    std::vector<std::string> missing;
    if (!col.count("N")) missing.push_back("N");
    if (!col.count("loss")) missing.push_back("loss");
    if (!col.count("D") && !col.count("C")) missing.push_back("D or C");
    if (!missing.empty()) {
        std::string m, h;
        for (const auto& x : missing) m += (m.empty() ? "" : ", ") + x;
        for (const auto& x : header) h += (h.empty() ? "" : ", ") + x;
        throw ConfigError("laws: '" + path + "' has no column " + m + " (its header names: " + h +
                          "); a CSV needs N, loss, and D or C (= 6 N D), and may have budget, run and status");
    }
    int data_rows = 0;
    while (std::getline(f, line)) {
        ++row;
        const std::string t = trim(line);
        if (t.empty() || t[0] == '#') continue;
        ++data_rows;
        const auto c = cells(t);
        if (c.size() != header.size())
            throw ConfigError("laws: '" + path + "' line " + std::to_string(row) + ": " + std::to_string(c.size()) +
                              " cells, the header has " + std::to_string(header.size()));
        auto number = [&](const std::string& name) {
            const std::string& v = c[col.at(name)];
            char* end = nullptr;
            const double x = std::strtod(v.c_str(), &end);
            if (v.empty() || *end || !std::isfinite(x) || !(x > 0))
                throw ConfigError("laws: '" + path + "' line " + std::to_string(row) + ": " + name + " = '" + v +
                                  "': expected a finite positive number" +
                                  (name == "loss" ? " (a run that failed: give it a status column saying failed, or leave the row out)"
                                                  : ""));
            return x;
        };
        LawPoint p;
        p.run = col.count("run") ? c[col.at("run")] : "line " + std::to_string(row);
        if (col.count("status")) {
            const std::string s = c[col.at("status")];
            if (s != "done" && s != "ok" && !s.empty()) {
                in.excluded.push_back({p.run, "status " + s});
                continue;
            }
        }
        p.N = number("N");
        p.loss = number("loss");
        if (col.count("D")) p.D = number("D");
        if (col.count("C")) p.C = number("C");
        if (p.D == 0) p.D = p.C / (6.0 * p.N);
        if (p.C == 0) p.C = 6.0 * p.N * p.D;
        if (col.count("budget")) p.budget = number("budget");
        in.points.push_back(p);
    }
    if (data_rows == 0) throw ConfigError("laws: '" + path + "' has a header but no rows");
    if (!col.count("budget")) assign_budgets(in.points);
    return in;
}

LawInput read_study_h5(const std::string& path, const std::string& loss, const std::string& params_in) {
    h5::silence_errors();
    h5::Handle f = h5::file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    if (!f.valid()) throw ConfigError("laws: cannot open '" + path + "' as HDF5");
    if (!h5::has_attr(f, "laws_params") || !h5::exists(f, "/runs"))
        throw ConfigError("laws: '" + path + "' holds no scaling-law runs (a study deck with a [laws] section writes them; "
                          "or give a CSV with columns N, loss, and D or C)");
    LawInput in;
    in.params = params_in.empty() ? h5::read_attr_string(f, "laws_params") : params_in;
    if (h5::has_attr(f, "laws_family")) in.family = h5::read_attr_string(f, "laws_family");
    if (loss != "val" && loss != "train") throw ConfigError("laws: --loss = '" + loss + "': expected val or train");
    in.loss = loss == "val" ? "final validation loss" : "smoothed final training loss";
    const std::string n_key = in.params == "total" ? "N_total" : in.params == "non_embedding" ? "N_non_embedding" : "N_active";
    if (in.params != "total" && in.params != "non_embedding" && in.params != "active")
        throw ConfigError("laws: --params = '" + in.params + "': expected total, non_embedding or active");
    for (const std::string& name : h5::child_names(f, "/runs")) {
        h5::Handle g = h5::group(H5Gopen2(f, ("/runs/" + name).c_str(), H5P_DEFAULT));
        if (!g.valid() || !h5::has_attr(g, "budget")) continue;
        const std::string status = h5::has_attr(g, "status") ? h5::read_attr_string(g, "status") : "done";
        if (status != "done") {
            const int64_t rc = h5::has_attr(g, "exit_status") ? h5::read_attr_i64(g, "exit_status") : -1;
            in.excluded.push_back({name, status + (rc >= 0 ? " (exit status " + std::to_string(rc) + ")" : "")});
            continue;
        }
        LawPoint p;
        p.run = name;
        p.budget = h5::read_attr_f64(g, "budget");
        p.N = h5::read_attr_f64(g, n_key);
        p.D = h5::read_attr_f64(g, "D");
        p.C = 6.0 * p.N * p.D;
        p.loss = h5::read_attr_f64(g, loss == "val" ? "val_loss" : "train_loss_smoothed");
        if (!std::isfinite(p.loss) || !(p.loss > 0)) {
            in.excluded.push_back({name, "no finite " + in.loss + (loss == "val" ? " (did it evaluate? eval.batches > 0)" : "")});
            continue;
        }
        in.points.push_back(p);
    }
    if (h5::has_attr(f, "laws_missing"))
        for (const auto& m : split_list(h5::read_attr_string(f, "laws_missing"), ','))
            in.excluded.push_back({m, "not finished (no study_done yet)"});
    return in;
}

}  // namespace

void assign_budgets(std::vector<LawPoint>& points) {
    std::vector<size_t> order(points.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return points[a].C < points[b].C; });
    for (size_t i = 0; i < order.size();) {
        size_t j = i;
        double logsum = 0;
        while (j < order.size() && points[order[j]].C <= 1.1 * points[order[i]].C) logsum += std::log(points[order[j]].C), ++j;
        const double budget = std::exp(logsum / double(j - i));
        for (size_t k = i; k < j; ++k) points[order[k]].budget = budget;
        i = j;
    }
}

LawInput read_law_input(const std::string& path_in, const std::string& loss, const std::string& params) {
    std::string path = path_in;
    if (fs::is_directory(path)) path = (fs::path(path) / "study.h5").string();
    if (!fs::exists(path)) throw ConfigError("laws: INPUT '" + path_in + "': no such file (a study.h5, a study folder or a CSV)");
    h5::silence_errors();
    if (H5Fis_hdf5(path.c_str()) > 0) return read_study_h5(path, loss, params);
    if (params.size()) throw ConfigError("laws: --params applies to a study.h5 (a CSV's N is what its N column says)");
    if (loss != "val") throw ConfigError("laws: --loss applies to a study.h5 (a CSV's loss is its loss column)");
    return read_csv(path);
}

}  // namespace quintet
