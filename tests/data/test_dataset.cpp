// The data pipeline below the trainer (docs/data.md): sources of many shards read a sample at a
// time, the blending rule on every prefix, shuffle's exactly-once epochs, the prefetch giving the
// same tokens as direct reads, and the bad inputs each named.
// ctest: labels=unit
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "quintet/core/error.hpp"
#include "quintet/data/dataset.hpp"
#include "quintet/data/sampler.hpp"
#include "quintet/io/token_data.hpp"
#include "quintet/tokenizer/byte_bpe.hpp"
#include "support/run_support.hpp"

namespace fs = std::filesystem;
using namespace quintet;
using quintet::testing::scratch_dir;

namespace {

// n tokens: a pattern that names its position (so a read at the wrong place shows).
std::vector<uint32_t> pattern(size_t n, uint32_t salt) {
    std::vector<uint32_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = uint32_t((i * 7 + salt + i / 251) % 256);
    return v;
}

std::string write(const fs::path& p, const std::vector<uint32_t>& t, const Tokenizer& tok = tokenizer_byte()) {
    token_file_write(p.string(), t, tok);
    return p.string();
}

DataConfig config(const std::string& path, int T, const std::string& order = "random", double val = 0.0) {
    DataConfig dc;
    dc.path = path;
    dc.seq_len = T;
    dc.order = order;
    dc.val_fraction = val;
    dc.allow_incomplete = true;  // directories made here by hand, without a manifest
    return dc;
}

template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const std::exception& e) {
        return e.what();
    }
    return "(no error)";
}

}  // namespace

// A source of three shards reads as one stream, circularly, exactly as the whole file would.
TEST(Dataset, ShardsReadAsOneStream) {
    const fs::path dir = scratch_dir("dataset_stream");
    const auto all = pattern(3000, 5);
    fs::create_directories(dir / "web");
    write(dir / "web" / "b.h5", {all.begin() + 1000, all.begin() + 1700});
    write(dir / "web" / "a.h5", {all.begin(), all.begin() + 1000});  // sorted by name, not by write
    write(dir / "web" / "c.h5", {all.begin() + 1700, all.end()});
    write(dir / "whole.h5", all);
    for (const std::string spec : {(dir / "web").string() + "/", (dir / "web" / "*.h5").string()}) {
        const DataSet d = data_open(config(spec, 16));
        ASSERT_EQ(d.train.size(), 1u);
        EXPECT_EQ(d.train[0].n_tokens, 3000);
        EXPECT_EQ(d.train[0].name, "web");
        TokenReader r(d);
        EXPECT_EQ(r.width(), 2);
        for (int64_t o : {0, 990, 999, 1000, 1650, 2990, 2999, 4321}) {
            std::vector<uint16_t> got(40);
            r.read(d.train[0], o, 40, got.data(), 2);
            for (int k = 0; k < 40; ++k) ASSERT_EQ(got[size_t(k)], all[size_t((o + k) % 3000)]) << spec << " o=" << o;
        }
    }
}

// The old single-file path: random and sequential pick the offsets they always did.
TEST(Dataset, SingleSourceOffsetsUnchanged) {
    const fs::path dir = scratch_dir("dataset_single");
    const auto all = pattern(5000, 1);
    const std::string f = write(dir / "t.h5", all);
    const DataSet d = data_open(config(f, 32, "sequential", 0.1));
    EXPECT_EQ(d.train[0].len, 5000 - 500);
    EXPECT_EQ(d.val[0].begin, 4500);
    Sampler s(d, config(f, 32, "sequential", 0.1), 7);
    const int64_t gb = 6;
    for (int64_t step = 0; step < 40; ++step)
        for (int64_t j = 0; j < gb; ++j) EXPECT_EQ(s.train_ref(step, j, gb).offset, ((step * gb + j) * 32) % 4500);
    std::vector<int32_t> ids(32), tgt(32);
    s.val_sample(0, 3, 1, 2, ids.data(), tgt.data());
    for (int k = 0; k < 32; ++k) EXPECT_EQ(uint32_t(ids[size_t(k)]), all[size_t(4500 + ((3 * 2 + 1) * 32 + k) % 500)]);
}

// Blending: with weights, every prefix of the run holds each source's share to within one sample,
// and source_samples counts them; without weights, sources weigh by their tokens.
TEST(Dataset, BlendingRuleHoldsOnEveryPrefix) {
    for (const std::vector<double>& w : {std::vector<double>{0.7, 0.3}, {0.5, 0.3, 0.2}, {1, 1, 1}, {0.05, 0.9, 0.05},
                                         {3, 0, 1}}) {
        Blend b(w);
        double sum = 0;
        for (double x : w) sum += x;
        for (int64_t n = 1; n <= 20000; ++n) {
            b.next();
            for (size_t i = 0; i < w.size(); ++i)
                ASSERT_LT(std::abs(double(b.counts()[i]) - w[i] / sum * double(n)), 1.0)
                    << "source " << i << " after " << n << " samples";
        }
    }
    const fs::path dir = scratch_dir("dataset_blend");
    write(dir / "a.h5", pattern(4000, 1));
    write(dir / "b.h5", pattern(1000, 2));
    const std::string spec = (dir / "a.h5").string() + ", " + (dir / "b.h5").string();
    const DataSet d = data_open(config(spec, 8));
    Sampler s(d, config(spec, 8), 3);
    const auto c = s.source_samples(1000);
    EXPECT_EQ(c[0], 800);
    EXPECT_EQ(c[1], 200);
    // A sample never crosses sources: each source's k-th sample under sequential is at k * T.
    const std::string wspec = "0.25 " + (dir / "a.h5").string() + ", 0.75 " + (dir / "b.h5").string();
    const DataSet dw = data_open(config(wspec, 8, "sequential"));
    Sampler sw(dw, config(wspec, 8, "sequential"), 3);
    std::vector<int64_t> k(2, 0);
    for (int64_t step = 0; step < 50; ++step)
        for (int64_t j = 0; j < 8; ++j) {
            const auto r = sw.train_ref(step, j, 8);
            EXPECT_EQ(r.offset, (k[size_t(r.source)]++ * 8) % dw.train[size_t(r.source)].len);
        }
    EXPECT_EQ(sw.source_samples(400), k);
}

// shuffle: every sample of each source exactly once per epoch, a new order each epoch, and the
// same tokens whichever rank reads which part of the step (two layouts: one reader of the whole
// step; five readers of two samples each, through the prefetch).
TEST(Dataset, ShuffleVisitsEverySampleOncePerEpoch) {
    for (uint64_t n : {1ull, 2ull, 3ull, 5ull, 64ull, 1000ull, 4097ull}) {
        std::set<uint64_t> seen;
        for (uint64_t x = 0; x < n; ++x) seen.insert(permute_index(x, n, 99 + n));
        EXPECT_EQ(seen.size(), n);
        EXPECT_LT(*seen.rbegin(), n);
    }
    const fs::path dir = scratch_dir("dataset_shuffle");
    write(dir / "a.h5", pattern(8 * 37 + 1, 1));   // 37 samples of T = 8
    write(dir / "b.h5", pattern(8 * 100 + 5, 2));  // 100 samples
    const std::string spec = "0.3 " + (dir / "a.h5").string() + ", 0.7 " + (dir / "b.h5").string();
    const DataConfig dc = config(spec, 8, "shuffle");
    const DataSet d = data_open(dc);
    Sampler s(d, dc, 11);
    const int64_t gb = 10, steps = 100;  // 1000 samples: 300 of a (8+ epochs), 700 of b (7 epochs)
    std::map<std::pair<int, int64_t>, std::vector<int64_t>> order;  // (source, epoch) -> offsets
    std::vector<int64_t> k(2, 0);
    for (int64_t step = 0; step < steps; ++step)
        for (int64_t j = 0; j < gb; ++j) {
            const auto r = s.train_ref(step, j, gb);
            const int64_t m = r.source == 0 ? 37 : 100;
            order[{r.source, k[size_t(r.source)]++ / m}].push_back(r.offset);
        }
    for (const auto& [key, offs] : order) {
        const int64_t m = key.first == 0 ? 37 : 100;
        if (int64_t(offs.size()) < m) continue;  // the epoch in progress
        std::set<int64_t> u(offs.begin(), offs.end());
        EXPECT_EQ(int64_t(u.size()), m) << "source " << key.first << " epoch " << key.second;
        for (int64_t o : offs) EXPECT_EQ(o % 8, 0);
        if (key.second > 0) EXPECT_NE(offs, (order[{key.first, key.second - 1}]));
    }
    // Two layouts read the same tokens for every sample, with resumes in the middle of an epoch.
    Sampler whole(d, dc, 11);
    whole.prefetch_range(0, gb, gb);
    std::vector<std::unique_ptr<Sampler>> parts;
    for (int r = 0; r < 5; ++r) {
        parts.push_back(std::make_unique<Sampler>(d, dc, 11));
        parts.back()->prefetch_range(2 * r, 2 * r + 2, gb);
    }
    std::vector<int32_t> a(8), at(8), b(8), bt(8);
    for (int64_t step : {0, 1, 2, 3, 40, 41, 42, 7, 8, 99}) {  // 40 and 7: resumes, out of order
        for (int64_t j = 0; j < gb; ++j) {
            whole.train_sample(step, j, gb, a.data(), at.data());
            parts[size_t(j / 2)]->train_sample(step, j, gb, b.data(), bt.data());
            ASSERT_EQ(a, b) << "step " << step << " sample " << j;
            ASSERT_EQ(at, bt);
            Sampler fresh(d, dc, 11);  // no prefetch, a fresh blend: a resume at this step
            fresh.train_sample(step, j, gb, b.data(), bt.data());
            ASSERT_EQ(a, b) << "resume at step " << step;
        }
    }
}

// data.val_path: separate validation sources, each evaluated whole; the train sources whole.
TEST(Dataset, ValidationSources) {
    const fs::path dir = scratch_dir("dataset_val");
    write(dir / "train.h5", pattern(1000, 1));
    write(dir / "v1.h5", pattern(333, 2));
    write(dir / "v2.h5", pattern(100, 3));
    DataConfig dc = config((dir / "train.h5").string(), 10, "random", 0.2);
    dc.val_path = (dir / "v1.h5").string() + "," + (dir / "v2.h5").string();
    const DataSet d = data_open(dc);
    EXPECT_EQ(d.train[0].len, 1000);  // val_fraction does not apply
    ASSERT_EQ(d.val.size(), 2u);
    EXPECT_EQ(d.val[0].name, "v1");
    Sampler s(d, dc, 1);
    EXPECT_EQ(s.val_batches(0, 4, 0), 33 / 4);  // floor((333 - 1) / 10) = 33 samples
    EXPECT_EQ(s.val_batches(1, 4, 0), 9 / 4);
    EXPECT_EQ(s.val_batches(1, 4, 5), 5);
}

// Bad input, each named: the key, the file(s), what is valid.
TEST(Dataset, BadInputsAreNamed) {
    const fs::path dir = scratch_dir("dataset_bad");
    const std::string a = write(dir / "a.h5", pattern(500, 1));
    fs::create_directories(dir / "empty");
    auto open = [&](const std::string& path) { return error_of([&] { data_open(config(path, 8)); }); };
    EXPECT_NE(open((dir / "missing.h5").string()).find("no such file"), std::string::npos);
    EXPECT_NE(open((dir / "empty").string()).find("holds no *.h5"), std::string::npos);
    EXPECT_NE(open((dir / "*.nope").string()).find("matches no files"), std::string::npos);
    EXPECT_NE(open("-0.5 " + a).find("valid: a number >= 0"), std::string::npos);
    EXPECT_NE(open("0 " + a + ", 0 " + a).find("all zero"), std::string::npos);
    EXPECT_NE(open("0.5 " + a + ", " + a).find("gives weights to 1 of 2"), std::string::npos);
    EXPECT_NE(open(a + ",, " + a).find("empty item"), std::string::npos);
    EXPECT_NE(open(a).find("(no error)"), std::string::npos);
    // Different tokenizers: both files named.
    const std::string b = write(dir / "b.h5", pattern(500, 2), tokenizer_bpe({{'a', 'b'}}, false, "gpt2", "test"));
    const std::string e = open(a + ", " + b);
    EXPECT_NE(e.find("a.h5"), std::string::npos) << e;
    EXPECT_NE(e.find("b.h5"), std::string::npos) << e;
    EXPECT_NE(e.find("one tokenizer"), std::string::npos) << e;
    // A source too short for one sample.
    EXPECT_NE(error_of([&] { data_open(config(a, 600)); }).find("'data.seq_len' = '600'"), std::string::npos);
    // Not a token file: exit 2 at the start, named.
    { std::ofstream(dir / "junk.h5") << "not hdf5"; }
    const std::string j = open((dir / "junk.h5").string());
    EXPECT_NE(j.find("junk.h5"), std::string::npos) << j;
    EXPECT_NE(j.find("data.path"), std::string::npos) << j;
    // A shard corrupted after the start (an id beyond the vocabulary): the read names it, as an
    // IoError (exit status 4 during a run).
    const std::string c = write(dir / "c.h5", pattern(500, 3));
    const DataSet d = data_open(config(c, 8, "sequential"));
    const TokenFileHeader h = token_file_header(c);
    {
        std::fstream f(c, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(h.file_offset + 2 * 100);
        const uint16_t bad = 4000;
        f.write(reinterpret_cast<const char*>(&bad), 2);
    }
    Sampler s(d, config(c, 8, "sequential"), 1);
    s.prefetch_range(0, 4, 4);
    std::vector<int32_t> ids(8), tgt(8);
    bool io = false;
    std::string what;
    try {
        for (int64_t step = 0; step < 10; ++step)
            for (int j = 0; j < 4; ++j) s.train_sample(step, j, 4, ids.data(), tgt.data());
    } catch (const IoError& x) {
        io = true;
        what = x.what();
    }
    EXPECT_TRUE(io);
    EXPECT_NE(what.find("c.h5"), std::string::npos) << what;
    EXPECT_NE(what.find("[100] = 4000"), std::string::npos) << what;
}

// A /tokens that is not one contiguous run (chunked and compressed, as h5py may write it) is
// read through HDF5 hyperslabs on the calling thread: the same tokens.
TEST(Dataset, ChunkedTokensReadThroughHdf5) {
    const fs::path dir = scratch_dir("dataset_chunked");
    const auto all = pattern(5000, 9);
    write(dir / "plain.h5", all);
    fs::copy_file(dir / "plain.h5", dir / "chunked.h5");
    {
        hid_t f = H5Fopen((dir / "chunked.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
        ASSERT_GE(f, 0);
        H5Ldelete(f, "tokens", H5P_DEFAULT);
        const hsize_t n = all.size(), chunk = 512;
        hid_t sp = H5Screate_simple(1, &n, nullptr), dcpl = H5Pcreate(H5P_DATASET_CREATE);
        H5Pset_chunk(dcpl, 1, &chunk);
        H5Pset_deflate(dcpl, 4);
        hid_t ds = H5Dcreate2(f, "tokens", H5T_STD_U16LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
        ASSERT_GE(H5Dwrite(ds, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, all.data()), 0);
        H5Dclose(ds), H5Pclose(dcpl), H5Sclose(sp), H5Fclose(f);
    }
    const DataConfig dc = config((dir / "chunked.h5").string(), 16, "random", 0.1);
    const DataSet d = data_open(dc);
    EXPECT_TRUE(d.any_hdf5_reads);
    EXPECT_EQ(d.train[0].shards[0].file_offset, -1);
    const DataConfig pc = config((dir / "plain.h5").string(), 16, "random", 0.1);
    const DataSet p = data_open(pc);
    EXPECT_FALSE(p.any_hdf5_reads);
    Sampler a(d, dc, 4), b(p, pc, 4);
    a.prefetch_range(0, 4, 4);
    std::vector<int32_t> x(16), xt(16), y(16), yt(16);
    for (int64_t s = 0; s < 20; ++s)
        for (int64_t j = 0; j < 4; ++j) {
            a.train_sample(s, j, 4, x.data(), xt.data());
            b.train_sample(s, j, 4, y.data(), yt.data());
            ASSERT_EQ(x, y);
            ASSERT_EQ(xt, yt);
        }
    a.val_sample(0, 2, 1, 2, x.data(), xt.data());
    b.val_sample(0, 2, 1, 2, y.data(), yt.data());
    EXPECT_EQ(x, y);
}

// More shards than the reader keeps open (it closes the least recently used): random reads over
// all of them still give the stream.
TEST(Dataset, MoreShardsThanOpenFiles) {
    const fs::path dir = scratch_dir("dataset_many");
    const auto all = pattern(300 * 40, 4);
    for (int i = 0; i < 300; ++i) {
        char name[32];
        std::snprintf(name, sizeof name, "s_%03d.h5", i);
        write(dir / name, {all.begin() + 40 * i, all.begin() + 40 * (i + 1)});
    }
    const DataSet d = data_open(config(dir.string(), 8, "random"));
    ASSERT_EQ(d.train[0].shards.size(), 300u);
    TokenReader r(d);
    std::vector<uint16_t> got(50);
    for (int64_t i = 0; i < 2000; ++i) {
        const int64_t o = (i * 7919) % int64_t(all.size());
        r.read(d.train[0], o, 50, got.data(), 2);
        for (int k = 0; k < 50; ++k) ASSERT_EQ(got[size_t(k)], all[size_t((o + k) % all.size())]) << o;
    }
}
