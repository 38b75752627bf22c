// The deck: parsing, overrides, every error naming key/value/valid, the resolved-text round
// trip, and the generated reference deck and docs table kept in sync with the option table.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <functional>
#include <unistd.h>

#include "quintet/core/error.hpp"
#include "quintet/deck/deck.hpp"

using namespace quintet;
namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
    std::ifstream f(p);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

fs::path write_deck(const std::string& text) {
    fs::path p = fs::temp_directory_path() / ("quintet_test_" + std::to_string(::getpid()) + ".deck");
    std::ofstream(p) << text;
    return p;
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const ConfigError& e) {
        return e.what();
    }
    return "";
}

TEST(Deck, FileThenCommandLineOverrides) {
    auto p = write_deck("[model]\nd_model = 64  # width\nn_heads = 2\n[train]\nlr = 1e-3\ntie = 1\n");
    // "tie" is not a key: rejected, naming the section's valid keys.
    std::string e = error_of([&] { deck_load(p.string(), {}); });
    EXPECT_NE(e.find("train.tie"), std::string::npos) << e;
    EXPECT_NE(e.find("valid: steps"), std::string::npos) << e;
    p = write_deck("[model]\nd_model = 64  # width\nn_heads = 2\n[train]\nlr = 1e-3\n");
    Deck d = deck_load(p.string(), {"--train.lr=5e-4", "--model.tie_embeddings=yes"});
    EXPECT_EQ(d.model.d_model, 64);
    EXPECT_EQ(d.model.n_heads, 2);
    EXPECT_DOUBLE_EQ(d.train.lr, 5e-4);
    EXPECT_TRUE(d.model.tie_embeddings);
    fs::remove(p);
}

TEST(Deck, BadValuesNameKeyValueAndWhatIsValid) {
    struct C { std::string arg, key, value, valid; };
    for (const C& c : std::vector<C>{
             {"--model.d_model=12x", "model.d_model", "12x", "integer"},
             {"--model.d_model=0", "model.d_model", "0", "[1,"},
             {"--train.lr=-1", "train.lr", "-1", "number in"},
             {"--train.lr=nan", "train.lr", "nan", "number in"},
             {"--model.tie_embeddings=maybe", "model.tie_embeddings", "maybe", "true or false"},
             {"--rope.scaling=ntk", "rope.scaling", "ntk", "none | yarn"},
             {"--parallel.zero=4", "parallel.zero", "4", "[0, 3]"},
             {"--nosection=1", "nosection", "", "sections:"},
             {"--model.d_model", "model.d_model", "", "--section.key=value"},
         }) {
        std::string e = error_of([&] { deck_load("", {c.arg}); });
        EXPECT_NE(e.find(c.key), std::string::npos) << c.arg << ": " << e;
        EXPECT_NE(e.find(c.value), std::string::npos) << c.arg << ": " << e;
        EXPECT_NE(e.find(c.valid), std::string::npos) << c.arg << ": " << e;
    }
    EXPECT_NE(error_of([] { deck_load("/no/such.deck", {}); }).find("/no/such.deck"), std::string::npos);
}

TEST(Deck, LayoutAndShapeChecks) {
    Deck d = deck_load("", {});
    d.model.vocab_size = 256;
    EXPECT_EQ(error_of([&] { deck_validate(d, 4); }), "");
    auto with = [&](std::vector<std::string> o, int world) {
        Deck x = deck_load("", o);
        x.model.vocab_size = 256;
        return error_of([&] { deck_validate(x, world); });
    };
    EXPECT_NE(with({"--parallel.dp=3"}, 4).find("world size 4"), std::string::npos);
    EXPECT_NE(with({"--parallel.tp=3"}, 4).find("parallel.tp"), std::string::npos);
    EXPECT_NE(with({"--model.n_heads=3"}, 1).find("must divide model.d_model"), std::string::npos);
    EXPECT_NE(with({"--model.n_kv_heads=3"}, 1).find("model.n_kv_heads"), std::string::npos);
    EXPECT_NE(with({"--model.attention=mla"}, 1).find("model.kv_lora_rank"), std::string::npos);  // dims needed
    EXPECT_NE(with({"--model.kv_lora_rank=8"}, 1).find("is an MLA key"), std::string::npos);
    EXPECT_EQ(with({"--moe.experts=8"}, 1), "");  // MoE is built now
    EXPECT_NE(with({"--moe.experts=2", "--moe.top_k=3"}, 1).find("moe.top_k"), std::string::npos);
    EXPECT_NE(with({"--rope.scaling=yarn"}, 1).find("rope.factor"), std::string::npos);
    EXPECT_NE(with({"--train.lr=1e-4", "--train.lr_min=1e-3"}, 1).find("train.lr_min"), std::string::npos);
}

// A key given twice in a file names both lines (Boost alone would keep the last); a warm-up the
// user set longer than the run is refused with the valid range; values are echoed as written.
TEST(Deck, DuplicateKeysWarmupAndValuesAsWritten) {
    const fs::path dup = write_deck("[train]\nlr = 1e-3\nsteps = 5\n\n[train]\nlr = 2e-3\n");
    const std::string e = error_of([&] { deck_load(dup.string(), {}); });
    EXPECT_NE(e.find("'train.lr' is given twice, on lines 2 and 6"), std::string::npos) << e;
    fs::remove(dup);
    // The same key in two sections is two keys.
    const fs::path two = write_deck("[train]\nsteps = 5\n[eval]\nbatches = 5\n");
    EXPECT_EQ(error_of([&] { deck_load(two.string(), {}); }), "");
    fs::remove(two);
    Deck d = deck_load("", {"--train.steps=30", "--train.warmup=50"});
    d.model.vocab_size = 256;
    const std::string w = error_of([&] { deck_validate(d, 1, false); });
    EXPECT_NE(w.find("'train.warmup' = '50'"), std::string::npos) << w;
    EXPECT_NE(w.find("valid: 0 to 30"), std::string::npos) << w;
    // The default warm-up (10) over a 2-step run is let through (the trainer warns).
    Deck short_run = deck_load("", {"--train.steps=2"});
    short_run.model.vocab_size = 256;
    EXPECT_EQ(error_of([&] { deck_validate(short_run, 1, false); }), "");
    // A value reads as written (1.0, not 1.000000) in a message about it.
    Deck y = deck_load("", {"--rope.scaling=yarn", "--rope.factor=1.0"});
    y.model.vocab_size = 256;
    const std::string f = error_of([&] { deck_validate(y, 1, false); });
    EXPECT_NE(f.find("'rope.factor' = '1.0'"), std::string::npos) << f;
    EXPECT_EQ(deck_value(y, "rope.factor"), "1.0");
    EXPECT_EQ(deck_value(y, "train.lr"), "0.0003") << "a key not given reads as the deck prints it";
}

// parallel.schedule = zbv runs two chunks per stage and nothing else: virtual_stages defaults to
// 2 there (a value given still holds, and is checked).
TEST(Deck, ZbvDefaultsToTwoVirtualStages) {
    Deck d = deck_load("", {"--parallel.schedule=zbv", "--parallel.pp=2", "--parallel.microbatches=4"});
    EXPECT_EQ(d.parallel.virtual_stages, 2);
    d.model.vocab_size = 256;
    EXPECT_EQ(error_of([&] { deck_validate(d, 2, false); }), "");
    const fs::path p = write_deck("[parallel]\nschedule = zbv\npp = 2\n");
    EXPECT_EQ(deck_load(p.string(), {}).parallel.virtual_stages, 2);
    fs::remove(p);
    Deck three = deck_load("", {"--parallel.schedule=zbv", "--parallel.pp=2", "--parallel.virtual_stages=3"});
    EXPECT_EQ(three.parallel.virtual_stages, 3);
    three.model.vocab_size = 256;
    EXPECT_NE(error_of([&] { deck_validate(three, 2, false); }).find("must be 2 with parallel.schedule = zbv"),
              std::string::npos);
    EXPECT_EQ(deck_load("", {"--parallel.schedule=interleaved"}).parallel.virtual_stages, 1);
}

// An empty value on the command line (--data.val_path=) is a value, as in a deck file: a path
// key takes it, a number refuses it by name; the last override of a key holds.
TEST(Deck, AnEmptyValueOnTheCommandLine) {
    const fs::path p = write_deck("[data]\nval_path = val.h5\n");
    EXPECT_EQ(deck_load(p.string(), {}).data.val_path, "val.h5");
    Deck d = deck_load(p.string(), {"--data.val_path="});
    EXPECT_EQ(d.data.val_path, "");
    EXPECT_EQ(d.given.at("data.val_path"), "");
    EXPECT_EQ(deck_load(p.string(), {"--data.val_path=", "--data.val_path=b.h5"}).data.val_path, "b.h5");
    EXPECT_EQ(deck_load(p.string(), {"--data.val_path=b.h5", "--data.val_path="}).data.val_path, "");
    fs::remove(p);
    EXPECT_NE(error_of([] { deck_load("", {"--train.steps="}); }).find("deck key 'train.steps' = '': expected an integer"),
              std::string::npos);
    EXPECT_NE(error_of([] { deck_load("", {"--train.bogus="}); }).find("'train.bogus': unknown key in [train]"),
              std::string::npos);
}

TEST(Deck, ResolvedTextRoundTrips) {
    Deck d = deck_load("", {"--model.d_model=96", "--rope.factor=2.5", "--output.run_dir=runs/x y"});
    std::string text = deck_to_text(d);
    auto p = write_deck(text);
    Deck back = deck_load(p.string(), {});
    EXPECT_EQ(deck_to_text(back), text);
    EXPECT_EQ(back.output.run_dir, "runs/x y");
    fs::remove(p);
}

TEST(Deck, ReferenceDeckAndDocsAreGeneratedFromTheOptionTable) {
    fs::path src = QUINTET_SOURCE_DIR;
    EXPECT_EQ(slurp(src / "inputs/reference.deck"), deck_reference_text())
        << "inputs/reference.deck is stale: regenerate with `build/quintet deck --reference > inputs/reference.deck`";
    EXPECT_NE(slurp(src / "docs/deck.md").find(deck_markdown_table()), std::string::npos)
        << "docs/deck.md is stale: paste `build/quintet deck --markdown` into it";
    // And the reference deck parses to the defaults.
    Deck d = deck_load((src / "inputs/reference.deck").string(), {});
    EXPECT_EQ(deck_to_text(d), deck_to_text(Deck{}));
    for (const char* deck : {"quickstart", "bench_small", "bench_medium"})
        EXPECT_EQ(error_of([&] { deck_load((src / "inputs" / (std::string(deck) + ".deck")).string(), {}); }), "")
            << deck;
}

}  // namespace
