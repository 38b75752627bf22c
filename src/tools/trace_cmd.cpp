// `quintet trace RUN_DIR [-o FILE.json]`: the per-rank timelines a run wrote under
// train.trace_steps (run_dir/trace/rank<r>.json) merged into one Trace Event file -- one process
// per rank, named with its rank, host and grid coordinates, one thread per activity -- that
// Perfetto (ui.perfetto.dev) and chrome://tracing open; and a table of what each rank spent its
// traced steps on (docs/observability.md). Runs without MPI.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "quintet/core/error.hpp"
#include "quintet/tools/commands.hpp"

namespace quintet {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const char* kUsage =
    "usage: quintet trace RUN_DIR [-o FILE.json]\n"
    "\n"
    "Merges the timelines of a run trained with train.trace_steps = A-B (RUN_DIR/trace/rank<r>.json,\n"
    "one per rank) into one Chrome Trace Event file, default RUN_DIR/trace.json: one process per\n"
    "rank (\"rank 5 (node03, pp stage 1, tp 1)\"), one thread per activity -- step, compute, data,\n"
    "tp, cp, ep, pp, dp, zero, world, checkpoint. Open it in https://ui.perfetto.dev or\n"
    "chrome://tracing. Prints what each rank spent the traced steps on; the last line is\n"
    "`wrote FILE`. Files of another run (an earlier trace) are left out, and missing ranks named.\n";

struct RankFile {
    int rank = -1;
    fs::path path;
    json doc;
};

// The seconds per step a rank's events say: own compute (outermost compute events less their
// waits), and each other track's events.
struct Spent {
    double compute = 0;
    std::map<std::string, double> waits;
    std::set<int> steps;
};

Spent spent_of(const json& events) {
    Spent s;
    double compute_end = -1;  // the end of the outermost compute event seen last (nested ones end before)
    for (const json& e : events) {
        if (e.value("ph", "") != "X") continue;
        const std::string cat = e.value("cat", "");
        const double ts = e.value("ts", 0.0), dur = e.value("dur", 0.0);
        const json args = e.value("args", json::object());
        if (cat == "step") {
            if (e.value("name", "") == "step") s.steps.insert(args.value("step", 0));
            continue;
        }
        if (cat == "compute") {
            if (ts >= compute_end) {
                s.compute += (dur - args.value("wait_us", 0.0)) * 1e-6;
                compute_end = ts + dur;
            }
            continue;
        }
        if (cat == "checkpoint" && e.value("name", "") == "checkpoint") continue;  // its I/O waits count below
        s.waits[cat] += dur * 1e-6;
    }
    return s;
}

}  // namespace

int trace_main(int argc, char** argv) {
    std::string run_dir, out;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "-h" || a == "--help") {
            std::cout << kUsage;
            return 0;
        }
        if (a == "-o" || a == "--output") {
            if (i + 1 >= argc) throw ConfigError("trace: " + a + " needs a FILE.json");
            out = argv[++i];
        } else if (a.rfind("-", 0) == 0) {
            throw ConfigError("trace: unknown option '" + a + "' (valid: -o FILE.json)\n" + kUsage);
        } else if (run_dir.empty()) {
            run_dir = a;
        } else {
            throw ConfigError("trace: one RUN_DIR, got '" + run_dir + "' and '" + a + "'");
        }
    }
    if (run_dir.empty()) throw ConfigError(std::string("trace: no RUN_DIR given\n") + kUsage);
    const fs::path dir = fs::path(run_dir) / "trace";
    if (!fs::is_directory(dir))
        throw ConfigError("trace: '" + dir.string() + "' is not a folder: RUN_DIR has no timeline (train it with "
                          "train.trace_steps = A-B, e.g. --train.trace_steps=10-12)");
    if (out.empty()) out = (fs::path(run_dir) / "trace.json").string();
    const fs::path out_dir = fs::absolute(fs::path(out)).parent_path();
    if (!fs::is_directory(out_dir) || access(out_dir.c_str(), W_OK) != 0)
        throw ConfigError("trace: -o '" + out + "': its folder '" + out_dir.string() +
                          "' does not exist or cannot be written");

    // Every rank<r>.json, parsed; the newest run's kept.
    std::vector<RankFile> files;
    const std::regex name_re("rank([0-9]+)\\.json");
    for (const auto& entry : fs::directory_iterator(dir)) {
        std::smatch m;
        const std::string name = entry.path().filename().string();
        if (!std::regex_match(name, m, name_re)) continue;
        RankFile f;
        f.rank = std::stoi(m[1].str());
        f.path = entry.path();
        std::ifstream in(f.path);
        try {
            f.doc = json::parse(in);
        } catch (const std::exception& e) {
            throw ConfigError("trace: '" + f.path.string() + "' is not JSON (" + e.what() +
                              "): a rank's timeline cut short? Train the steps again to replace it");
        }
        if (!f.doc.is_object() || !f.doc.contains("traceEvents") || !f.doc["traceEvents"].is_array() ||
            !f.doc.contains("otherData"))
            throw ConfigError("trace: '" + f.path.string() + "' is not a timeline quintet wrote (no traceEvents and "
                              "otherData)");
        files.push_back(std::move(f));
    }
    if (files.empty())
        throw ConfigError("trace: no rank<r>.json in '" + dir.string() + "' (train with train.trace_steps = A-B)");
    std::sort(files.begin(), files.end(), [](const RankFile& a, const RankFile& b) { return a.rank < b.rank; });
    long long run_id = 0;
    for (const RankFile& f : files) run_id = std::max(run_id, f.doc["otherData"].value("run_id", 0LL));
    std::vector<RankFile> kept;
    std::string stale;
    for (RankFile& f : files) {
        if (f.doc["otherData"].value("run_id", 0LL) == run_id) kept.push_back(std::move(f));
        else stale += (stale.empty() ? "" : ", ") + f.path.filename().string();
    }
    if (!stale.empty())
        std::cerr << "quintet trace: warning: left out " << stale << ": from an earlier traced run of this run_dir\n";
    const json& first = kept.front().doc["otherData"];
    const int world = first.value("world", int(kept.size()));
    std::string missing;
    {
        std::set<int> have;
        for (const RankFile& f : kept) have.insert(f.rank);
        for (int r = 0; r < world; ++r)
            if (!have.count(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    if (!missing.empty())
        std::cerr << "quintet trace: warning: no timeline of rank(s) " << missing << " of " << world
                  << " (a rank that failed before the end of its window, or a folder another node cannot see)\n";

    // One document: every rank's metadata and events, in rank order.
    json merged = json::object();
    json& events = merged["traceEvents"] = json::array();
    json ranks = json::array();
    size_t n_events = 0;
    std::printf("quintet trace: %zu of %d rank(s), steps %s, layout %s\n", kept.size(), world,
                first.contains("steps") ? (first["steps"][0].dump() + "-" + first["steps"][1].dump()).c_str() : "?",
                first.value("layout", std::string("?")).c_str());
    std::set<std::string> tracks;
    std::vector<Spent> spent;
    for (const RankFile& f : kept) {
        spent.push_back(spent_of(f.doc["traceEvents"]));
        for (const auto& [t, s] : spent.back().waits) tracks.insert(t);
    }
    // The table: seconds per step of each rank.
    std::string header = "  rank  compute ms/step";
    const std::vector<std::string> order = {"data", "tp", "cp", "ep", "pp", "dp", "zero", "world", "checkpoint"};
    std::vector<std::string> shown;
    for (const std::string& t : order)
        if (tracks.count(t)) shown.push_back(t), header += "  " + t + " wait";
    std::printf("what each rank spent a step on (ms; waits are time blocked, per activity):\n%s  process\n",
                header.c_str());
    for (size_t i = 0; i < kept.size(); ++i) {
        const Spent& s = spent[i];
        const double n = std::max<size_t>(1, s.steps.size());
        std::printf("  %4d  %15.2f", kept[i].rank, 1e3 * s.compute / n);
        for (const std::string& t : shown) {
            const auto it = s.waits.find(t);
            std::printf("  %*.2f", int(t.size() + 5), it == s.waits.end() ? 0.0 : 1e3 * it->second / n);
        }
        std::string pname;
        for (const json& e : kept[i].doc["traceEvents"])
            if (e.value("ph", "") == "M" && e.value("name", "") == "process_name")
                pname = e["args"].value("name", std::string());
        std::printf("  %s\n", pname.c_str());
    }
    for (RankFile& f : kept) {
        for (json& e : f.doc["traceEvents"]) events.push_back(std::move(e));
        n_events += f.doc["traceEvents"].size();
        ranks.push_back(std::move(f.doc["otherData"]));
    }
    merged["displayTimeUnit"] = "ms";
    merged["otherData"] = {{"world", world}, {"ranks", std::move(ranks)},
                           {"clock", "each rank's steady clock, zero where the ranks left a common barrier"}};
    const std::string tmp = out + ".tmp" + std::to_string(getpid());
    {
        std::ofstream o(tmp);
        o << merged.dump() << "\n";
        o.close();
        if (!o) {
            std::error_code ec;
            fs::remove(tmp, ec);
            throw ConfigError("trace: cannot write '" + tmp + "' (disk full?)");
        }
    }
    fs::rename(tmp, out);
    std::printf("%zu events; open it in https://ui.perfetto.dev or chrome://tracing\nwrote %s\n", n_events, out.c_str());
    return 0;
}

}  // namespace quintet
