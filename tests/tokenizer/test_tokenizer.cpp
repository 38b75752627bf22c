// Byte and BPE tokenizers (exact round trip, vocab size, compression, determinism, rank-order
// encoding, the GPT-2 pattern and the format-1 split of old files) and the HDF5 token file
// (round trip, format 1 still read, one ConfigError per kind of bad file).
// Plain GoogleTest, no MPI; files go to a fresh directory under /tmp.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "quintet/core/error.hpp"
#include "quintet/io/token_data.hpp"
#include "quintet/tokenizer/byte_bpe.hpp"
#include "quintet/tokenizer/pretokenizer.hpp"

namespace fs = std::filesystem;
using quintet::ConfigError;
using quintet::Tokenizer;

namespace {

// Zipf-ish English-like text: one fixed lexicon of random words (the same for every seed),
// drawn with skewed frequencies, with punctuation, digits and newlines.
std::string synthetic_text(size_t n_bytes, uint32_t seed) {
    std::mt19937 rng(12345);
    std::vector<std::string> lexicon;
    for (int w = 0; w < 2000; ++w) {
        std::string word;
        int len = 2 + int(rng() % 9);
        for (int i = 0; i < len; ++i) word += char('a' + rng() % 26);
        if (rng() % 7 == 0) word[0] = char(word[0] - 'a' + 'A');
        lexicon.push_back(word);
    }
    rng.seed(seed);
    std::string text;
    while (text.size() < n_bytes) {
        double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
        size_t idx = size_t(std::pow(u, 3.0) * double(lexicon.size()));
        text += lexicon[std::min(idx, lexicon.size() - 1)];
        uint32_t r = rng() % 20;
        text += r == 0 ? ".\n" : r == 1 ? ", " : r == 2 ? " 1984 " : " ";
    }
    return text;
}

std::string random_bytes(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::string s(n, '\0');
    for (auto& c : s) c = char(rng() & 0xFF);
    return s;
}

std::string decode_all(const Tokenizer& tok, const std::vector<uint32_t>& ids) {
    return tok.decode(ids.data(), ids.size());
}

// One BPE trained once for the tests that only need "some trained tokenizer".
const Tokenizer& trained() {
    static const Tokenizer tok = quintet::tokenizer_train_bpe(synthetic_text(200000, 1), 1024, {});
    return tok;
}

}  // namespace

TEST(Tokenizer, ByteIsIdentity) {
    Tokenizer tok;  // byte
    EXPECT_EQ(tok.vocab_size(), 256);
    std::string all;
    for (int b = 0; b < 256; ++b) all += char(b);
    std::vector<uint32_t> ids = tok.encode(all);
    ASSERT_EQ(ids.size(), 256u);
    for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b], uint32_t(b));
    EXPECT_EQ(decode_all(tok, ids), all);
    EXPECT_EQ(tok.token_bytes(0xFF), std::string(1, char(0xFF)));
}

TEST(Tokenizer, BpeRoundTripsArbitraryBytes) {
    const Tokenizer& tok = trained();
    std::string weird = std::string("\x00\x00\xff\xff\xc3\x28\xa0\xa1\xe2\x28\xa1\xf0\x28\x8c\xbc"
                                    " \xff hello\x00world  \n\n  \t\r\n",
                                    38);
    for (const std::string& s : {random_bytes(100000, 7), weird, std::string(),
                                 std::string(1, '\0'), std::string(500, ' ')}) {
        std::vector<uint32_t> ids = tok.encode(s);
        for (uint32_t id : ids) ASSERT_LT(id, uint32_t(tok.vocab_size()));
        EXPECT_EQ(decode_all(tok, ids), s);
    }
    // A BPE trained on random bytes must round-trip too (merges of non-UTF-8 bytes).
    std::string noise = random_bytes(50000, 3);
    Tokenizer on_noise = quintet::tokenizer_train_bpe(noise, 300, {});
    EXPECT_EQ(decode_all(on_noise, on_noise.encode(noise)), noise);
    EXPECT_EQ(decode_all(on_noise, on_noise.encode(weird)), weird);
}

TEST(Tokenizer, BpeRoundTripsTextAndCompresses) {
    const Tokenizer& tok = trained();
    std::string text = synthetic_text(50000, 99);  // different sample, same lexicon
    std::vector<uint32_t> ids = tok.encode(text);
    EXPECT_EQ(decode_all(tok, ids), text);
    EXPECT_LT(double(ids.size()), 0.5 * double(text.size())) << ids.size() << " tokens";
}

TEST(Tokenizer, BpeTrainsExactVocabSize) {
    const Tokenizer& tok = trained();
    EXPECT_EQ(tok.kind(), "bpe");
    EXPECT_EQ(tok.vocab_size(), 1024);
    const auto& merges = tok.state().merges;
    EXPECT_EQ(merges.size(), 1024u - 256u);
    // Every token decodes to the concatenation of its merge's two parts.
    for (size_t i = 0; i < merges.size(); ++i) {
        auto [a, b] = merges[i];
        ASSERT_LT(a, 256 + i);
        ASSERT_LT(b, 256 + i);
        EXPECT_EQ(tok.token_bytes(uint32_t(256 + i)), tok.token_bytes(a) + tok.token_bytes(b));
    }
}

TEST(Tokenizer, BpeIsDeterministic) {
    std::string text = synthetic_text(100000, 5);
    Tokenizer t1 = quintet::tokenizer_train_bpe(text, 700, {});
    Tokenizer t2 = quintet::tokenizer_train_bpe(text, 700, {});
    EXPECT_EQ(t1.state().merges, t2.state().merges);
    EXPECT_EQ(t1.fingerprint(), t2.fingerprint());
    EXPECT_EQ(t1.encode(text), t2.encode(text));
}

TEST(Tokenizer, BpeMostFrequentPairFirstWithTieBreak) {
    // "ef" x3 is most frequent; "ab" and "cd" tie at x2 and the smaller pair (a, b) wins.
    Tokenizer tok = quintet::tokenizer_train_bpe("cd\nab\nef\ncd\nab\nef\nef\n", 259, {});
    using P = std::pair<uint32_t, uint32_t>;
    EXPECT_EQ(tok.state().merges, (std::vector<P>{{'e', 'f'}, {'a', 'b'}, {'c', 'd'}}));
}

TEST(Tokenizer, BpeEncodesInRankOrder) {
    std::vector<std::pair<uint32_t, uint32_t>> merges = {{'b', 'c'}, {'a', 'b'}, {'a', 256}, {'a', 'a'}, {259, 259}};
    Tokenizer tok = quintet::tokenizer_bpe(merges, false, "gpt2", "test");
    // (b,c) outranks (a,b): "abc" -> a + bc -> (a,bc)
    EXPECT_EQ(tok.encode("abc"), (std::vector<uint32_t>{258}));
    EXPECT_EQ(tok.encode("abd"), (std::vector<uint32_t>{257, 'd'}));
    // "aaaaa" -> (a,a) left to right: aa aa a -> then (aa,aa): aaaa a
    EXPECT_EQ(tok.encode("aaaaa"), (std::vector<uint32_t>{260, 'a'}));
    // Merges never cross pre-split pieces: "a b" is "a", " b".
    merges.push_back({'a', ' '});
    tok = quintet::tokenizer_bpe(merges, false, "gpt2", "test");
    EXPECT_EQ(tok.encode("a b"), (std::vector<uint32_t>{'a', ' ', 'b'}));
    EXPECT_EQ(tok.token_bytes(260), "aaaa");
}

// bpe splits with the GPT-2 pattern: contractions are pieces of their own ("don" "'t"), a long
// word is one piece, a run of spaces leaves its last one to the next word.
TEST(Tokenizer, BpeSplitsWithTheGpt2Pattern) {
    Tokenizer tok = quintet::tokenizer_bpe({{'\'', 't'}, {' ', ' '}, {' ', 'x'}}, false, "gpt2", "test");
    EXPECT_EQ(tok.encode("don't"), (std::vector<uint32_t>{'d', 'o', 'n', 256}));
    EXPECT_EQ(tok.encode("a   x"), (std::vector<uint32_t>{'a', 257, 258}));
    EXPECT_EQ(tok.state().pattern, quintet::pretokenizer_preset("gpt2"));
    // The format-1 split of old token files: "'" and "t" are different classes, no piece "'t".
    Tokenizer old = quintet::tokenizer_bpe({{'\'', 't'}}, false, "", "test");
    EXPECT_EQ(old.encode("don't"), (std::vector<uint32_t>{'d', 'o', 'n', '\'', 't'}));
    EXPECT_NE(old.fingerprint(), quintet::tokenizer_bpe({{'\'', 't'}}, false, "gpt2", "test").fingerprint());
}

TEST(Tokenizer, BpeRejectsTooSmallVocabAndReportsProgress) {
    EXPECT_THROW(quintet::tokenizer_train_bpe("hello", 256, {}), ConfigError);
    int calls = 0, last_done = -1, last_total = -1;
    quintet::tokenizer_train_bpe(synthetic_text(20000, 2), 400, [&](int done, int total) {
        ++calls;
        EXPECT_GE(done, last_done);
        last_done = done;
        last_total = total;
    });
    EXPECT_GT(calls, 1);
    EXPECT_EQ(last_done, 144);
    EXPECT_EQ(last_total, 144);
    // A text with too few pairs stops early instead of inventing merges.
    Tokenizer tiny = quintet::tokenizer_train_bpe("abab", 1000, {});
    EXPECT_LT(tiny.vocab_size(), 1000);
    EXPECT_EQ(decode_all(tiny, tiny.encode("abab")), "abab");
}

// ---------------------------------------------------------------------------------------------
// Token file

class TokenFileTest : public ::testing::Test {
protected:
    fs::path dir;
    void SetUp() override {
        dir = fs::path("/tmp") / ("quintet_test_tokenizer_" + std::to_string(::getpid()));
        fs::remove_all(dir);
        fs::create_directories(dir);
    }
    void TearDown() override { fs::remove_all(dir); }
    std::string path(const std::string& name) const { return (dir / name).string(); }

    // Builds a file by hand with the HDF5 API, for the cases token_file_write refuses to make.
    void make_h5(const std::string& p, const std::function<void(hid_t)>& fill) {
        hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
        ASSERT_GE(f, 0);
        fill(f);
        H5Fclose(f);
    }
    static void int_attr(hid_t obj, const char* name, int64_t v) {
        hid_t s = H5Screate(H5S_SCALAR);
        hid_t a = H5Acreate2(obj, name, H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT);
        H5Awrite(a, H5T_NATIVE_INT64, &v);
        H5Aclose(a);
        H5Sclose(s);
    }
    static void vlen_str_attr(hid_t obj, const char* name, const char* v) {
        hid_t t = H5Tcopy(H5T_C_S1);
        H5Tset_size(t, H5T_VARIABLE);
        hid_t s = H5Screate(H5S_SCALAR);
        hid_t a = H5Acreate2(obj, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
        H5Awrite(a, t, &v);
        H5Aclose(a);
        H5Sclose(s);
        H5Tclose(t);
    }
    template <class T>
    static void dataset(hid_t loc, const char* name, hid_t file_type, hid_t mem_type,
                        std::vector<hsize_t> dims, const std::vector<T>& data) {
        hid_t s = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
        hid_t d = H5Dcreate2(loc, name, file_type, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (!data.empty()) H5Dwrite(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data());
        H5Dclose(d);
        H5Sclose(s);
    }
    // A well-formed byte-tokenizer file, except for what `tweak` changes.
    void make_byte_file(const std::string& p, const std::vector<uint16_t>& tokens,
                        const std::function<void(hid_t)>& tweak = {}) {
        make_h5(p, [&](hid_t f) {
            int_attr(f, "format_version", 1);
            int_attr(f, "vocab_size", 256);
            vlen_str_attr(f, "tokenizer", "byte");
            dataset(f, "tokens", H5T_STD_U16LE, H5T_NATIVE_UINT16, {tokens.size()}, tokens);
            if (tweak) tweak(f);
        });
    }
    // Expects token_file_read to throw a ConfigError naming the file and containing `what`.
    void expect_bad(const std::string& p, const std::string& what) {
        try {
            quintet::token_file_read(p);
            ADD_FAILURE() << "no ConfigError for " << p << " (" << what << ")";
        } catch (const ConfigError& e) {
            std::string msg = e.what();
            EXPECT_NE(msg.find(p), std::string::npos) << msg;
            EXPECT_NE(msg.find(what), std::string::npos) << msg;
        }
    }
};

TEST_F(TokenFileTest, RoundTripsByteAndBpe) {
    std::string text = synthetic_text(30000, 4);
    Tokenizer byte;
    std::vector<uint32_t> ids = byte.encode(text);
    quintet::token_file_write(path("byte.h5"), ids, byte);
    EXPECT_FALSE(fs::exists(path("byte.h5.tmp")));
    quintet::TokenFile f = quintet::token_file_read(path("byte.h5"));
    EXPECT_EQ(f.tokens, ids);
    EXPECT_EQ(f.vocab_size, 256);
    EXPECT_EQ(f.tokenizer.kind(), "byte");
    EXPECT_EQ(f.format_version, 2);

    const Tokenizer& bpe = trained();
    ids = bpe.encode(text);
    quintet::token_file_write(path("bpe.h5"), ids, bpe);
    f = quintet::token_file_read(path("bpe.h5"));
    EXPECT_EQ(f.tokens, ids);
    EXPECT_EQ(f.vocab_size, 1024);
    EXPECT_EQ(f.tokenizer.kind(), "bpe");
    EXPECT_EQ(f.tokenizer.state(), bpe.state());
    EXPECT_EQ(decode_all(f.tokenizer, f.tokens), text);
    Tokenizer only = quintet::token_file_read_tokenizer(path("bpe.h5"));
    EXPECT_EQ(only.fingerprint(), bpe.fingerprint());
    EXPECT_EQ(only.encode(text), ids);

    // Overwriting an existing file goes through the .tmp + rename as well.
    quintet::token_file_write(path("bpe.h5"), {1, 2, 3}, bpe);
    EXPECT_EQ(quintet::token_file_read(path("bpe.h5")).tokens, (std::vector<uint32_t>{1, 2, 3}));
}

// The end-of-document token of packed data: for bpe one id after the merges (vocab + 1), for
// byte a chosen byte; recorded in the file (eos_id), checked on read, decoded as a marker.
TEST_F(TokenFileTest, EndOfDocumentTokenTravelsWithTheFile) {
    Tokenizer bpe = quintet::tokenizer_bpe_with_end_of_text(trained());  // 1024 tokens + <|endoftext|>
    EXPECT_EQ(bpe.vocab_size(), 1025);
    EXPECT_EQ(bpe.special_id(quintet::kEndOfText), 1024);
    std::vector<uint32_t> ids = bpe.encode("first document");
    ids.push_back(1024);
    auto more = bpe.encode("second");
    ids.insert(ids.end(), more.begin(), more.end());
    quintet::token_file_write(path("docs.h5"), ids, bpe, 1024);
    quintet::TokenFile f = quintet::token_file_read(path("docs.h5"));
    EXPECT_EQ(f.eos_id, 1024);
    EXPECT_EQ(f.vocab_size, 1025);
    EXPECT_EQ(f.tokens, ids);
    EXPECT_EQ(decode_all(f.tokenizer, f.tokens), std::string("first document") + quintet::kEndOfText + "second");
    Tokenizer byte;
    quintet::token_file_write(path("bdocs.h5"), {65, 0, 66}, byte, 0, 1);
    f = quintet::token_file_read(path("bdocs.h5"));
    EXPECT_EQ(f.eos_id, 0);
    EXPECT_EQ(f.bos_id, 1);
    EXPECT_EQ(f.vocab_size, 256);
    // Without documents there is no eos_id.
    quintet::token_file_write(path("plain.h5"), {1, 2}, Tokenizer{});
    EXPECT_EQ(quintet::token_file_read(path("plain.h5")).eos_id, -1);
}

TEST_F(TokenFileTest, LargeVocabIsStoredAsUint32) {
    std::vector<std::pair<uint32_t, uint32_t>> merges;
    for (uint32_t i = 0; i < 70000; ++i) merges.push_back({i % 256, (i * 7) % 256});
    Tokenizer big = quintet::tokenizer_bpe(merges, false, "gpt2", "test");
    std::vector<uint32_t> ids = {0, 255, 65535, 65536, 70255};
    quintet::token_file_write(path("big.h5"), ids, big);
    EXPECT_EQ(quintet::token_file_read(path("big.h5")).tokens, ids);
    hid_t f = H5Fopen(path("big.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "tokens", H5P_DEFAULT);
    hid_t t = H5Dget_type(d);
    EXPECT_EQ(H5Tget_size(t), 4u);
    H5Tclose(t);
    H5Dclose(d);
    H5Fclose(f);
}

TEST_F(TokenFileTest, HandMadeFileWithVlenStringIsAccepted) {
    make_byte_file(path("ok.h5"), {1, 2, 255});
    EXPECT_EQ(quintet::token_file_read(path("ok.h5")).tokens, (std::vector<uint32_t>{1, 2, 255}));
}

TEST_F(TokenFileTest, BadFilesAreConfigErrors) {
    expect_bad(path("missing.h5"), "does not exist");

    std::ofstream(path("garbage.h5")) << "this is not an HDF5 file\n" << std::string(5000, 'x');
    expect_bad(path("garbage.h5"), "not an HDF5 file");

    // A real file cut short.
    quintet::token_file_write(path("full.h5"), std::vector<uint32_t>(100000, 7), Tokenizer{});
    fs::copy_file(path("full.h5"), path("cut.h5"));
    fs::resize_file(path("cut.h5"), fs::file_size(path("full.h5")) / 2);
    EXPECT_THROW(quintet::token_file_read(path("cut.h5")), ConfigError);

    make_h5(path("no_tokens.h5"), [](hid_t f) { int_attr(f, "vocab_size", 256); });
    expect_bad(path("no_tokens.h5"), "no /tokens");

    make_byte_file(path("too_big_id.h5"), {1, 2, 3, 300, 4});
    expect_bad(path("too_big_id.h5"), "/tokens[3] = 300");

    make_byte_file(path("one_token.h5"), {65});
    expect_bad(path("one_token.h5"), "at least 2");

    make_h5(path("float.h5"), [](hid_t f) {
        int_attr(f, "vocab_size", 256);
        vlen_str_attr(f, "tokenizer", "byte");
        dataset(f, "tokens", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {3}, std::vector<float>{1, 2, 3});
    });
    expect_bad(path("float.h5"), "float32");

    make_h5(path("rank2.h5"), [](hid_t f) {
        int_attr(f, "vocab_size", 256);
        vlen_str_attr(f, "tokenizer", "byte");
        dataset(f, "tokens", H5T_STD_U16LE, H5T_NATIVE_UINT16, {2, 2},
                std::vector<uint16_t>{1, 2, 3, 4});
    });
    expect_bad(path("rank2.h5"), "rank 2");

    make_h5(path("no_vocab.h5"), [](hid_t f) {
        vlen_str_attr(f, "tokenizer", "byte");
        dataset(f, "tokens", H5T_STD_U16LE, H5T_NATIVE_UINT16, {2}, std::vector<uint16_t>{1, 2});
    });
    expect_bad(path("no_vocab.h5"), "vocab_size");

    make_byte_file(path("bad_kind.h5"), {1, 2}, [](hid_t f) {
        H5Adelete(f, "tokenizer");
        vlen_str_attr(f, "tokenizer", "sentencepiece");
    });
    expect_bad(path("bad_kind.h5"), "sentencepiece");

    make_byte_file(path("version.h5"), {1, 2}, [](hid_t f) {
        H5Adelete(f, "format_version");
        int_attr(f, "format_version", 99);
    });
    expect_bad(path("version.h5"), "format_version = 99");

    // BPE: merge count must equal vocab_size - 256, and merges may only use earlier tokens.
    auto bpe_file = [&](const std::string& name, int64_t vocab, std::vector<uint32_t> merges) {
        make_h5(path(name), [&](hid_t f) {
            int_attr(f, "vocab_size", vocab);
            vlen_str_attr(f, "tokenizer", "bpe");
            dataset(f, "tokens", H5T_STD_U16LE, H5T_NATIVE_UINT16, {2},
                    std::vector<uint16_t>{1, 2});
            hid_t g = H5Gcreate2(f, "tokenizer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
            dataset(g, "merges", H5T_STD_U32LE, H5T_NATIVE_UINT32, {merges.size() / 2, 2},
                    merges);
            H5Gclose(g);
        });
    };
    bpe_file("merge_count.h5", 300, {97, 98, 256, 99});
    expect_bad(path("merge_count.h5"), "2 merges but vocab_size = 300");
    bpe_file("merge_future.h5", 258, {97, 257, 97, 98});
    expect_bad(path("merge_future.h5"), "merge 0 = (97, 257)");
    bpe_file("merge_ok.h5", 258, {97, 98, 256, 99});
    EXPECT_EQ(quintet::token_file_read(path("merge_ok.h5")).tokenizer.token_bytes(257), "abc");
    EXPECT_THROW(quintet::token_file_read_tokenizer(path("merge_count.h5")), ConfigError);
    // A format-1 bpe keeps the split it was made with: "don't" has no piece "'t".
    bpe_file("format1.h5", 257, {39, 116});
    EXPECT_EQ(quintet::token_file_read(path("format1.h5")).tokenizer.encode("don't"),
              (std::vector<uint32_t>{'d', 'o', 'n', '\'', 't'}));
    EXPECT_EQ(quintet::token_file_read(path("format1.h5")).format_version, 1);

    // Format 2: the tokenizer group must agree with the header.
    quintet::token_file_write(path("v2.h5"), {1, 2}, trained());
    fs::copy_file(path("v2.h5"), path("v2_vocab.h5"));
    {
        hid_t f = H5Fopen(path("v2_vocab.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
        H5Adelete(f, "vocab_size");
        int_attr(f, "vocab_size", 2000);
        H5Fclose(f);
    }
    expect_bad(path("v2_vocab.h5"), "vocab_size = 2000 but its tokenizer");
}

TEST_F(TokenFileTest, FailedWriteLeavesNoFile) {
    std::string p = path("no_such_dir/out.h5");
    EXPECT_THROW(quintet::token_file_write(p, {1, 2}, Tokenizer{}), quintet::IoError);
    EXPECT_FALSE(fs::exists(p));
    EXPECT_FALSE(fs::exists(p + ".tmp"));
}
