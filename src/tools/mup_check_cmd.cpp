// quintet mup-check: the coordinate check of µP (docs/scaling-laws.md). Trains the deck's model at
// several widths for a few steps at one learning rate and reports the RMS of each kind of layer
// output per step (train.probe_rms): under µP the curves stay flat as the width grows, under the
// standard parametrisation they grow. No MPI here: each width is a `quintet train` process.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "quintet/core/error.hpp"
#include "quintet/core/lists.hpp"
#include "quintet/core/process.hpp"
#include "quintet/deck/deck.hpp"
#include "quintet/io/h5.hpp"
#include "quintet/model/probe.hpp"
#include "quintet/tools/commands.hpp"
#include "quintet/tools/python.hpp"

namespace quintet {

namespace fs = std::filesystem;

namespace {

const char* kUsage =
    "usage: quintet mup-check DECK --widths W1,W2,... [--steps S] [--scheme standard|mup] [--json]\n"
    "                         [-o PLOT.png] [--keep DIR] [--section.key=value ...]\n"
    "Trains the deck's model at each width (d_model) for S steps (default 5) at the deck's train.lr,\n"
    "held constant (no warm-up, no decay), and prints the RMS of each kind of layer output per step:\n"
    "embedding, attn_logits, attn_out, ffn_out, residual, output_logits. Under µP the RMS does not\n"
    "grow with the width; under the standard parametrisation it does.\n"
    "  --widths W1,W2,...   the widths; each width keeps the deck's head dim (n_heads = W / head dim),\n"
    "                       its query-to-kv-head ratio and the ratios of its FFN, expert and MLA ranks\n"
    "                       to d_model\n"
    "  --scheme mup         init.scheme = mup with init.base_width = the deck's, else the smallest width;\n"
    "  --scheme standard    init.scheme = scaled (the standard parametrisation); default: the deck's\n"
    "  --json               stdout: a JSON list of {\"width\", \"step\", \"kind\", \"rms\"}\n"
    "  -o PLOT.png          RMS against width, one panel per kind, one line per step (matplotlib)\n"
    "  --keep DIR           keep the runs in DIR (default: a temporary folder, removed)\n"
    "Other --section.key=value arguments go to every run (e.g. --train.lr=1e-2 --data.path=...).\n";

struct Point {
    int width, step;
    int kind;
    double rms;
};

// The width's overrides: d_model, heads at the deck's head dim and q/kv ratio, and every width
// that scales with d_model at the deck's ratio to it.
std::vector<std::string> shape_overrides(const Deck& d, int w) {
    const ModelConfig& m = d.model;
    const int hd = m.head_dim();
    if (hd <= 0 || w % hd != 0)
        throw ConfigError("mup-check: --widths " + std::to_string(w) + ": not a multiple of the deck's head dim " +
                          std::to_string(hd) + " (d_model / n_heads)");
    const int heads = w / hd, kv = m.n_kv_heads > 0 ? m.n_kv_heads : m.n_heads;
    if ((heads * kv) % m.n_heads != 0)
        throw ConfigError("mup-check: --widths " + std::to_string(w) + ": " + std::to_string(heads) +
                          " heads cannot keep the deck's ratio of " + std::to_string(m.n_heads) + " heads to " +
                          std::to_string(kv) + " kv heads");
    auto scaled = [&](int x) { return std::max(1, int(std::lround(double(x) * w / m.d_model))); };
    std::vector<std::string> o = {"--model.d_model=" + std::to_string(w), "--model.n_heads=" + std::to_string(heads),
                                  "--model.ffn_dim=" + std::to_string(scaled(m.ffn_width()))};
    if (m.attention != "mla") o.push_back("--model.n_kv_heads=" + std::to_string(heads * kv / m.n_heads));
    if (m.moe.experts > 0) o.push_back("--moe.ffn_dim=" + std::to_string(scaled(m.expert_ffn_width())));
    if (m.attention == "mla") {
        o.push_back("--model.kv_lora_rank=" + std::to_string(scaled(m.kv_lora_rank)));
        if (m.q_lora_rank > 0) o.push_back("--model.q_lora_rank=" + std::to_string(scaled(m.q_lora_rank)));
    }
    return o;
}

std::vector<double> read_probe(const std::string& run, const char* kind) {
    const std::string path = run + "/metrics.h5";
    h5::Handle f = h5::file(h5::check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), path));
    return h5::read_f64(f, std::string("/probe/") + kind);
}

std::string json_of(const std::vector<Point>& pts) {
    std::ostringstream o;
    o.precision(9);
    o << "[";
    for (size_t i = 0; i < pts.size(); ++i)
        o << (i ? ",\n " : "") << "{\"width\": " << pts[i].width << ", \"step\": " << pts[i].step << ", \"kind\": \""
          << kProbeNames[size_t(pts[i].kind)] << "\", \"rms\": " << (std::isfinite(pts[i].rms) ? pts[i].rms : 0.0) << "}";
    o << "]\n";
    return o.str();
}

}  // namespace

int mup_check_main(int argc, char** argv) {
    std::string deck_path, scheme, plot, keep;
    std::vector<int> widths;
    int steps = 5;
    bool json = false;
    std::vector<std::string> overrides;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) throw ConfigError("mup-check: " + a + " needs a value\n" + kUsage);
            return argv[++i];
        };
        if (a == "--help" || a == "-h") {
            std::printf("%s", kUsage);
            return 0;
        } else if (a == "--widths") {
            const std::string v = value();
            const auto list = parse_int_list(v);
            if (!list || list->size() < 2 || std::any_of(list->begin(), list->end(), [](int w) { return w < 1; }))
                throw ConfigError("mup-check: --widths '" + v + "': expected two or more positive integers, comma-separated");
            widths = *list;
            std::sort(widths.begin(), widths.end());
            if (std::adjacent_find(widths.begin(), widths.end()) != widths.end())
                throw ConfigError("mup-check: --widths '" + v + "': a width is listed twice");
        } else if (a == "--steps") {
            const std::string v = value();
            try {
                steps = std::stoi(v);
            } catch (...) {
                steps = 0;
            }
            if (steps < 1 || steps > 100000 || std::to_string(steps) != v)
                throw ConfigError("mup-check: --steps '" + v + "': expected an integer in [1, 100000]");
        } else if (a == "--scheme") {
            scheme = value();
            if (scheme != "standard" && scheme != "mup")
                throw ConfigError("mup-check: --scheme '" + scheme + "': expected standard or mup");
        } else if (a == "--json") {
            json = true;
        } else if (a == "-o") {
            plot = value();
        } else if (a == "--keep") {
            keep = value();
        } else if (a.rfind("--", 0) == 0 && a.find('=') != std::string::npos) {
            overrides.push_back(a);
        } else if (deck_path.empty() && a.rfind("-", 0) != 0) {
            deck_path = a;
        } else {
            throw ConfigError("mup-check: unknown argument '" + a + "'\n" + kUsage);
        }
    }
    if (deck_path.empty()) throw ConfigError(std::string("mup-check: no deck given\n") + kUsage);
    if (widths.empty()) throw ConfigError(std::string("mup-check: --widths is required\n") + kUsage);
    if (!plot.empty() && !fs::is_directory(fs::absolute(plot).parent_path()))
        throw ConfigError("mup-check: -o '" + plot + "': the folder " + fs::absolute(plot).parent_path().string() +
                          " does not exist");
    const Deck deck = deck_load(deck_path, overrides);  // every error of the deck now, before any run
    for (int w : widths) (void)shape_overrides(deck, w);
    const std::string python = plot.empty() ? "" : plotting_python();
    std::vector<std::string> common = overrides;
    const bool mup = scheme == "mup" || (scheme.empty() && deck.init.scheme == "mup");
    if (scheme == "standard") common.push_back("--init.scheme=scaled");
    if (mup) {
        common.push_back("--init.scheme=mup");
        const int base = deck.init.base_width > 0 ? deck.init.base_width : widths.front();
        common.push_back("--init.base_width=" + std::to_string(base));
    }
    for (const std::string& o : {"--train.steps=" + std::to_string(steps), std::string("--train.warmup=0"),
                                 "--train.lr_min=" + std::to_string(deck.train.lr), std::string("--train.probe_rms=true"),
                                 std::string("--eval.every=0"), std::string("--checkpoint.every=0"),
                                 std::string("--checkpoint.keep=1"), std::string("--checkpoint.resume=none"),
                                 "--output.log_every=" + std::to_string(steps)})
        common.push_back(o);
    // A fresh folder for the runs: temporary unless --keep names one (which must not hold runs).
    fs::path dir;
    if (keep.empty()) {
        char tmpl[] = "/tmp/quintet_mup_check_XXXXXX";
        if (!mkdtemp(tmpl)) throw ConfigError("mup-check: cannot create a temporary folder in /tmp");
        dir = tmpl;
    } else {
        dir = keep;
        if (fs::exists(dir) && !fs::is_empty(dir))
            throw ConfigError("mup-check: --keep '" + keep + "': the folder exists and is not empty");
        fs::create_directories(dir);
    }
    std::vector<Point> pts;
    for (int w : widths) {
        const std::string run = (dir / ("width_" + std::to_string(w))).string();
        std::vector<std::string> args = {self_exe(), "train", deck_path};
        for (const auto& o : common) args.push_back(o);
        for (const auto& o : shape_overrides(deck, w)) args.push_back(o);
        args.push_back("--output.run_dir=" + run);
        if (!json) std::fprintf(stderr, "mup-check: width %d ...\n", w);
        const int rc = run_process(args, run + ".log");
        if (rc != 0)
            throw ConfigError("mup-check: the run at width " + std::to_string(w) + " exited " + std::to_string(rc) +
                              " (its log: " + run + ".log)");
        for (int k = 0; k < kNumProbeKinds; ++k) {
            const std::vector<double> v = read_probe(run, kProbeNames[size_t(k)]);
            for (size_t s = 0; s < v.size(); ++s) pts.push_back({w, int(s) + 1, k, v[s]});
        }
    }
    if (json) {
        std::printf("%s", json_of(pts).c_str());
    } else {
        std::printf("coordinate check: %s, init.scheme = %s, lr %g held for %d steps; RMS of each kind of output\n",
                    deck_path.c_str(), mup ? "mup" : (scheme == "standard" ? "scaled" : deck.init.scheme.c_str()),
                    deck.train.lr, steps);
        std::printf("%-14s %5s", "kind", "step");
        for (int w : widths) std::printf(" %11s", ("width " + std::to_string(w)).c_str());
        std::printf("  %s\n", "growth");
        for (int k = 0; k < kNumProbeKinds; ++k)
            for (int s = 1; s <= steps; ++s) {
                std::printf("%-14s %5d", kProbeNames[size_t(k)], s);
                std::vector<double> row;
                for (int w : widths)
                    for (const Point& p : pts)
                        if (p.width == w && p.step == s && p.kind == k) row.push_back(p.rms);
                for (double x : row) std::printf(" %11.4g", x);
                // The slope of log RMS against log width (0: flat, 1: grows as the width).
                double sx = 0, sy = 0, sxx = 0, sxy = 0;
                int n = 0;
                for (size_t i = 0; i < row.size() && i < widths.size(); ++i)
                    if (row[i] > 0 && std::isfinite(row[i])) {
                        const double x = std::log(double(widths[i])), y = std::log(row[i]);
                        sx += x, sy += y, sxx += x * x, sxy += x * y, ++n;
                    }
                const double slope = n >= 2 ? (n * sxy - sx * sy) / (n * sxx - sx * sx) : std::nan("");
                std::printf("  %+.2f\n", slope);
            }
        std::printf("(growth: the slope of log RMS against log width; µP keeps it near 0 at every step)\n");
    }
    if (!plot.empty()) {
        const std::string data = (dir / "mup_check.json").string();
        std::ofstream(data) << json_of(pts);
        const std::string tmp = plot + ".tmp.png";
        const int rc = run_process({python, project_script("plot_mup_check.py"), data, tmp});
        if (rc != 0) {
            fs::remove(tmp);
            throw ConfigError("mup-check: plot_mup_check.py exited " + std::to_string(rc) + "; no " + plot + " written");
        }
        fs::rename(tmp, plot);
        if (!json) std::printf("wrote %s\n", plot.c_str());
    }
    if (keep.empty()) fs::remove_all(dir);
    return 0;
}

}  // namespace quintet
