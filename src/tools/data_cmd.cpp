// `quintet data verify|inspect|stats` (docs/data.md, "quintet data"): a corpus checked whole
// against its manifest, a training sample decoded exactly as the trainer draws it, and what each
// source of a blend gives over a run. No MPI: one process reads the files.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "quintet/core/checksum.hpp"
#include "quintet/core/error.hpp"
#include "quintet/data/corpus_manifest.hpp"
#include "quintet/data/dataset.hpp"
#include "quintet/data/sampler.hpp"
#include "quintet/deck/deck.hpp"
#include "quintet/io/checkpoint.hpp"
#include "quintet/io/token_data.hpp"
#include "quintet/parallel/layout.hpp"
#include "quintet/tools/commands.hpp"

namespace quintet {
namespace {
namespace fs = std::filesystem;

const char* kUsage =
    "usage: quintet data verify PATH...                 a corpus directory (or token file) read whole: its\n"
    "                                                   manifest, every shard's tokens and checksum, the tokenizer\n"
    "       quintet data stats DECK [--steps N] [--world W] [--section.key=value ...]\n"
    "                                                   per source of data.path: tokens, documents, weight, and\n"
    "                                                   the samples and epochs a run of N steps takes from it\n"
    "       quintet data inspect DECK (--sample N | --step S [--rank R --world W]) [--ids] [--section.key=value ...]\n"
    "                                                   a training sample (N = step * global batch + j) decoded\n"
    "                                                   exactly as the trainer draws it; --step S --rank R: every\n"
    "                                                   sample rank R trains on at step S\n"
    "The blend is the one of the deck's output.run_dir when it holds a checkpoint (weights changed on\n"
    "a resume included), else the deck's weights.\n";

[[noreturn]] void usage_error(const std::string& what) {
    throw ConfigError("quintet data: " + what + "\n" + kUsage);
}

// One corpus directory or token file read whole; the problems found, "" when none.
std::vector<std::string> verify_path(const std::string& path, std::string& summary) {
    std::vector<std::string> problems;
    std::error_code ec;
    if (!fs::exists(path, ec)) return {"'" + path + "' does not exist"};
    if (!fs::is_directory(path, ec)) {  // one token file: read and checked whole
        try {
            const TokenFile f = token_file_read(path);
            summary = path + ": a token file of " + std::to_string(f.tokens.size()) + " tokens, tokenizer " +
                      f.tokenizer.describe();
        } catch (const std::exception& e) {
            problems.push_back(e.what());
        }
        return problems;
    }
    bool found = false;
    CorpusManifest m;
    try {
        m = manifest_read(path, found);
    } catch (const std::exception& e) {
        return {e.what()};
    }
    if (!found) {
        const bool interrupted = fs::exists(fs::path(path) / ".prepare", ec);
        return {"'" + path + "' has no manifest.json: not a complete corpus" +
                (interrupted ? " (an interrupted prepare: run it again with --resume)" : "")};
    }
    if (const std::string why = manifest_disagreement(path, m); !why.empty()) problems.push_back(why);
    Tokenizer tok;
    try {
        tok = corpus_tokenizer_read((fs::path(path) / m.tokenizer_file).string(), m.tokenizer_fingerprint);
        if (tok.vocab_size() != m.vocab_size)
            problems.push_back("the tokenizer has vocab_size " + std::to_string(tok.vocab_size()) + ", the manifest says " +
                               std::to_string(m.vocab_size));
    } catch (const std::exception& e) {
        problems.push_back(e.what());
        return problems;
    }
    int64_t tokens = 0;
    for (const auto& s : m.shards) {
        const std::string file = (fs::path(path) / s.file).string();
        if (!fs::exists(file, ec)) continue;  // named by manifest_disagreement
        try {
            const TokenFileHeader h = token_file_header(file);
            if (h.n_tokens != s.tokens || h.file_offset != s.offset || h.width != m.width ||
                h.tokenizer.fingerprint() != tok.fingerprint())
                problems.push_back("shard '" + file + "': its header (" + std::to_string(h.n_tokens) + " tokens at byte " +
                                   std::to_string(h.file_offset) + ") disagrees with the manifest (" +
                                   std::to_string(s.tokens) + " at byte " + std::to_string(s.offset) + ")");
        } catch (const std::exception& e) {
            problems.push_back(e.what());
            continue;
        }
        const std::string why = shard_verify({file, s.tokens, m.width, s.offset, s.checksum}, m.vocab_size);
        if (!why.empty()) problems.push_back(why);
        tokens += s.tokens;
    }
    summary = path + ": complete, " + std::to_string(m.shards.size()) + " shard(s), " + std::to_string(tokens) +
              " tokens, " + std::to_string(m.documents) + " document(s), tokenizer " + tok.describe() +
              ", every checksum verified";
    return problems;
}

int verify_main(const std::vector<std::string>& args) {
    if (args.empty()) usage_error("verify needs a corpus directory or token file");
    int bad = 0;
    for (const auto& path : args) {
        std::string summary;
        const auto problems = verify_path(path, summary);
        for (const auto& p : problems) std::cout << "data verify: " << p << "\n";
        if (problems.empty()) std::cout << "data verify: " << summary << "\n";
        else ++bad, std::cout << "data verify: '" << path << "': " << problems.size() << " problem(s)\n";
    }
    return bad ? 2 : 0;
}

struct DeckArgs {
    std::string deck;
    std::vector<std::string> overrides;
    int64_t steps = -1, sample = -1, step = -1;
    int rank = -1, world = 1;
    bool ids = false;
};

int64_t parse_int(const std::string& flag, const std::string& v, int64_t lo) {
    char* end = nullptr;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end || x < lo) usage_error(flag + " = '" + v + "': expected an integer >= " + std::to_string(lo));
    return x;
}

DeckArgs parse_deck_args(const std::vector<std::string>& args) {
    DeckArgs a;
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string& s = args[i];
        auto value = [&](const std::string& flag) {
            if (i + 1 >= args.size()) usage_error(flag + " needs a value");
            return args[++i];
        };
        if (s == "--steps") a.steps = parse_int(s, value(s), 0);
        else if (s == "--sample") a.sample = parse_int(s, value(s), 0);
        else if (s == "--step") a.step = parse_int(s, value(s), 0);
        else if (s == "--rank") a.rank = int(parse_int(s, value(s), 0));
        else if (s == "--world") a.world = int(parse_int(s, value(s), 1));
        else if (s == "--ids") a.ids = true;
        else if (s.rfind("--", 0) == 0 && s.find('.') != std::string::npos) a.overrides.push_back(s);
        else if (a.deck.empty() && s.rfind("--", 0) != 0) a.deck = s;
        else usage_error("unexpected argument '" + s + "'");
    }
    if (a.deck.empty()) usage_error("needs a DECK (the run's deck: its [data] section and train.seed)");
    return a;
}

// The blend of the deck's run: its latest checkpoint's segments (weights changed on a resume)
// when output.run_dir holds one that matches the sources, else the deck's weights from sample 0.
std::vector<BlendSegment> run_blend(const Deck& deck, const DataSet& data, std::string& note) {
    std::vector<double> w;
    for (const auto& s : data.train) w.push_back(s.weight >= 0 ? s.weight : double(s.len));
    std::vector<BlendSegment> segs{{0, w}};
    const std::string latest = checkpoint_latest(deck.output.run_dir);
    if (latest.empty() || data.train.size() < 2) return segs;
    try {
        const auto stored = blend_segments_parse(checkpoint_read_meta(latest).blend);
        if (!stored.empty() && stored[0].weights.size() == w.size()) {
            note = "the blend of " + latest + " (" + std::to_string(stored.size()) + " segment(s))";
            return stored;
        }
    } catch (const std::exception&) {
    }
    return segs;
}

int stats_main(const std::vector<std::string>& args) {
    const DeckArgs a = parse_deck_args(args);
    Deck deck = deck_load(a.deck, a.overrides);
    const DataSet data = data_open(deck.data);
    const int64_t G = deck_global_batch(deck, a.world), steps = a.steps >= 0 ? a.steps : deck.train.steps;
    const int T = deck.data.seq_len;
    std::string note;
    Blend blend(run_blend(deck, data, note));
    if (!note.empty()) std::printf("data stats: %s\n", note.c_str());
    const int64_t n = steps * G;
    for (int64_t i = 0; i < n; ++i) blend.next();
    std::printf("data stats: %lld steps x %lld samples of %d tokens (world %d), data.order = %s\n", (long long)steps,
                (long long)G, T, a.world, deck.data.order.c_str());
    std::printf("%-16s %8s %14s %12s %12s %10s\n", "source", "weight", "train tokens", "documents", "samples", "epochs");
    for (size_t i = 0; i < data.train.size(); ++i) {
        const Source& s = data.train[i];
        // Documents: the manifest's count where each shard of the source is a whole corpus's.
        std::string docs = "-";
        {
            int64_t d = 0;
            bool known = true;
            std::vector<std::string> dirs;
            for (const auto& sh : s.shards) {
                const std::string dir = fs::path(sh.path).parent_path().string();
                if (std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) dirs.push_back(dir);
            }
            for (const auto& dir : dirs) {
                bool found = false;
                const CorpusManifest m = manifest_read(dir.empty() ? "." : dir, found);
                if (!found || m.shards.size() != size_t(std::count_if(s.shards.begin(), s.shards.end(), [&](const TokenShard& sh) {
                                                    return fs::path(sh.path).parent_path().string() == dir;
                                                })))
                    known = false;
                else
                    d += m.documents;
            }
            if (known) docs = std::to_string(d);
        }
        const int64_t samples = blend.counts()[i];
        const int64_t per_epoch = std::max<int64_t>(1, (s.len - 1) / T);
        std::printf("%-16s %8.4f %14lld %12s %12lld %10.3f\n", s.name.c_str(), blend.weights()[i], (long long)s.len,
                    docs.c_str(), (long long)samples, double(samples) / double(per_epoch));
    }
    std::printf("(epochs: samples / whole samples of the train split, floor((tokens - 1) / %d); under data.order = "
                "shuffle each is one pass)\n", T);
    return 0;
}

int inspect_main(const std::vector<std::string>& args) {
    const DeckArgs a = parse_deck_args(args);
    if ((a.sample >= 0) == (a.step >= 0)) usage_error("inspect needs --sample N or --step S");
    Deck deck = deck_load(a.deck, a.overrides);
    const DataSet data = data_open(deck.data);
    const int64_t G = deck_global_batch(deck, a.world);
    const int T = deck.data.seq_len, mbs = deck.data.micro_batch_size;
    Sampler sampler(data, deck.data, uint64_t(deck.train.seed));
    std::string note;
    sampler.set_blend(run_blend(deck, data, note));
    if (!note.empty()) std::printf("data inspect: %s\n", note.c_str());
    std::vector<std::pair<int64_t, int64_t>> which;  // (step, j)
    if (a.sample >= 0) {
        which.push_back({a.sample / G, a.sample % G});
    } else if (a.rank >= 0) {
        const auto& p = deck.parallel;
        const Layout layout = make_layout(a.world, p.tp, p.cp, p.pp, p.dp, p.ep);
        if (a.rank >= a.world) usage_error("--rank " + std::to_string(a.rank) + " is not below --world " + std::to_string(a.world));
        const int64_t m = G / (int64_t(layout.size[kDP]) * mbs), r = layout.coords_of(a.rank)[kDP];
        for (int64_t j = r * m * mbs; j < (r + 1) * m * mbs; ++j) which.push_back({a.step, j});
    } else {
        for (int64_t j = 0; j < G; ++j) which.push_back({a.step, j});
    }
    std::vector<int32_t> ids(static_cast<size_t>(T)), targets(static_cast<size_t>(T));
    for (const auto& [s, j] : which) {
        const Sampler::Ref ref = sampler.train_ref(s, j, G);
        sampler.train_sample(s, j, G, ids.data(), targets.data());
        std::vector<uint32_t> all(ids.begin(), ids.end());
        all.push_back(uint32_t(targets.back()));
        std::printf("== sample %lld (step %lld, j %lld): source %s, offset %lld of its train split, %d + 1 tokens\n",
                    (long long)(s * G + j), (long long)s, (long long)j, data.train[size_t(ref.source)].name.c_str(),
                    (long long)ref.offset, T);
        if (a.ids) {
            for (size_t k = 0; k < all.size(); ++k) std::printf("%s%u", k ? " " : "", all[k]);
            std::printf("\n");
        } else {
            std::string text;
            try {
                text = data.tokenizer.decode(all.data(), all.size());
            } catch (const std::exception& e) {
                text = std::string("(cannot decode: ") + e.what() + ")";
            }
            std::fwrite(text.data(), 1, text.size(), stdout);
            std::printf("\n");
        }
    }
    return 0;
}

}  // namespace

int data_main(int argc, char** argv) {
    std::vector<std::string> args(argv + 1, argv + argc);
    if (args.empty() || args[0] == "--help" || args[0] == "-h") {
        std::cout << kUsage;
        return args.empty() ? 2 : 0;
    }
    const std::string what = args[0];
    args.erase(args.begin());
    if (what == "verify") return verify_main(args);
    if (what == "stats") return stats_main(args);
    if (what == "inspect") return inspect_main(args);
    usage_error("unknown action '" + what + "'; valid: verify, inspect, stats");
}

}  // namespace quintet
