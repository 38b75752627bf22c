#include "quintet/study/study_deck.hpp"

#include <boost/program_options.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "quintet/core/error.hpp"
#include "quintet/core/lists.hpp"
#include "quintet/deck/deck.hpp"

namespace quintet {

namespace fs = std::filesystem;
namespace po = boost::program_options;

namespace {

std::vector<int> int_list(const std::string& key, const std::string& s) {
    if (split_list(s, ',').empty()) throw ConfigError("study deck key '" + key + "' is empty");
    const auto v = parse_int_list(s);
    if (!v || std::any_of(v->begin(), v->end(), [](int n) { return n < 1; }))
        throw ConfigError("study deck key '" + key + "' = '" + s + "': expected positive integers, comma-separated");
    return *v;
}

const std::set<std::string> kLayoutKeys = {"tp", "cp", "pp", "ep", "dp", "zero", "microbatches", "sequence_parallel",
                                           "schedule", "virtual_stages"};

}  // namespace

Study read_study(const std::string& path) {
    Study st;
    st.deck_path = path;
    std::ifstream f(path);
    if (!f) throw ConfigError("study: cannot read the study deck '" + path + "'");
    std::stringstream buf;
    buf << f.rdbuf();
    st.text = buf.str();
    std::istringstream in(st.text);
    po::options_description none;
    po::parsed_options parsed = po::parse_config_file(in, none, /*allow_unregistered=*/true);
    std::map<std::string, std::string> kv;
    for (const auto& o : parsed.options) {
        if (o.value.empty()) continue;
        if (kv.count(o.string_key)) throw ConfigError("study deck key '" + o.string_key + "' is given twice");
        kv[o.string_key] = o.value[0];
    }
    std::map<std::string, std::string> laws;
    for (const auto& [k, v] : kv) {
        if (k.rfind("laws.", 0) == 0) {
            laws[k.substr(5)] = v;
        } else if (k.rfind("vary.", 0) == 0) {
            const std::string key = k.substr(5);
            Deck probe;
            bool known = false;
            for (auto& o : deck_options(probe))
                if (o.key == key) {
                    known = true;
                    for (const auto& x : split_list(v, ',')) o.set(x);  // checked as the deck would
                }
            if (!known) throw ConfigError("study deck key '" + k + "': '" + key + "' is not a deck key (see quintet deck --reference)");
            st.vary.push_back({key, split_list(v, ',')});
        } else if (k == "study.base") st.base = v;
        else if (k == "study.dir") st.dir = v;
        else if (k == "study.worlds") st.worlds = int_list(k, v);
        else if (k == "study.threads") st.threads = int_list(k, v);
        else if (k == "study.seeds") {
            for (int s : int_list(k, v)) st.seeds.push_back(s);
        } else if (k == "study.scaling") {
            if (v != "strong" && v != "weak" && v != "none")
                throw ConfigError("study deck key 'study.scaling' = '" + v + "': expected strong, weak or none");
            st.scaling = v;
        } else if (k == "study.global_batch") st.global_batch = int_list(k, v).at(0);
        else if (k == "study.steps") st.steps = int_list(k, v).at(0);
        else if (k == "study.mpirun_flags") st.mpirun_flags = v;
        else if (k == "study.sbatch_flags") st.sbatch_flags = v;
        else if (k == "study.layouts") {
            st.layouts.clear();
            for (const auto& l : split_list(v, ';')) {
                std::map<std::string, std::string> m;
                for (auto item : split_list(l, ' ')) {
                    for (const auto& kvp : split_list(item, ',')) {
                        const auto eq = kvp.find('=');
                        const std::string key = kvp.substr(0, eq);
                        if (eq == std::string::npos || !kLayoutKeys.count(key))
                            throw ConfigError("study deck key 'study.layouts' = '" + v + "': '" + kvp +
                                              "' is not KEY=VALUE with KEY one of tp cp pp ep dp zero microbatches "
                                              "sequence_parallel schedule virtual_stages");
                        m[key] = kvp.substr(eq + 1);
                    }
                }
                st.layouts.push_back(m);
            }
            if (st.layouts.empty()) throw ConfigError("study deck key 'study.layouts' is empty");
        } else {
            throw ConfigError("study deck key '" + k + "' is not known (see quintet study --help)");
        }
    }
    if (st.base.empty()) throw ConfigError("study deck '" + path + "': [study] base = DECK is required");
    if (!laws.empty()) {
        st.laws = read_laws_section(laws);
        // A law compares shapes and budgets on one footing: one layout, world and thread count.
        auto one = [&](const char* key, size_t n) {
            if (n > 1)
                throw ConfigError(std::string("study deck key 'study.") + key + "' lists " + std::to_string(n) +
                                  " values: a [laws] study runs every (budget, shape) the same way, so give one");
        };
        one("worlds", st.worlds.size()), one("threads", st.threads.size()), one("layouts", st.layouts.size());
        if (!st.vary.empty())
            throw ConfigError("study deck: [vary] with [laws]: a law's runs differ only in budget and shape (give the "
                              "other keys in the base deck or the shapes)");
        if (kv.count("study.steps"))
            throw ConfigError("study deck key 'study.steps': a [laws] study derives each run's steps from its budget");
        if (st.scaling != "none")
            throw ConfigError("study deck key 'study.scaling' = '" + st.scaling + "': not with [laws] (the global batch is the base deck's "
                              "or study.global_batch)");
    }
    const fs::path beside = fs::path(path).parent_path() / st.base;
    if (!fs::exists(st.base) && fs::exists(beside)) st.base = beside.string();
    if (!fs::exists(st.base)) throw ConfigError("study deck key 'study.base' = '" + st.base + "': no such file");
    if (st.dir.empty()) st.dir = "runs/study_" + fs::path(path).stem().string();
    return st;
}

std::string study_deck_for_dir(const Study& st) {
    std::istringstream in(st.text);
    std::ostringstream o;
    std::string line;
    while (std::getline(in, line)) {
        const auto a = line.find_first_not_of(" \t");
        if (a != std::string::npos && line.compare(a, 4, "base") == 0 &&
            line.find('=', a) != std::string::npos && line.substr(a + 4, line.find('=', a) - a - 4).find_first_not_of(" \t") == std::string::npos)
            line = "base = " + fs::absolute(st.base).string();
        o << line << "\n";
    }
    return o.str();
}

}  // namespace quintet
