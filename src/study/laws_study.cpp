#include "quintet/study/laws_study.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "quintet/core/error.hpp"
#include "quintet/core/lists.hpp"
#include "quintet/perf/inventory.hpp"

namespace quintet {

namespace {

double positive(const std::string& key, const std::string& v) {
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end || !std::isfinite(x) || !(x > 0))
        throw ConfigError(key + " = '" + v + "': expected a positive number");
    return x;
}

int positive_int(const std::string& key, const std::string& v) {
    const double x = positive(key, v);
    if (x != std::floor(x) || x > 1e9) throw ConfigError(key + " = '" + v + "': expected a positive integer");
    return int(x);
}

// A deck key of a shape: "d_model" means model.d_model; "moe.experts" is itself. Checked as the deck would.
std::string shape_key(const std::string& key, const std::string& value, const std::string& where) {
    const std::string full = key.find('.') == std::string::npos ? "model." + key : key;
    Deck probe;
    for (auto& o : deck_options(probe))
        if (o.key == full) {
            try {
                o.set(value);
            } catch (const ConfigError& e) {
                throw ConfigError(where + ": " + e.what());
            }
            return full;
        }
    throw ConfigError(where + ": '" + key + "' is not a deck key (a shape sets model keys such as d_model, n_layers, "
                      "n_heads, n_kv_heads, ffn_dim; see quintet deck --reference)");
}

std::string shape_name(const std::vector<std::pair<std::string, std::string>>& keys, size_t index) {
    std::string name;
    for (const auto& [k, v] : keys) {
        if (k == "model.d_model") name += "d" + v;
        else if (k == "model.n_layers") name += "l" + v;
        else if (k == "model.n_heads") name += "h" + v;
        else continue;
        name += "_";
    }
    if (name.empty()) return "s" + std::to_string(index);
    name.pop_back();
    return name;
}

}  // namespace

std::string Shape::text() const {
    std::string t;
    for (const auto& [k, v] : keys) t += (t.empty() ? "" : " ") + k + "=" + v;
    return t;
}

FamilyRule parse_family(const std::string& text, const std::string& key) {
    FamilyRule r;
    r.text = text;
    for (const auto& item : split_list(text, ' ')) {
        const auto eq = item.find('=');
        const std::string k = item.substr(0, eq), v = eq == std::string::npos ? "" : item.substr(eq + 1);
        const std::string where = key + " = '" + text + "': " + k;
        if (eq == std::string::npos || v.empty())
            throw ConfigError(key + " = '" + text + "': '" + item +
                              "' is not KEY=VALUE with KEY one of widths aspect head_dim ffn_ratio q_per_kv");
        if (k == "widths") {
            const auto w = parse_int_list(v);
            if (!w || std::any_of(w->begin(), w->end(), [](int x) { return x < 1; }))
                throw ConfigError(where + " = '" + v + "': expected positive integers, comma-separated");
            r.widths = *w;
        } else if (k == "aspect") r.aspect = positive(where, v);
        else if (k == "head_dim") r.head_dim = positive_int(where, v);
        else if (k == "ffn_ratio") r.ffn_ratio = positive(where, v);
        else if (k == "q_per_kv") r.q_per_kv = positive_int(where, v);
        else
            throw ConfigError(key + " = '" + text + "': '" + k + "' is not a family key (widths aspect head_dim ffn_ratio q_per_kv)");
    }
    return r;
}

Shape family_shape(const FamilyRule& rule, const Deck& base, int width) {
    const ModelConfig& m = base.model;
    const double aspect = rule.aspect > 0 ? rule.aspect : double(m.d_model) / m.n_layers;
    const int head_dim = rule.head_dim > 0 ? rule.head_dim : m.d_model / m.n_heads;
    const int base_kv = m.n_kv_heads > 0 ? m.n_kv_heads : m.n_heads;
    const int q_per_kv = rule.q_per_kv > 0 ? rule.q_per_kv : std::max(1, m.n_heads / base_kv);
    const std::string where = "family '" + rule.text + "', width " + std::to_string(width);
    if (width % head_dim != 0)
        throw ConfigError(where + ": not a multiple of head_dim = " + std::to_string(head_dim) + " (n_heads = width / head_dim)");
    const int heads = width / head_dim;
    if (heads % q_per_kv != 0)
        throw ConfigError(where + ": its " + std::to_string(heads) + " heads are not a multiple of q_per_kv = " +
                          std::to_string(q_per_kv));
    const int layers = std::max(1, int(std::lround(width / aspect)));
    Shape s;
    s.keys = {{"model.d_model", std::to_string(width)}, {"model.n_layers", std::to_string(layers)},
              {"model.n_heads", std::to_string(heads)}, {"model.n_kv_heads", std::to_string(heads / q_per_kv)}};
    const double ratio = rule.ffn_ratio > 0 ? rule.ffn_ratio : m.ffn_dim > 0 ? double(m.ffn_dim) / m.d_model : -1;
    // A base ffn_dim of 0 stays 0: the model's own default (8/3 d_model rounded up to 64) then scales with it.
    s.keys.push_back({"model.ffn_dim", ratio > 0 ? std::to_string(std::max(8L, 8 * std::lround(ratio * width / 8))) : "0"});
    s.name = "d" + std::to_string(width) + "_l" + std::to_string(layers);
    return s;
}

std::vector<Shape> family_candidates(const FamilyRule& rule, const Deck& base) {
    std::vector<Shape> out;
    if (!rule.widths.empty()) {
        for (int w : rule.widths) out.push_back(family_shape(rule, base, w));
        return out;
    }
    const ModelConfig& m = base.model;
    const int head_dim = rule.head_dim > 0 ? rule.head_dim : m.d_model / m.n_heads;
    const int base_kv = m.n_kv_heads > 0 ? m.n_kv_heads : m.n_heads;
    const int q_per_kv = rule.q_per_kv > 0 ? rule.q_per_kv : std::max(1, m.n_heads / base_kv);
    for (int w = head_dim * q_per_kv; w <= 65536; w += head_dim * q_per_kv) out.push_back(family_shape(rule, base, w));
    return out;
}

std::vector<Shape> parse_shapes(const std::string& text, const std::string& key) {
    std::vector<Shape> shapes;
    size_t i = 0;
    for (const auto& one : split_list(text, ';')) {
        Shape sh;
        for (const auto& item : split_list(one, ' ')) {
            const auto eq = item.find('=');
            if (eq == std::string::npos)
                throw ConfigError(key + ": '" + item + "' is not KEY=VALUE (e.g. d_model=128 n_layers=4 n_heads=4)");
            const std::string value = item.substr(eq + 1);
            sh.keys.push_back({shape_key(item.substr(0, eq), value, key), value});
        }
        sh.name = shape_name(sh.keys, i++);
        shapes.push_back(sh);
    }
    if (shapes.empty()) throw ConfigError(key + " is empty: ';'-separated shapes, e.g. d_model=64 n_layers=2; d_model=128 n_layers=4");
    return shapes;
}

double ParamCounts::of(const std::string& kind) const {
    return kind == "total" ? total : kind == "non_embedding" ? non_embedding : active;
}

ParamCounts count_params(const ModelConfig& m) {
    const ModelCounts c = model_counts(m);
    ParamCounts p;
    p.total = c.total, p.active = c.active;
    const double table = double(m.vocab_size) * m.d_model;  // the embedding, and the LM head unless tied
    p.non_embedding = c.total - table * (m.tie_embeddings ? 1 : 2);
    return p;
}

std::string LawsSpec::family_text() const {
    if (!family.text.empty()) return family.text;
    std::string t;
    for (const auto& s : shapes) t += (t.empty() ? "" : "; ") + s.text();
    return t;
}

LawsSpec read_laws_section(const std::map<std::string, std::string>& kv) {
    LawsSpec s;
    s.present = true;
    for (const auto& [k, v] : kv) {
        const std::string key = "study deck key 'laws." + k + "'";
        if (k == "budgets") {
            for (const auto& b : split_list(v, ',')) s.budgets.push_back(positive(key, b));
            if (s.budgets.empty()) throw ConfigError(key + " is empty: list the FLOP budgets, e.g. budgets = 1e13, 3e13, 1e14");
            std::sort(s.budgets.begin(), s.budgets.end());
            if (std::adjacent_find(s.budgets.begin(), s.budgets.end()) != s.budgets.end())
                throw ConfigError(key + " = '" + v + "': a budget is listed twice");
        } else if (k == "shapes") {
            s.shapes = parse_shapes(v, key);
        } else if (k == "family") {
            s.family = parse_family(v, "study deck key 'laws.family'");
            if (s.family.widths.empty()) throw ConfigError(key + " = '" + v + "': a study's family needs widths=W1,W2,...");
        } else if (k == "params") {
            if (v != "total" && v != "non_embedding" && v != "active")
                throw ConfigError(key + " = '" + v + "': expected total, non_embedding or active");
            s.params = v;
        } else if (k == "smooth") {
            s.smooth = positive(key, v);
            if (s.smooth > 1) throw ConfigError(key + " = '" + v + "': a fraction of the steps, in (0, 1]");
        } else if (k == "warmup_fraction") {
            char* end = nullptr;
            s.warmup_fraction = std::strtod(v.c_str(), &end);
            if (v.empty() || *end || !(s.warmup_fraction >= 0 && s.warmup_fraction < 1))
                throw ConfigError(key + " = '" + v + "': a fraction of each run's steps, in [0, 1)");
        } else {
            throw ConfigError(key + " is not known (budgets, shapes or family, params, smooth, warmup_fraction; see quintet study --help)");
        }
    }
    if (s.budgets.empty()) throw ConfigError("study deck: [laws] needs budgets = C1, C2, ... (FLOPs, C = 6 N D)");
    if (s.shapes.empty() == s.family.text.empty())
        throw ConfigError("study deck: [laws] needs exactly one of shapes = ... (a list) and family = ... (a rule)");
    if (!s.shapes.empty()) {
        for (size_t i = 0; i < s.shapes.size(); ++i)
            for (size_t j = i + 1; j < s.shapes.size(); ++j)
                if (s.shapes[i].name == s.shapes[j].name) s.shapes[j].name += "_s" + std::to_string(j);
    }
    return s;
}

double smoothed_final(const std::vector<double>& loss, double fraction) {
    std::vector<std::pair<double, double>> pts;
    for (size_t i = 0; i < loss.size(); ++i)
        if (std::isfinite(loss[i])) pts.push_back({double(i), loss[i]});
    if (pts.empty()) return std::nan("");
    const size_t n = std::min(pts.size(), std::max<size_t>(5, size_t(std::ceil(fraction * double(loss.size())))));
    pts.erase(pts.begin(), pts.end() - long(n));
    if (n < 3) {
        double s = 0;
        for (const auto& p : pts) s += p.second;
        return s / double(n);
    }
    double mx = 0, my = 0;
    for (const auto& [x, y] : pts) mx += x, my += y;
    mx /= double(n), my /= double(n);
    double sxx = 0, sxy = 0;
    for (const auto& [x, y] : pts) sxx += (x - mx) * (x - mx), sxy += (x - mx) * (y - my);
    const double slope = sxy / sxx;
    return my + slope * (double(loss.size() - 1) - mx);
}

std::string budget_tag(double C) {
    char b[32];
    std::snprintf(b, sizeof b, "%.3g", C);
    std::string s = b;
    // 1e+13 -> 1e13, 3.2e+14 -> 3.2e14
    const auto e = s.find("e+");
    if (e != std::string::npos) s.erase(e + 1, 1);
    while (s.find("e0") != std::string::npos) s.erase(s.find("e0") + 1, 1);
    return "C" + s;
}

}  // namespace quintet
