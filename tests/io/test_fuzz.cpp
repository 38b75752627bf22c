// Corrupt input, fuzzed in-process with deterministic seeds (docs/reliability.md): the deck
// parser, the token-file reader, the checkpoint reader (verify, then load, as a resume does),
// the BPE merges and `quintet plan`'s options and deck, each fed >= 1000 mutated inputs. Every input must either load or fail with a
// ConfigError -- the clean error main() turns into exit status 2 -- never crash, hang or throw
// anything else. Mutations: bit flips, random bytes, inserted/deleted/duplicated runs and
// truncation, biased to the head of binary files where HDF5 keeps its superblock and headers.
// ctest: labels=unit timeout=600
#include <fcntl.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "quintet/core/error.hpp"
#include "quintet/io/checkpoint.hpp"
#include "quintet/io/token_data.hpp"
#include "quintet/tokenizer/byte_bpe.hpp"
#include "quintet/model/params.hpp"
#include "quintet/deck/deck.hpp"
#include "quintet/tools/commands.hpp"
#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet;

namespace {

constexpr int kInputs = 1000;

std::string slurp(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

void spit(const fs::path& p, const std::string& bytes) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f << bytes;
}

// 1-8 mutations of `base`; `head` > 0 aims half of them at the first `head` bytes.
std::string mutate(const std::string& base, std::mt19937& g, size_t head) {
    std::string s = base;
    const int n = 1 + int(g() % 8);
    for (int k = 0; k < n && !s.empty(); ++k) {
        const size_t span = head > 0 && g() % 2 ? std::min(head, s.size()) : s.size();
        const size_t at = g() % span;
        switch (g() % 6) {
        case 0: s[at] = char(s[at] ^ (1 << (g() % 8))); break;           // flip a bit
        case 1: s[at] = char(g()); break;                                 // a random byte
        case 2: s.insert(at, std::string(1 + g() % 16, char(g()))); break;  // insert a run
        case 3: s.erase(at, 1 + g() % 64); break;                        // delete a run
        case 4: s.insert(at, s.substr(g() % s.size(), 1 + g() % 32)); break;  // duplicate a run
        case 5: s.resize(at); break;                                     // truncate
        }
    }
    return s;
}

// Runs `f`; counts a clean result (success or ConfigError); anything else fails the test.
struct Tally {
    int ok = 0, clean_errors = 0;
    void run(const std::function<void()>& f, const std::string& what) {
        try {
            f();
            ++ok;
        } catch (const ConfigError&) {
            ++clean_errors;
        } catch (const std::exception& e) {
            ADD_FAILURE() << what << ": not a clean error: " << e.what();
        }
    }
    void report(const char* target) const {
        std::printf("[ fuzz ] %s: %d inputs, %d loaded, %d clean errors\n", target, ok + clean_errors, ok, clean_errors);
        EXPECT_GE(ok + clean_errors, kInputs);
    }
};

fs::path scratch(const char* name) { return quintet::testing::scratch_dir(std::string("fuzz_") + name); }

TEST(Fuzz, DeckParser) {
    const fs::path dir = scratch("deck");
    const std::string base = deck_reference_text() + "\n[moe]\nexperts = 4\n[parallel]\nep = 2\n";
    std::mt19937 g(1);
    Tally t;
    // Extreme values a mutation would rarely produce, spliced in as whole lines.
    const char* lines[] = {"d_model = 99999999999999999999", "n_layers = -3", "lr = nan", "steps = 1e400",
                           "theta = inf", "[model]\nd_model = 1073741824\nn_layers = 4096", "seq_len = 0x10",
                           "[bogus]", "= 3", "experts = 1048576\n[moe]\ntop_k = 1048576", "keep = 18446744073709551617"};
    for (int i = 0; i < kInputs; ++i) {
        std::string text = mutate(base, g, 0);
        if (i % 4 == 0) text.insert(text.empty() ? 0 : g() % text.size(), std::string("\n") + lines[g() % std::size(lines)] + "\n");
        const fs::path p = dir / "d.deck";
        spit(p, text);
        t.run([&] {
            Deck d = deck_load(p.string(), {});
            d.model.vocab_size = 256;
            deck_validate(d, 1 + int(g() % 8));
        }, "deck input " + std::to_string(i));
    }
    t.report("deck parser");
}

// `quintet plan ARGS` in this process, its stdout thrown away.
int plan_quietly(const std::vector<std::string>& args) {
    std::vector<std::string> all = {"plan"};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::fflush(stdout);
    std::cout.flush();
    const int saved = dup(1), null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    close(null);
    struct Restore {
        int fd;
        ~Restore() {
            std::fflush(stdout);
            std::cout.flush();
            dup2(fd, 1);
            close(fd);
        }
    } restore{saved};
    return plan_main(int(all.size()), argv.data());
}

const char* kPlanDeck = R"([model]
d_model = 256
n_layers = 6
n_heads = 8
n_kv_heads = 4
ffn_dim = 512
[moe]
experts = 4
top_k = 2
shared_experts = 1
layers = 1,3-5
[data]
seq_len = 256
micro_batch_size = 2
[parallel]
sequence_parallel = true
microbatches = 4
[train]
precision = bf16
recompute = selective
global_batch = 0
)";

TEST(Fuzz, PlanCommandOptions) {
    const fs::path dir = scratch("plan_options");
    spit(dir / "p.deck", kPlanDeck);
    spit(dir / "h.hw", "[device]\nbf16_tflops = 100\nfp32_tflops = 10\nmemory_gib = 16\nmemory_gbs = 900\n[node]\n"
                       "devices = 4\nlink_gbs = 100\nnetwork_gbs = 12.5\nnetwork_latency_us = 5\n");
    const std::vector<std::string> base = {(dir / "p.deck").string(), "--world", "16", "--hardware", "h100-sxm",
                                           "--vocab-size", "1000", "--top", "5"};
    // Options with values a mutation of the base would rarely reach, spliced in whole, and some
    // lone words.
    const std::vector<std::vector<std::string>> pool = {
        {"--json"}, {"--world", "24"}, {"--world", "0"}, {"--world", "-3"}, {"--world", "1e3"}, {"--world", "4096"},
        {"--hardware", "a100-sxm-80g"}, {"--hardware", "h200"}, {"--hardware", "host"}, {"--hardware", (dir / "h.hw").string()},
        {"--hardware", (dir / "nothing.hw").string()}, {"--top", "0"}, {"--top=2"}, {"--overlap", "tp,dp,pp"},
        {"--overlap", "none"}, {"--overlap", "tp,,dp"}, {"--attention", "unfused"}, {"--sweep", "train.recompute=full,none"},
        {"--sweep", "parallel.zero=0,1"}, {"--sweep", "parallel.microbatches=1,4"}, {"--parallel.tp=2"}, {"--parallel.pp=3"},
        {"--parallel.ep=4"}, {"--parallel.cp=2"}, {"--train.global_batch=96"}, {"--device-memory", "0.5"},
        {"--model.vocab_size=7"}, {"--vocab-size"}, {"--cores", "2"}, {"--link-gbs", "nan"}, {"--parallel.pp_layers=1,2-3"},
        {"--moe.layers=all"}, {"--data.seq_len=100"}, {"--parallel.virtual_stages=2", "--parallel.schedule=interleaved"},
        {"--model.attention=mla"}, {"--parallel.zero=1"}, {"--train.recompute=full"}, {"--"}, {"="}, {"--x.y=1"}, {"0"}};
    std::mt19937 g(5);
    Tally t;
    for (int i = 0; i < kInputs; ++i) {
        std::vector<std::string> args = base;
        const int n = 1 + int(g() % 4);
        for (int k = 0; k < n; ++k) {
            const size_t at = g() % (args.size() + 1);
            switch (g() % 6) {
            case 0: if (!args.empty()) args[std::min(at, args.size() - 1)] = mutate(args[std::min(at, args.size() - 1)], g, 0); break;
            case 1: if (!args.empty()) args.erase(args.begin() + long(std::min(at, args.size() - 1))); break;
            default: {
                const auto& o = pool[g() % pool.size()];
                args.insert(args.end(), o.begin(), o.end());
                break;
            }
            }
        }
        // Host runs need a measured sgemm rate: give one rather than measure (and never --measure).
        if (std::find(args.begin(), args.end(), "host") != args.end()) args.insert(args.end(), {"--matmul-gflops", "50"});
        args.erase(std::remove(args.begin(), args.end(), "--measure"), args.end());
        t.run([&] { plan_quietly(args); }, "plan options " + std::to_string(i));
    }
    t.report("plan options");
}

TEST(Fuzz, PlanCommandDeck) {
    const fs::path dir = scratch("plan_deck");
    std::mt19937 g(6);
    Tally t;
    const char* lines[] = {"[moe]\nexperts = 1048576", "[model]\nd_model = 1073741824", "[model]\nn_layers = 4096",
                           "[data]\nseq_len = 16777216", "[parallel]\nmicrobatches = 1048576",
                           "[parallel]\nvirtual_stages = 3\nschedule = interleaved", "[train]\nglobal_batch = 7",
                           "[model]\nvocab_size = 3", "[parallel]\npp_layers = 1-6"};
    // Half the inputs keep the syntax and change numbers, so the planner itself runs on odd
    // shapes.
    const char* values[] = {"0", "1", "2", "3", "5", "7", "12", "64", "1000", "65536", "1048576", "-1"};
    for (int i = 0; i < kInputs; ++i) {
        std::string text;
        if (i % 2) {
            std::istringstream in(kPlanDeck);
            for (std::string line; std::getline(in, line);) {
                const size_t eq = line.find(" = ");
                const bool number = eq != std::string::npos && line.find_first_not_of("0123456789", eq + 3) == std::string::npos;
                if (number && g() % 3 == 0) line = line.substr(0, eq + 3) + values[g() % std::size(values)];
                text += line + "\n";
            }
        } else {
            text = mutate(kPlanDeck, g, 0);
        }
        if (i % 4 == 0) text.insert(g() % (text.size() + 1), std::string("\n") + lines[g() % std::size(lines)] + "\n");
        spit(dir / "p.deck", text);
        const char* hw = i % 3 == 0 ? "a100-sxm-80g" : "h100-sxm";
        t.run([&] { plan_quietly({(dir / "p.deck").string(), "--world", std::to_string(1 + g() % 32), "--hardware", hw,
                                  "--vocab-size", "1000", i % 2 ? "--json" : "--top=3"}); },
              "plan deck " + std::to_string(i));
    }
    t.report("plan deck");
}

TEST(Fuzz, ModelTooBigForMemoryStopsAtValidation) {
    Deck d = deck_load("", {"--model.d_model=65536", "--model.n_layers=4096", "--model.n_heads=64"});
    d.model.vocab_size = 256;
    try {
        deck_validate(d, 1);
        ADD_FAILURE() << "a 200-billion-parameter model passed validation";
    } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("GiB"), std::string::npos) << e.what();
    }
}

TEST(Fuzz, TokenFileReader) {
    const fs::path dir = scratch("tokens");
    // A BPE file (merges, eos) and a byte file as bases.
    Tokenizer bpe = tokenizer_train_bpe("the cat sat on the mat; the cat ate the rat. " + std::string(200, 'a'), 300,
                                        {}, true);
    std::vector<uint32_t> ids = bpe.encode("the cat sat on the mat and the rat ran");
    const int eos = bpe.special_id(quintet::kEndOfText);
    ids.push_back(uint32_t(eos));
    token_file_write((dir / "bpe.h5").string(), ids, bpe, eos);
    quintet::testing::make_token_file(dir / "byte.h5", 4000, 256, 3);
    const std::string bases[] = {slurp(dir / "bpe.h5"), slurp(dir / "byte.h5")};
    std::mt19937 g(2);
    Tally t;
    for (int i = 0; i < kInputs; ++i) {
        const fs::path p = dir / "m.h5";
        spit(p, mutate(bases[i % 2], g, 4096));
        t.run([&] {
            TokenFile f = token_file_read(p.string());
            for (uint32_t x : f.tokens)
                if (x >= uint32_t(f.vocab_size)) throw std::runtime_error("token id past vocab_size accepted");
            if (!f.tokens.empty()) (void)f.tokenizer.decode(f.tokens.data(), std::min<size_t>(f.tokens.size(), 64));
        }, "token file " + std::to_string(i));
    }
    t.report("token-file reader");
}

TEST(Fuzz, BpeMerges) {
    std::mt19937 g(3);
    Tally t;
    for (int i = 0; i < kInputs; ++i) {
        // A merges list as a token file would carry it: random pairs, mostly valid, some not,
        // some chains that would double a token's length every merge.
        std::vector<std::pair<uint32_t, uint32_t>> merges;
        const int n = 1 + int(g() % 80);
        for (int m = 0; m < n; ++m) {
            const uint32_t id = 256 + uint32_t(m);
            uint32_t a = g() % id, b = g() % id;
            if (g() % 10 == 0) a = b = id - 1;         // self-chain
            if (g() % 25 == 0) a = id + g() % 5;       // a token not made yet
            merges.push_back({a, b});
        }
        // Through the token-file reader, which validates merges (the way they reach a run).
        const fs::path p = scratch("bpe_file") / "m.h5";
        t.run([&] {
            std::vector<uint32_t> ids = {104, 105};
            // Invalid merges cannot even make a tokenizer (ConfigError), so cannot be written.
            token_file_write(p.string(), ids, quintet::tokenizer_bpe(merges, false, "gpt2", "fuzz"));
            TokenFile f = token_file_read(p.string());
            auto enc = f.tokenizer.encode("the quick brown fox; aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
            if (f.tokenizer.decode(enc.data(), enc.size()) != "the quick brown fox; aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")
                throw std::runtime_error("BPE round trip broken");
        }, "merges " + std::to_string(i));
    }
    t.report("BPE merges");
}

TEST(Fuzz, CheckpointReader) {
    const fs::path dir = scratch("ckpt");
    ModelConfig m;
    m.d_model = 16, m.n_layers = 2, m.n_heads = 2, m.ffn_dim = 32, m.vocab_size = 64;
    const ParamTable table = make_param_table(m);
    std::vector<float> params(table.total), mom(table.total, 0.01f);
    init_params(params.data(), table, m, InitConfig{}, 7, 0, table.total);
    CheckpointMeta meta;
    meta.step = 3;
    meta.deck = "[model]\nd_model = 16\n";
    meta.layout = "tp=1";
    const std::vector<ArenaRange> all = {{Range{0, table.total}, 0}};
    quintet::OptimizerStateIo state;
    state.exp_avg = state.exp_avg_sq = mom.data();
    state.ranges = all;
    const std::string path = checkpoint_save(quintet::MpiCommunicator(MPI_COMM_SELF, "self"), (dir / "run").string(), meta, table, params.data(),
                                             all, state, 0);
    const std::string base = slurp(path);
    std::mt19937 g(4);
    Tally t;
    int refused_by_verify = 0;
    for (int i = 0; i < kInputs; ++i) {
        const fs::path p = dir / "m.h5";
        spit(p, mutate(base, g, 8192));
        t.run([&] {
            // As a resume: verify, then inspect and load only what verified.
            const std::string why = checkpoint_verify(p.string(), quintet::MpiCommunicator(MPI_COMM_SELF, "self"));
            if (!why.empty()) {
                ++refused_by_verify;
                throw ConfigError(why);
            }
            checkpoint_inspect(p.string(), table);
            std::vector<float> a(table.total), b(table.total), c(table.total);
            quintet::OptimizerStateIo into;
            into.exp_avg = b.data(), into.exp_avg_sq = c.data(), into.ranges = all;
            checkpoint_load(p.string(), table, a.data(), &into);
        }, "checkpoint " + std::to_string(i));
    }
    std::printf("[ fuzz ] checkpoint: %d refused by the checksum/readability check\n", refused_by_verify);
    t.report("checkpoint reader");
}

}  // namespace
