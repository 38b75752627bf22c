#include "support/run_support.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "quintet/io/h5.hpp"
#include "quintet/io/token_data.hpp"

namespace fs = std::filesystem;

namespace quintet::testing {

RunResult run_quintet(int ranks, const std::string& args) {
    std::string cmd;
    if (ranks > 0)
        cmd = std::string(QUINTET_MPIEXEC) + " --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1 -n " +
              std::to_string(ranks) + " ";
    cmd += std::string(QUINTET_BINARY) + " " + args + " 2>&1";
    RunResult r;
    FILE* p = popen(cmd.c_str(), "r");
    std::array<char, 4096> buf;
    while (size_t n = fread(buf.data(), 1, buf.size(), p)) r.output.append(buf.data(), n);
    int st = pclose(p);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    return r;
}

RunResult run_shell(const std::string& command) {
    RunResult r;
    FILE* p = popen((command + " 2>&1").c_str(), "r");
    std::array<char, 4096> buf;
    while (size_t n = fread(buf.data(), 1, buf.size(), p)) r.output.append(buf.data(), n);
    int st = pclose(p);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    return r;
}

std::string read_file(const fs::path& p) {
    std::ifstream f(p);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

void write_file(const fs::path& p, const std::string& text) {
    std::ofstream f(p);
    f << text;
}

fs::path scratch_dir(const std::string& name) {
    fs::path d = fs::current_path() / "scratch" / name;
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
}

std::vector<double> metrics_column(const fs::path& run_dir, const std::string& path) {
    h5::silence_errors();
    std::string f = (run_dir / "metrics.h5").string();
    h5::Handle file = h5::file(h5::check(H5Fopen(f.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "open " + f));
    h5::Handle ds = h5::dataset(h5::check(H5Dopen2(file, path.c_str(), H5P_DEFAULT), "open " + path));
    size_t n = 1;  // every element, row-major ([step, layer, expert] for /moe/expert_load)
    for (hsize_t d : h5::dataset_shape(ds)) n *= size_t(d);
    std::vector<double> v(n);
    if (!v.empty()) H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    return v;
}

namespace {
herr_t collect(hid_t loc, const char* name, const H5O_info_t* info, void* op) {
    if (info->type != H5O_TYPE_DATASET) return 0;
    // The tensors (not /tokenizer's bytes, nor the run state of /train_state).
    if (std::strncmp(name, "params/", 7) != 0 && std::strncmp(name, "optim/", 6) != 0) return 0;
    auto* out = static_cast<std::vector<std::pair<std::string, std::vector<float>>>*>(op);
    h5::Handle ds = h5::dataset(H5Dopen2(loc, name, H5P_DEFAULT));
    h5::Handle sp = h5::space(H5Dget_space(ds));
    std::vector<float> v(H5Sget_simple_extent_npoints(sp));
    H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    out->emplace_back(name, std::move(v));
    return 0;
}
}  // namespace

std::vector<std::pair<std::string, std::vector<float>>> checkpoint_tensors(const std::string& f) {
    h5::silence_errors();
    std::vector<std::pair<std::string, std::vector<float>>> out;
    h5::Handle file = h5::file(h5::check(H5Fopen(f.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "open " + f));
    H5Ovisit2(file, H5_INDEX_NAME, H5_ITER_INC, collect, &out, H5O_INFO_BASIC);
    return out;
}

namespace {
// Every object's path under a file (groups and datasets), root first.
herr_t list_objects(hid_t, const char* name, const H5O_info_t*, void* op) {
    static_cast<std::vector<std::string>*>(op)->push_back(name);
    return 0;
}
herr_t list_attrs(hid_t, const char* name, const H5A_info_t*, void* op) {
    static_cast<std::vector<std::string>*>(op)->push_back(name);
    return 0;
}
// The raw bytes of an attribute or a dataset, read with its own (file) type converted to the
// native one: equal values give equal bytes.
std::vector<char> attr_bytes(hid_t a) {
    h5::Handle t = h5::type(H5Aget_type(a));
    h5::Handle n = h5::type(H5Tget_native_type(t, H5T_DIR_ASCEND));
    h5::Handle sp = h5::space(H5Aget_space(a));
    std::vector<char> v(size_t(H5Sget_simple_extent_npoints(sp)) * H5Tget_size(n) + 1, 0);
    H5Aread(a, n, v.data());
    return v;
}
std::vector<char> dataset_bytes(hid_t d) {
    h5::Handle t = h5::type(H5Dget_type(d));
    h5::Handle n = h5::type(H5Tget_native_type(t, H5T_DIR_ASCEND));
    h5::Handle sp = h5::space(H5Dget_space(d));
    std::vector<char> v(size_t(H5Sget_simple_extent_npoints(sp)) * H5Tget_size(n) + 1, 0);
    if (v.size() > 1) H5Dread(d, n, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    return v;
}
}  // namespace

std::string checkpoint_difference(const std::string& a, const std::string& b, const std::vector<std::string>& except) {
    h5::silence_errors();
    h5::Handle fa = h5::file(H5Fopen(a.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    h5::Handle fb = h5::file(H5Fopen(b.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    if (!fa.valid() || !fb.valid()) return "cannot open " + (fa.valid() ? b : a);
    std::vector<std::string> oa, ob;
    H5Ovisit2(fa, H5_INDEX_NAME, H5_ITER_INC, list_objects, &oa, H5O_INFO_BASIC);
    H5Ovisit2(fb, H5_INDEX_NAME, H5_ITER_INC, list_objects, &ob, H5O_INFO_BASIC);
    if (oa != ob) return "the files hold different objects (" + std::to_string(oa.size()) + " and " +
                         std::to_string(ob.size()) + ")";
    for (const std::string& name : oa) {
        h5::Handle xa(H5Oopen(fa, name.c_str(), H5P_DEFAULT), H5Oclose), xb(H5Oopen(fb, name.c_str(), H5P_DEFAULT), H5Oclose);
        std::vector<std::string> aa, ab;
        hsize_t i = 0;
        H5Aiterate2(xa, H5_INDEX_NAME, H5_ITER_INC, &i, list_attrs, &aa);
        i = 0;
        H5Aiterate2(xb, H5_INDEX_NAME, H5_ITER_INC, &i, list_attrs, &ab);
        if (aa != ab) return name + ": different attributes";
        for (const std::string& at : aa) {
            if (name == "." && std::find(except.begin(), except.end(), at) != except.end()) continue;
            h5::Handle pa = h5::attr(H5Aopen(xa, at.c_str(), H5P_DEFAULT)), pb = h5::attr(H5Aopen(xb, at.c_str(), H5P_DEFAULT));
            if (attr_bytes(pa) != attr_bytes(pb)) return name + ": attribute " + at + " differs";
        }
        H5O_info_t info;
        H5Oget_info2(xa, &info, H5O_INFO_BASIC);
        if (info.type != H5O_TYPE_DATASET) continue;
        if (h5::dataset_shape(xa) != h5::dataset_shape(xb)) return name + ": different shapes";
        if (dataset_bytes(xa) != dataset_bytes(xb)) return name + ": different values";
    }
    return "";
}

void make_token_file(const fs::path& p, size_t n, int V, uint32_t seed) {
    std::mt19937 g(seed);
    std::vector<uint32_t> t(n);
    uint32_t x = 0;
    for (size_t i = 0; i < n; ++i) {
        x = (g() % 5 == 0) ? g() % V : (x * 7 + 3) % V;
        t[i] = x;
    }
    Tokenizer tok;  // byte tokenizer: vocab 256
    token_file_write(p.string(), t, tok);
}

void make_document_token_file(const fs::path& p, size_t n, uint32_t eos, uint32_t seed) {
    std::mt19937 g(seed);
    std::vector<uint32_t> t;
    uint32_t x = 0;
    for (size_t i = 0; i < n; ++i) {
        if (g() % 9 == 0) {
            t.push_back(eos);
            continue;
        }
        x = (g() % 5 == 0) ? g() % 250 : (x * 7 + 3) % 250;
        t.push_back(x);
    }
    token_file_write(p.string(), t, Tokenizer{}, int(eos));
}

std::vector<std::string> TrainFixture::compare_layouts(const std::string& model,
                                                       const std::vector<std::pair<int, std::string>>& layouts,
                                                       double tol, double min_drop, size_t steps) {
    // Each call starts afresh: a run dir left by an earlier call would be resumed, not re-run.
    fs::remove_all(dir / "ref");
    auto ref = train(1, "ref", model + " --parallel.microbatches=8");
    EXPECT_EQ(ref.status, 0) << ref.output;
    if (ref.status != 0) return {};
    auto lref = metrics_column(dir / "ref", "/train/loss"), eref = metrics_column(dir / "ref", "/eval/loss");
    EXPECT_EQ(lref.size(), steps);
    if (lref.size() != steps) return {};
    EXPECT_LT(lref.back(), lref.front() - min_drop);
    std::vector<std::string> names;
    for (const auto& [ranks, args] : layouts) {
        const std::string name = "l" + std::to_string(names.size());
        names.push_back(name);
        fs::remove_all(dir / name);
        auto r = train(ranks, name, model + " " + args);
        EXPECT_EQ(r.status, 0) << args << "\n" << r.output;
        if (r.status != 0) continue;
        auto l = metrics_column(dir / name, "/train/loss"), e = metrics_column(dir / name, "/eval/loss");
        EXPECT_EQ(l.size(), lref.size()) << args;
        EXPECT_EQ(e.size(), eref.size()) << args;
        for (size_t i = 0; i < std::min(l.size(), lref.size()); ++i)
            EXPECT_LE(std::abs(l[i] - lref[i]), tol * std::abs(lref[i])) << model << " " << args << " step " << i + 1;
        for (size_t i = 0; i < std::min(e.size(), eref.size()); ++i)
            EXPECT_LE(std::abs(e[i] - eref[i]), tol * std::abs(eref[i])) << model << " " << args << " eval " << i;
    }
    return names;
}

void expect_close(const std::vector<double>& a, const std::vector<double>& b, double rel, const std::string& what,
                  size_t from) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t i = from; i < a.size(); ++i)
        EXPECT_LE(std::abs(a[i] - b[i]), rel * std::abs(b[i])) << what << " at row " << i;
}

void TrainFixture::prepare(const std::string& prefix, const char* deck_text, uint32_t seed) {
    dir = scratch_dir(prefix + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    deck = dir / "tiny.deck";
    data = dir / "tokens.h5";
    write_file(deck, deck_text);
    make_token_file(data, 20000, 256, seed);
}

RunResult TrainFixture::train(int ranks, const std::string& name, const std::string& extra) {
    return run_quintet(ranks, "train " + deck.string() + " --data.path=" + data.string() +
                                  " --output.run_dir=" + (dir / name).string() + " " + extra);
}

}  // namespace quintet::testing
