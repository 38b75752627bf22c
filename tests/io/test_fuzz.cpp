// Corrupt input, fuzzed in-process with deterministic seeds (docs/reliability.md): the deck
// parser, the token-file reader, the checkpoint reader (verify, then load, as a resume does) and
// the BPE merges, each fed >= 1000 mutated inputs. Every input must either load or fail with a
// ConfigError -- the clean error main() turns into exit status 2 -- never crash, hang or throw
// anything else. Mutations: bit flips, random bytes, inserted/deleted/duplicated runs and
// truncation, biased to the head of binary files where HDF5 keeps its superblock and headers.
// ctest: labels=unit timeout=600
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
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
    const std::string path = checkpoint_save(quintet::MpiCommunicator(MPI_COMM_SELF, "self"), (dir / "run").string(), meta, table, params.data(),
                                             mom.data(), mom.data(), all, 0);
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
            checkpoint_load(p.string(), table, a.data(), b.data(), c.data(), all);
        }, "checkpoint " + std::to_string(i));
    }
    std::printf("[ fuzz ] checkpoint: %d refused by the checksum/readability check\n", refused_by_verify);
    t.report("checkpoint reader");
}

}  // namespace
