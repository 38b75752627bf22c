#include "quintet/study/law_json.hpp"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "quintet/core/error.hpp"

namespace quintet {

using nlohmann::ordered_json;

namespace {

ordered_json number(double v) { return std::isfinite(v) ? ordered_json(v) : ordered_json(nullptr); }

ordered_json interval(const Interval& iv) {
    return ordered_json{{"value", number(iv.value)}, {"ci_low", number(iv.lo)}, {"ci_high", number(iv.hi)}};
}

ordered_json point(const LawPoint& p, const LawParams& law) {
    const double pred = law_loss(law, p.N, p.D);
    return ordered_json{{"run", p.run},   {"N", p.N},           {"D", p.D},
                        {"C", p.C},       {"budget", p.budget}, {"loss", p.loss},
                        {"predicted", number(pred)}, {"residual", number(std::log(p.loss) - std::log(pred))}};
}

}  // namespace

std::string law_json(const LawReport& r) {
    const ParametricFit& f = r.fit;
    ordered_json j;
    j["E"] = interval(f.E), j["A"] = interval(f.A), j["B"] = interval(f.B);
    j["alpha"] = interval(f.alpha), j["beta"] = interval(f.beta);
    j["a"] = interval(f.a), j["b"] = interval(f.b), j["G"] = interval(f.G);
    ordered_json pts = ordered_json::array();
    for (const auto& p : r.input.points) pts.push_back(point(p, f.p));
    j["points"] = pts;
    ordered_json held = ordered_json::array();
    for (const auto& p : r.heldout) held.push_back(point(p, f.p));
    j["heldout"] = held;
    ordered_json ex = ordered_json::array();
    for (const auto& [run, why] : r.input.excluded) ex.push_back({{"run", run}, {"reason", why}});
    j["excluded"] = ex;
    j["params"] = r.input.params.empty() ? ordered_json(nullptr) : ordered_json(r.input.params);
    j["loss"] = r.input.loss;
    j["family"] = r.input.family.empty() ? ordered_json(nullptr) : ordered_json(r.input.family);
    j["fit"] = {{"objective", f.objective}, {"huber_delta", r.options.huber_delta}, {"starts", f.starts},
                {"confidence", r.options.confidence}, {"bootstrap", r.options.bootstrap}, {"replicates", f.replicates},
                {"seed", r.options.seed}};
    ordered_json iso;
    iso["a"] = interval(r.isoflop.a), iso["b"] = interval(r.isoflop.b);
    iso["ok"] = r.isoflop.ok;
    if (!r.isoflop.ok) iso["why"] = r.isoflop.why;
    iso["log_kN"] = number(r.isoflop.ok ? r.isoflop.log_kN : NAN), iso["log_kD"] = number(r.isoflop.ok ? r.isoflop.log_kD : NAN);
    ordered_json budgets = ordered_json::array();
    for (const auto& b : r.isoflop.budgets) {
        ordered_json o{{"C", b.C}, {"points", b.points}, {"parabola", {b.parabola[0], b.parabola[1], b.parabola[2]}}, {"ok", b.ok}, {"used", b.used}};
        if (b.ok) o["N_opt"] = b.N_opt, o["D_opt"] = b.D_opt, o["loss_opt"] = b.loss_opt;
        else o["why"] = b.why;
        budgets.push_back(o);
    }
    iso["budgets"] = budgets;
    j["isoflop"] = iso;
    ordered_json warnings = ordered_json::array();
    for (const auto& w : f.warnings) warnings.push_back(w);
    for (const auto& w : r.isoflop.warnings) warnings.push_back(w);
    j["warnings"] = warnings;
    ordered_json samples = ordered_json::array();
    for (const auto& s : f.samples) samples.push_back({s[0], s[1], s[2], s[3], s[4]});
    j["bootstrap_samples"] = samples;  // each [E, A, B, alpha, beta]
    return j.dump(1) + "\n";
}

LawFile read_law_file(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw ConfigError("--law '" + path + "': cannot read it (a JSON file written by quintet laws --json)");
    ordered_json j;
    try {
        j = ordered_json::parse(in);
    } catch (const std::exception& e) {
        throw ConfigError("--law '" + path + "': not JSON: " + e.what());
    }
    LawFile law;
    auto value = [&](const char* key) {
        if (!j.is_object() || !j.contains(key) || !j[key].is_object() || !j[key].contains("value") || !j[key]["value"].is_number())
            throw ConfigError("--law '" + path + "': no number at " + key + ".value (a law file from quintet laws --json has E, A, "
                              "B, alpha, beta, a, b, each {\"value\", \"ci_low\", \"ci_high\"})");
        const double v = j[key]["value"].get<double>();
        if (!std::isfinite(v)) throw ConfigError("--law '" + path + "': " + key + ".value is not finite");
        return v;
    };
    law.p = {value("E"), value("A"), value("B"), value("alpha"), value("beta")};
    if (!(law.p.A > 0 && law.p.B > 0 && law.p.alpha > 0 && law.p.beta > 0))
        throw ConfigError("--law '" + path + "': A, B, alpha and beta must be positive for a compute-optimal allocation "
                          "(the file has A = " + std::to_string(law.p.A) + ", B = " + std::to_string(law.p.B) + ", alpha = " +
                          std::to_string(law.p.alpha) + ", beta = " + std::to_string(law.p.beta) + ")");
    if (j.contains("params") && j["params"].is_string()) law.params = j["params"].get<std::string>();
    if (j.contains("family") && j["family"].is_string()) law.family = j["family"].get<std::string>();
    if (j.contains("fit") && j["fit"].is_object() && j["fit"].contains("confidence") && j["fit"]["confidence"].is_number())
        law.confidence = j["fit"]["confidence"].get<double>();
    if (j.contains("bootstrap_samples") && j["bootstrap_samples"].is_array())
        for (const auto& s : j["bootstrap_samples"]) {
            if (!s.is_array() || s.size() != 5) continue;
            std::array<double, 5> v{};
            bool ok = true;
            for (size_t k = 0; k < 5; ++k) {
                ok = ok && s[k].is_number();
                if (ok) v[k] = s[k].get<double>();
            }
            if (ok) law.samples.push_back(v);
        }
    return law;
}

}  // namespace quintet
