// The tokenizer formats in-process, offline: the PCRE2 pre-tokenizer's semantics (end-only `$`,
// `\s` with U+0085, invalid UTF-8 and unmatched text as pieces, empty matches, resumable
// splitting, compile errors with offsets), tiktoken's whole-piece rule and its file checks,
// tokenizer.json parts refused with their JSON path, the stored form round trip, encoding on
// threads (cut at line starts) equal to encoding whole, and mutated files that must load or be
// refused, never crash.
// ctest: labels=unit
#include <gtest/gtest.h>
#include <omp.h>

#include <random>
#include <string>
#include <vector>

#include "quintet/core/error.hpp"
#include "quintet/tokenizer/byte_bpe.hpp"
#include "quintet/tokenizer/hf_json.hpp"
#include "quintet/tokenizer/pretokenizer.hpp"
#include "quintet/tokenizer/tiktoken.hpp"
#include "quintet/tokenizer/tokenizer_spec.hpp"
#include "tokenizer/small_tokenizers.hpp"

using quintet::ConfigError;
using quintet::Pretokenizer;
using quintet::Tokenizer;
using namespace quintet::testing::small;

namespace {

std::vector<std::string> pieces(const Pretokenizer& p, const std::string& text, size_t max_pieces = 1 << 20) {
    std::vector<size_t> ends;
    for (size_t pos = 0; pos < text.size();) pos = p.split(text, pos, text.size(), ends, max_pieces);
    std::vector<std::string> out;
    size_t s = 0;
    for (size_t e : ends) {
        out.push_back(text.substr(s, e - s));
        s = e;
    }
    return out;
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const ConfigError& e) {
        return e.what();
    }
    return "(no error)";
}

Tokenizer small_tt(const std::string& pattern = "gpt2") {
    return quintet::tokenizer_tiktoken(small_tiktoken(), pattern, {{"<|endoftext|>", 276}}, "small.tiktoken");
}

std::string english(size_t bytes, uint32_t seed) {
    const char* words[] = {"the", "and", "is", "it", "there", "another", "thing", "in", "an", "order",
                           "Then", "naïve", "東京", "😀", "1984", "  ", "'s", "\t", "x\u0085y", "42"};
    std::mt19937 g(seed);
    std::string out;
    while (out.size() < bytes) {
        out += words[g() % 20];
        const uint32_t r = g() % 17;
        out += r == 0 ? ".\n" : r == 1 ? "\n\n  " : r == 2 ? "   \n" : " ";
    }
    return out;
}

}  // namespace

TEST(Pretokenizer, PresetsAndTheirSemantics) {
    for (const char* name : {"gpt2", "r50k_base", "p50k_base", "cl100k_base", "llama3", "o200k_base"}) {
        ASSERT_NE(quintet::pretokenizer_preset(name), nullptr) << name;
        Pretokenizer p(name, "test");
        EXPECT_FALSE(p.name().empty()) << name;
    }
    EXPECT_EQ(quintet::pretokenizer_preset("nope"), nullptr);
    EXPECT_EQ(Pretokenizer("llama3", "t").regex(), Pretokenizer("cl100k_base", "t").regex());

    const Pretokenizer gpt2("gpt2", "test");
    EXPECT_EQ(pieces(gpt2, "Hello world's  x 123!?"),
              (std::vector<std::string>{"Hello", " world", "'s", " ", " x", " 123", "!?"}));
    const Pretokenizer cl100k("cl100k_base", "test");
    EXPECT_EQ(pieces(cl100k, "I'LL 12345\n\nok"), (std::vector<std::string>{"I", "'LL", " ", "123", "45", "\n\n", "ok"}));
    // `$` is the end of the text only (PCRE2 would also match before a final newline).
    EXPECT_EQ(pieces(Pretokenizer("a$|a.", "t"), "a\n"), (std::vector<std::string>{"a\n"}));
    // `\s` is White_Space, U+0085 included.
    EXPECT_EQ(pieces(Pretokenizer("\\s+", "t"), "a\u0085b"), (std::vector<std::string>{"a", "\u0085", "b"}));
    EXPECT_EQ(pieces(Pretokenizer("[^\\s]+", "t"), "a\u0085b"), (std::vector<std::string>{"a", "\u0085", "b"}));
    // Invalid UTF-8 never matches: its bytes are pieces of their own, nothing is lost.
    EXPECT_EQ(pieces(gpt2, "ab\xff\xfe" "cd \xc3"), (std::vector<std::string>{"ab", "\xff\xfe", "cd", " ", "\xc3"}));
    // A pattern that matches the empty string does not loop.
    EXPECT_EQ(pieces(Pretokenizer("x*", "t"), "abxxc"), (std::vector<std::string>{"ab", "xx", "c"}));
    // Splitting in several calls (few pieces per call) gives the same pieces.
    const std::string text = english(20000, 1);
    EXPECT_EQ(pieces(cl100k, text, 3), pieces(cl100k, text));
}

TEST(Pretokenizer, BadPatternIsConfigErrorWithPcre2MessageAndOffset) {
    const std::string e = error_of([] { Pretokenizer("ab(c", "--tokenizer-pattern"); });
    EXPECT_NE(e.find("--tokenizer-pattern"), std::string::npos) << e;
    EXPECT_NE(e.find("at offset 4"), std::string::npos) << e;
    EXPECT_NE(e.find("parenthesis"), std::string::npos) << e;
    // The offset is into the pattern as given, also after a widened \s.
    const std::string e2 = error_of([] { Pretokenizer("\\s+[", "--tokenizer-pattern"); });
    EXPECT_NE(e2.find("at offset 4"), std::string::npos) << e2;
    EXPECT_NE(error_of([] { Pretokenizer("", "p"); }).find("empty"), std::string::npos);
}

TEST(Tiktoken, WholePieceRuleAndFileChecks) {
    const Tokenizer t = small_tt();
    EXPECT_EQ(t.vocab_size(), 277);
    EXPECT_EQ(t.encode("the and"), (std::vector<uint32_t>{258, 264}));
    EXPECT_EQ(t.special_id("<|endoftext|>"), 276);
    EXPECT_EQ(t.token_bytes(276), "<|endoftext|>");
    std::vector<uint32_t> ids;
    t.encode_with_specials("the<|endoftext|>the", ids);
    EXPECT_EQ(ids, (std::vector<uint32_t>{258, 276, 258}));
    // A piece that is a token is that token even where merges cannot reach it (tiktoken's rule).
    std::string ranks;
    for (int b = 0; b < 256; ++b) ranks += base64(std::string(1, char(b))) + " " + std::to_string(b) + "\n";
    const Tokenizer abc = quintet::tokenizer_tiktoken(ranks + base64("abc") + " 256\n", "gpt2", {}, "f");
    EXPECT_EQ(abc.encode("abc"), (std::vector<uint32_t>{256}));
    EXPECT_EQ(abc.encode("abcd"), (std::vector<uint32_t>{'a', 'b', 'c', 'd'}));

    auto bad = [](const std::string& file, std::vector<quintet::SpecialToken> sp = {}) {
        return error_of([&] { quintet::tokenizer_tiktoken(file, "gpt2", sp, "x.tiktoken"); });
    };
    EXPECT_NE(bad(ranks.substr(ranks.find('\n') + 1)).find("byte 0 has no token"), std::string::npos);
    EXPECT_NE(bad(ranks + base64("ab") + " 7\n").find("rank 7 appears twice"), std::string::npos);
    EXPECT_NE(bad(ranks + base64("ab") + " x\n").find("line 257"), std::string::npos);
    EXPECT_NE(bad(ranks, {{"<s>", 5}}).find("is also a rank"), std::string::npos);
    // A token given twice (two ranks for the same bytes), a multi-byte one or a byte's: the line.
    EXPECT_NE(bad(ranks + base64("ab") + " 256\n" + base64("ab") + " 257\n")
                  .find("x.tiktoken: line 258 ('YWI= 257'): its token is the token of line 257"),
              std::string::npos)
        << bad(ranks + base64("ab") + " 256\n" + base64("ab") + " 257\n");
    EXPECT_NE(bad(ranks + base64("a") + " 300\n").find("line 257 ('YQ== 300'): its token is the token of line 98"),
              std::string::npos);
    // A binary file: its bytes shown as \xNN, the message whole (a NUL would have ended it).
    std::string binary;
    for (int i = 0; i < 3 * 256; ++i) binary += char(i % 256);
    const std::string e = bad(binary);
    EXPECT_NE(e.find("line 1 ('\\x00\\x01\\x02\\x03\\x04\\x05\\x06\\x07\\x08\\x09'): no space between token and rank; "
                     "a .tiktoken file has one"),
              std::string::npos) << e;
    for (char c : e) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "a raw byte " << int(static_cast<unsigned char>(c)) << " in: " << e;
    EXPECT_NE(bad("").find("no ranks"), std::string::npos);
    EXPECT_EQ(quintet::tiktoken_specials("<a>=5,<b>=6", "s").size(), 2u);
    EXPECT_EQ(quintet::tiktoken_specials("llama3", "s").size(), 256u);
    EXPECT_EQ(quintet::tiktoken_specials("cl100k_base", "s")[4].id, 100276u);
    EXPECT_NE(error_of([] { quintet::tiktoken_specials("<a>", "--tokenizer-specials"); }).find("TEXT=ID"),
              std::string::npos);
}

TEST(HfJson, MergesListRuleAndEveryUnreadPartRefused) {
    const Tokenizer hf = quintet::tokenizer_hf_json(small_tokenizer_json(), "small.json");
    const Tokenizer tt = small_tt();
    EXPECT_EQ(hf.encode("the and"), tt.encode("the and"));
    // The two rules differ: tiktoken takes the piece " the" whole; the merges list makes "th",
    // then "the", and has no merge (" ", "the").
    EXPECT_EQ(tt.encode(" the"), (std::vector<uint32_t>{260}));
    EXPECT_EQ(hf.encode(" the"), (std::vector<uint32_t>{' ', 258}));
    const std::string text = english(30000, 2);
    EXPECT_EQ(hf.decode(hf.encode(text).data(), hf.encode(text).size()), text);
    EXPECT_EQ(hf.vocab_size(), 277);
    EXPECT_EQ(hf.special_id("<|endoftext|>"), 276);

    auto refused = [](std::string json, const std::string& from, const std::string& to) {
        const size_t at = json.find(from);
        EXPECT_NE(at, std::string::npos) << from;
        json.replace(at, from.size(), to);
        return error_of([&] { quintet::tokenizer_hf_json(json, "t.json"); });
    };
    const std::string base = small_tokenizer_json();
    EXPECT_NE(refused(base, "\"normalizer\":null", "\"normalizer\":{\"type\":\"Lowercase\"}").find("/normalizer/type"),
              std::string::npos);
    // An empty normalizer Sequence is no normalizer (DeepSeek-V3's file).
    std::string empty_seq = base;
    empty_seq.replace(empty_seq.find("\"normalizer\":null"), 17, "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[]}");
    EXPECT_EQ(quintet::tokenizer_hf_json(empty_seq, "seq.json").encode(english(3000, 4)), hf.encode(english(3000, 4)));
    // NFC composes before the merges: "e" + U+0301 is "\u00e9".
    std::string nfc = base;
    nfc.replace(nfc.find("\"normalizer\":null"), 17, "\"normalizer\":{\"type\":\"NFC\"}");
    const Tokenizer with_nfc = quintet::tokenizer_hf_json(nfc, "nfc.json");
    EXPECT_EQ(with_nfc.encode("e\u0301"), hf.encode("\u00e9"));
    EXPECT_FALSE(with_nfc.cuts_at_line_starts());
    EXPECT_NE(refused(base, "\"type\":\"BPE\"", "\"type\":\"WordPiece\"").find("/model/type"), std::string::npos);
    EXPECT_NE(refused(base, "\"type\":\"ByteLevel\",\"add_prefix_space\"", "\"type\":\"Whitespace\",\"add_prefix_space\"")
                  .find("/pre_tokenizer/type"),
              std::string::npos);
    const std::string split = R"("pre_tokenizer":{"type":"Split","pattern":{"Regex":"\\s+"},"behavior":"Sideways"},)";
    EXPECT_NE(refused(base, R"("pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},)",
                      split)
                  .find("/pre_tokenizer/behavior"),
              std::string::npos);
    EXPECT_NE(refused(base, "\"merges\":[", "\"merges\":[\"t q\",").find("/model/merges/0"), std::string::npos);
    EXPECT_NE(refused(base, "\"!\":33", "\"\\u4e00\":33").find("byte-level alphabet"), std::string::npos);
    EXPECT_NE(error_of([] { quintet::tokenizer_hf_json("{\"model\": [1,", "t.json"); }).find("syntax error at byte"),
              std::string::npos);
    // An added token that is not special is cut out of the text always, as the library does.
    std::string j = base;
    j.replace(j.find("\"special\":true"), 14, "\"special\":false");
    const Tokenizer added = quintet::tokenizer_hf_json(j, "t.json");
    EXPECT_EQ(added.encode("the<|endoftext|>"), (std::vector<uint32_t>{258, 276}));
}

TEST(TokenizerState, RoundTripsThroughTheStoredForm) {
    const std::vector<Tokenizer> toks = {quintet::tokenizer_byte(), small_tt(), small_tt("o200k_base"),
                                         quintet::tokenizer_hf_json(small_tokenizer_json(), "j"),
                                         quintet::tokenizer_train_bpe(english(50000, 3), 400, {}, true)};
    const std::string text = english(20000, 4);
    for (const Tokenizer& t : toks) {
        const Tokenizer back = quintet::tokenizer_from_state(t.state(), "stored");
        EXPECT_EQ(back.fingerprint(), t.fingerprint()) << t.describe();
        EXPECT_EQ(back.vocab_size(), t.vocab_size()) << t.describe();
        EXPECT_EQ(back.encode(text), t.encode(text)) << t.describe();
    }
    EXPECT_NE(toks[1].fingerprint(), toks[2].fingerprint());  // another pattern, another tokenizer
}

// Parts cut at line starts, encoded on threads, give the ids of the whole text, for every
// format that cuts; and a custom pattern is not cut.
TEST(TokenizerThreads, CutTextEqualsWholeText) {
    const std::string text = english(3 << 20, 5);
    const std::vector<Tokenizer> toks = {quintet::tokenizer_byte(), small_tt(), small_tt("cl100k_base"),
                                         small_tt("o200k_base"), quintet::tokenizer_hf_json(small_tokenizer_json(), "j"),
                                         quintet::tokenizer_train_bpe(english(200000, 6), 600, {})};
    omp_set_num_threads(2);
    for (const Tokenizer& t : toks) {
        ASSERT_TRUE(t.cuts_at_line_starts()) << t.describe();
        EXPECT_GT(quintet::tokenizer_cut(t, text, 1 << 16).size(), 20u);
        EXPECT_EQ(t.encode_parallel(text, false), t.encode(text)) << t.describe();
        std::vector<uint32_t> with;
        t.encode_with_specials(text + "<|endoftext|>" + text.substr(0, 1000), with);
        EXPECT_EQ(t.encode_parallel(text + "<|endoftext|>" + text.substr(0, 1000), true), with) << t.describe();
    }
    EXPECT_FALSE(small_tt("\\S+|\\s+").cuts_at_line_starts());
    EXPECT_TRUE(quintet::tokenizer_cut(small_tt("\\S+|\\s+"), text, 1 << 16).empty());
}

// Mutated rank files and tokenizer.json files load or are refused with a ConfigError; what
// loads round-trips text.
TEST(TokenizerFuzz, MutatedFilesLoadOrAreRefused) {
    std::mt19937 g(11);
    const std::string bases[] = {small_tiktoken(), small_tokenizer_json()};
    int refused = 0, loaded = 0;
    for (int i = 0; i < 300; ++i) {
        std::string f = bases[i % 2];
        for (int k = 0, n = 1 + int(g() % 4); k < n; ++k) {
            const size_t at = g() % f.size();
            switch (g() % 3) {
            case 0: f[at] = char(g() & 0xFF); break;
            case 1: f.erase(at, 1 + g() % 8); break;
            default: f.insert(at, 1, " \n\",:[]{}0"[g() % 10]);
            }
        }
        try {
            const Tokenizer t = i % 2 == 0 ? quintet::tokenizer_tiktoken(f, "gpt2", {}, "fuzz")
                                           : quintet::tokenizer_hf_json(f, "fuzz");
            const std::string text = "the and another thing, 42\n";
            const std::vector<uint32_t> ids = t.encode(text);
            (void)t.decode(ids.data(), ids.size());
            ++loaded;
        } catch (const ConfigError&) {
            ++refused;
        }
    }
    std::printf("[ fuzz ] tokenizer files: %d loaded, %d refused\n", loaded, refused);
    EXPECT_EQ(loaded + refused, 300);
}
