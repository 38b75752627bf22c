#include "quintet/data/dataset.hpp"

#include <fcntl.h>
#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include "quintet/core/checksum.hpp"
#include "quintet/core/error.hpp"
#include "quintet/data/corpus_manifest.hpp"
#include "quintet/io/token_data.hpp"

namespace quintet {
namespace fs = std::filesystem;

namespace {

std::string trim(const std::string& s) {
    const size_t a = s.find_first_not_of(" \t\n\r"), b = s.find_last_not_of(" \t\n\r");
    return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

bool has_glob(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// "web/" -> web, "code/*.h5" -> code, "data/a.h5" -> a; characters other than [A-Za-z0-9._-]
// become '_' so the name is one HDF5 path component.
std::string source_name(const std::string& spec) {
    std::string s = spec;
    while (s.size() > 1 && s.back() == '/') s.pop_back();
    fs::path p(s);
    while (has_glob(p.filename().string()) && p.has_parent_path() && p.parent_path() != p) p = p.parent_path();
    std::string name = p.filename().string();
    if (has_glob(name)) name = "glob";
    if (name.size() > 3 && name.compare(name.size() - 3, 3, ".h5") == 0) name.resize(name.size() - 3);
    for (char& c : name)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '_';
    if (name.empty() || name == "." || name == "..") name = "source";
    return name;
}

}  // namespace

std::vector<std::pair<double, std::string>> parse_source_list(const std::string& key, const std::string& value) {
    std::vector<std::pair<double, std::string>> out;
    size_t at = 0;
    while (at <= value.size()) {
        size_t comma = value.find(',', at);
        if (comma == std::string::npos) comma = value.size();
        const std::string item = trim(value.substr(at, comma - at));
        at = comma + 1;
        if (item.empty())
            config_fail(key, value, "has an empty item; valid: a comma list of sources, each a token file, a "
                                    "directory or a glob, optionally preceded by a weight (\"0.7 web/, 0.3 code/*.h5\")");
        double w = -1;
        std::string spec = item;
        if (const size_t sp = item.find_first_of(" \t"); sp != std::string::npos) {
            const std::string first = item.substr(0, sp);
            char* end = nullptr;
            const double v = std::strtod(first.c_str(), &end);
            if (end && *end == '\0' && !first.empty()) {
                if (!std::isfinite(v) || v < 0)
                    config_fail(key, value, "weight " + first + " of source '" + trim(item.substr(sp)) +
                                                "' is not allowed; valid: a number >= 0");
                w = v;
                spec = trim(item.substr(sp));
            }
        }
        out.emplace_back(w, spec);
    }
    const size_t weighted = size_t(std::count_if(out.begin(), out.end(), [](auto& p) { return p.first >= 0; }));
    if (weighted != 0 && weighted != out.size())
        config_fail(key, value, "gives weights to " + std::to_string(weighted) + " of " + std::to_string(out.size()) +
                                    " sources; give every source a weight, or none (then sources are weighted by "
                                    "their tokens)");
    if (weighted && std::all_of(out.begin(), out.end(), [](auto& p) { return p.first == 0; }))
        config_fail(key, value, "has weights that are all zero; valid: weights >= 0 with at least one above zero");
    return out;
}

namespace {

// A directory's manifest, read once per data_open (directories are named by several sources and
// globs): whether it has one, the manifest, what in the directory disagrees with it.
struct CorpusDir {
    bool has_manifest = false;
    CorpusManifest manifest;
    std::map<std::string, size_t> shard_of;  // file name -> index in manifest.shards
    std::string problem;                     // manifest_disagreement; "" when they agree
};

std::map<std::string, CorpusDir>& corpus_dirs() {
    static thread_local std::map<std::string, CorpusDir> cache;
    return cache;
}

const CorpusDir& corpus_dir(const std::string& dir) {
    auto& cache = corpus_dirs();
    std::error_code ec;
    const std::string key = fs::weakly_canonical(dir.empty() ? "." : dir, ec).string();
    if (const auto it = cache.find(key); it != cache.end()) return it->second;
    CorpusDir c;
    c.manifest = manifest_read(dir.empty() ? "." : dir, c.has_manifest);
    if (c.has_manifest) {
        for (size_t i = 0; i < c.manifest.shards.size(); ++i) c.shard_of[c.manifest.shards[i].file] = i;
        c.problem = manifest_disagreement(dir.empty() ? "." : dir, c.manifest);
    }
    return cache.emplace(key, std::move(c)).first->second;
}

std::string parent_of(const std::string& file) { return fs::path(file).parent_path().string(); }

bool is_corpus_tokenizer(const std::string& file) {
    const CorpusDir& c = corpus_dir(parent_of(file));
    return c.has_manifest && fs::path(file).filename() == c.manifest.tokenizer_file;
}

std::string incomplete_advice(const std::string& dir) {
    std::error_code ec;
    const bool interrupted = fs::exists(fs::path(dir) / ".prepare", ec);
    return std::string(interrupted ? " (an interrupted prepare: run the same `quintet prepare` with --resume)"
                                   : " (made by hand, by an older quintet, or by a prepare that did not finish)") +
           "; set data.allow_incomplete = true to use it as it is";
}

}  // namespace

std::vector<std::string> expand_source(const std::string& key, const std::string& spec, bool allow_incomplete) {
    std::vector<std::string> files;
    std::error_code ec;
    auto h5_files = [&](const std::string& dir) {
        for (const auto& e : fs::directory_iterator(dir, ec))
            if (e.path().extension() == ".h5" && !e.is_directory() && !is_corpus_tokenizer(e.path().string()) &&
                e.path().filename() != kCorpusTokenizerName)
                files.push_back(e.path().string());
        std::sort(files.begin(), files.end());
    };
    if (has_glob(spec)) {
        glob_t g{};
        const int rc = ::glob(spec.c_str(), 0, nullptr, &g);
        for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i)
            if (!fs::is_directory(g.gl_pathv[i], ec) && !is_corpus_tokenizer(g.gl_pathv[i])) files.emplace_back(g.gl_pathv[i]);
        globfree(&g);
        if (files.empty()) config_fail(key, spec, "the glob matches no files");
        std::sort(files.begin(), files.end());
    } else if (fs::is_directory(spec, ec)) {
        const CorpusDir& c = corpus_dir(spec);
        if (c.has_manifest && (c.problem.empty() || !allow_incomplete)) {
            if (!c.problem.empty())
                config_fail(key, spec, "the corpus does not agree with its manifest: " + c.problem +
                                           "; `quintet data verify` checks it whole, `quintet prepare` makes it again, "
                                           "data.allow_incomplete = true uses it as it is");
            for (const auto& sh : c.manifest.shards) files.push_back((fs::path(spec) / sh.file).string());
        } else {
            if (!c.has_manifest && !allow_incomplete)
                config_fail(key, spec, "the directory has no manifest.json, so it is not a complete corpus" +
                                           incomplete_advice(spec));
            h5_files(spec);
            if (files.empty())
                config_fail(key, spec, "the directory holds no *.h5 token files (make some with `quintet prepare "
                                       "--shard-tokens N --output DIR`)");
        }
    } else {
        if (!fs::exists(spec, ec))
            config_fail(key, spec, "no such file, directory or glob; make a token file with `quintet prepare`");
        files.push_back(spec);
    }
    return files;
}
int64_t DataSet::train_tokens() const {
    int64_t n = 0;
    for (const auto& s : train) n += s.len;
    return n;
}

DataSet data_open(const DataConfig& dc) {
    corpus_dirs().clear();  // each open reads the manifests as they are now
    DataSet out;
    uint64_t fingerprint = 0;
    std::string first_desc;
    auto load = [&](const std::string& key, const std::string& value) {
        std::vector<Source> sources;
        std::set<std::string> names;
        for (auto& [w, spec] : parse_source_list(key, value)) {
            Source src;
            src.spec = spec;
            src.weight = w;
            for (const auto& file : expand_source(key, spec, dc.allow_incomplete)) {
                // A shard its corpus's manifest lists (and agrees with) is known from the manifest:
                // no file is opened. Any other token file by its header, whose checks name it.
                TokenFileHeader h;
                std::string checksum;
                const CorpusDir& c = corpus_dir(parent_of(file));
                const auto listed = c.has_manifest ? c.shard_of.find(fs::path(file).filename().string()) : c.shard_of.end();
                try {
                    if (listed != c.shard_of.end() && c.problem.empty()) {
                        const ManifestShard& ms = c.manifest.shards[listed->second];
                        h.tokenizer = corpus_tokenizer_read((fs::path(parent_of(file)) / c.manifest.tokenizer_file).string(),
                                                            c.manifest.tokenizer_fingerprint);
                        h.vocab_size = c.manifest.vocab_size;
                        h.eos_id = c.manifest.eos_id;
                        h.bos_id = c.manifest.bos_id;
                        h.n_tokens = ms.tokens;
                        h.width = c.manifest.width;
                        h.file_offset = ms.offset;
                        checksum = ms.checksum;
                    } else {
                        if (c.has_manifest && !dc.allow_incomplete)
                            config_fail(key, spec, listed == c.shard_of.end()
                                                       ? "'" + file + "' is not one of the shards its directory's manifest lists"
                                                       : "the corpus does not agree with its manifest: " + c.problem +
                                                             "; data.allow_incomplete = true uses it as it is");
                        h = token_file_header(file);
                    }
                } catch (const ConfigError& e) {
                    const std::string what = e.what();
                    if (what.rfind("deck key", 0) == 0) throw;
                    throw ConfigError("deck key '" + key + "': source '" + spec + "': " + what);
                }
                const uint64_t fp = h.tokenizer.fingerprint();
                if (out.first_file.empty()) {
                    out.first_file = file;
                    out.tokenizer = h.tokenizer;
                    out.vocab_size = h.vocab_size;
                    out.eos_id = h.eos_id;
                    out.bos_id = h.bos_id;
                    fingerprint = fp;
                    first_desc = h.tokenizer.describe();
                } else if (fp != fingerprint || h.vocab_size != out.vocab_size) {
                    config_fail(key, value, "token file '" + file + "' was made with " + h.tokenizer.describe() +
                                                " (vocab_size " + std::to_string(h.vocab_size) + ") but '" +
                                                out.first_file + "' with " + first_desc + " (vocab_size " +
                                                std::to_string(out.vocab_size) +
                                                "); every shard of a run must share one tokenizer");
                }
                if (h.file_offset < 0) out.any_hdf5_reads = true;
                src.shards.push_back({file, h.n_tokens, h.width, h.file_offset, checksum});
            }
            src.start.push_back(0);
            for (const auto& sh : src.shards) src.start.push_back(src.start.back() + sh.n_tokens);
            src.n_tokens = src.start.back();
            std::string name = source_name(spec);
            for (int k = 2; names.count(name); ++k) name = source_name(spec) + "_" + std::to_string(k);
            names.insert(name);
            src.name = name;
            src.len = src.n_tokens;
            sources.push_back(std::move(src));
        }
        return sources;
    };
    out.train = load("data.path", dc.path);
    const int64_t need = int64_t(dc.seq_len) + 1;
    if (!dc.val_path.empty()) {
        out.val = load("data.val_path", dc.val_path);
        for (const auto& v : out.val)
            if (v.len < need)
                config_fail("data.seq_len", std::to_string(dc.seq_len),
                            "validation source '" + v.spec + "' (data.val_path) has only " + std::to_string(v.len) +
                                " tokens; need at least seq_len + 1");
    } else {
        for (auto& s : out.train) {
            Source v = s;
            const int64_t val = int64_t(std::floor(double(s.n_tokens) * dc.val_fraction));
            s.len = s.n_tokens - val;
            v.begin = s.len;
            v.len = val;
            out.val.push_back(std::move(v));
        }
    }
    for (const auto& s : out.train)
        if (s.len < need)
            config_fail("data.seq_len", std::to_string(dc.seq_len),
                        "the train split of source '" + s.spec + "' (data.path) has only " + std::to_string(s.len) +
                            " tokens; need at least seq_len + 1" +
                            (dc.val_path.empty() ? " (after data.val_fraction's validation split)" : ""));
    // A small corpus is checked whole now, so a bad id stops the job before any work (exit
    // status 2); a large one is checked as it is read (exit status 4, naming the shard).
    int64_t total = 0;
    for (const auto& group : {&out.train, &out.val})
        for (const auto& s : *group) total += s.n_tokens;
    int64_t limit = int64_t(1) << 26;
    if (const char* e = std::getenv("QUINTET_DATA_CHECK_TOKENS")) limit = std::atoll(e);
    if (total <= limit) {
        const TokenReader reader(out);
        std::vector<unsigned char> buf(size_t(1) << 20);
        const int64_t chunk = int64_t(buf.size()) / reader.width();
        for (const auto& [key, group] : {std::pair{"data.path", &out.train}, std::pair{"data.val_path", &out.val}})
            for (const auto& s : *group) {
                if (group == &out.val && dc.val_path.empty()) continue;  // the train files again
                // Shards with a checksum are checked whole against it, the others id by id.
                for (const auto& sh : s.shards)
                    if (!sh.checksum.empty())
                        if (const std::string why = shard_verify(sh, out.vocab_size); !why.empty())
                            config_fail(key, s.spec, why + " (`quintet data verify` checks a corpus; `quintet "
                                                           "prepare` makes it again)");
                if (std::all_of(s.shards.begin(), s.shards.end(), [](const TokenShard& sh) { return !sh.checksum.empty(); }))
                    continue;
                Source whole = s;
                whole.begin = 0, whole.len = s.n_tokens;
                try {
                    for (int64_t at = 0; at < whole.len; at += chunk)
                        reader.read(whole, at, std::min(chunk, whole.len - at), buf.data(), reader.width());
                } catch (const IoError& e) {
                    throw ConfigError(std::string("deck key '") + key + "': source '" + s.spec + "': " + e.what());
                }
            }
    }
    return out;
}

std::string shard_verify(const TokenShard& sh, int vocab_size) {
    if (sh.file_offset < 0) {  // read through HDF5: every id checked
        try {
            (void)token_file_read(sh.path);
        } catch (const std::exception& e) {
            return e.what();
        }
        return "";
    }
    const int fd = ::open(sh.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "shard '" + sh.path + "' cannot be opened: " + std::strerror(errno);
    std::vector<unsigned char> buf(size_t(1) << 22);
    Checksum sum;
    const int64_t bytes = sh.n_tokens * sh.width;
    std::string why;
    for (int64_t at = 0; at < bytes && why.empty();) {
        const size_t want = size_t(std::min<int64_t>(int64_t(buf.size()), bytes - at));
        const ssize_t r = ::pread(fd, buf.data(), want, off_t(sh.file_offset + at));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            why = "shard '" + sh.path + "' is truncated: its tokens end at byte " + std::to_string(sh.file_offset + at);
            break;
        }
        sum.update(buf.data(), size_t(r));
        for (size_t i = 0; i + size_t(sh.width) <= size_t(r); i += size_t(sh.width)) {
            uint32_t id = 0;
            std::memcpy(&id, buf.data() + i, size_t(sh.width));
            if (id >= uint32_t(vocab_size)) {
                why = "shard '" + sh.path + "': /tokens[" + std::to_string((at + int64_t(i)) / sh.width) + "] = " +
                      std::to_string(id) + " is not a valid token id (vocab_size " + std::to_string(vocab_size) + ")";
                break;
            }
        }
        at += r;
    }
    ::close(fd);
    if (why.empty() && !sh.checksum.empty() && Checksum::hex(sum.value()) != sh.checksum)
        why = "shard '" + sh.path + "': its tokens do not match the manifest's checksum (" + Checksum::hex(sum.value()) +
              ", expected " + sh.checksum + "): altered or damaged after prepare";
    return why;
}

DataInfo data_info(const std::string& path_value) {
    DataConfig dc;
    dc.path = path_value;
    dc.val_fraction = 0;
    dc.seq_len = 1;
    const DataSet d = data_open(dc);
    return {d.vocab_size, d.train_tokens()};
}

double data_buffer_bytes(const DataConfig& dc, int64_t samples_per_rank, int vocab_size) {
    return 2.0 * double(samples_per_rank) * double(dc.seq_len + 1) * (vocab_size <= 65536 ? 2 : 4);
}

// ------------------------------------------------------------------------------------------------

// Open shards, at most kMaxOpen at once (a corpus may have more shards than a process may
// open files): the least recently used is closed. A read holds the lock, so no descriptor is
// closed under a read of the other thread.
struct TokenReader::Fds {
    static constexpr size_t kMaxOpen = 128;
    std::mutex m;
    std::map<std::string, std::pair<int, uint64_t>> fd;  // path -> (fd, last use)
    uint64_t clock = 0;
};

TokenReader::TokenReader(const DataSet& data)
    : data_(data), width_(data.vocab_size <= 65536 ? 2 : 4), fds_(std::make_unique<Fds>()) {}

TokenReader::~TokenReader() {
    for (auto& [p, f] : fds_->fd) ::close(f.first);
}

ssize_t TokenReader::pread_shard(const TokenShard& sh, void* buf, size_t bytes, int64_t off) const {
    std::lock_guard<std::mutex> lock(fds_->m);
    auto it = fds_->fd.find(sh.path);
    if (it == fds_->fd.end()) {
        if (fds_->fd.size() >= Fds::kMaxOpen) {
            auto oldest = std::min_element(fds_->fd.begin(), fds_->fd.end(),
                                           [](auto& a, auto& b) { return a.second.second < b.second.second; });
            ::close(oldest->second.first);
            fds_->fd.erase(oldest);
        }
        const int fd = ::open(sh.path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) throw IoError("token file '" + sh.path + "' cannot be opened: " + std::strerror(errno));
        it = fds_->fd.emplace(sh.path, std::pair<int, uint64_t>{fd, 0}).first;
    }
    it->second.second = ++fds_->clock;
    return ::pread(it->second.first, buf, bytes, off_t(off));
}

// Stream tokens [at, at + n) of the source (within one pass: no wrap), converted to `width`.
void TokenReader::read_stream(const Source& src, int64_t at, int64_t n, unsigned char* out, int width) const {
    size_t k = size_t(std::upper_bound(src.start.begin(), src.start.end(), at) - src.start.begin()) - 1;
    const uint32_t vocab = uint32_t(data_.vocab_size);
    uint32_t scratch[1024];
    while (n > 0) {
        const TokenShard& sh = src.shards[k];
        const int64_t local = at - src.start[k];
        const int64_t take = std::min<int64_t>(n, sh.n_tokens - local);
        for (int64_t done = 0; done < take;) {
            const int64_t c = std::min<int64_t>(take - done, 1024);
            if (sh.file_offset >= 0) {
                unsigned char* raw = reinterpret_cast<unsigned char*>(scratch);
                const size_t bytes = size_t(c) * size_t(sh.width);
                const off_t off = off_t(sh.file_offset + (local + done) * sh.width);
                size_t got = 0;
                while (got < bytes) {
                    const ssize_t r = pread_shard(sh, raw + got, bytes - got, int64_t(off) + int64_t(got));
                    if (r < 0 && errno == EINTR) continue;
                    if (r <= 0)
                        throw IoError("token file '" + sh.path + "': cannot read tokens " +
                                      std::to_string(local + done) + " .. " + std::to_string(local + done + c) +
                                      (r < 0 ? std::string(": ") + std::strerror(errno) : " (truncated file?)"));
                    got += size_t(r);
                }
                if (sh.width == 2) {  // widen in place, back to front
                    const uint16_t* s16 = reinterpret_cast<const uint16_t*>(scratch);
                    for (int64_t i = c - 1; i >= 0; --i) scratch[i] = s16[i];
                }
            } else {
                token_file_read_range(sh.path, local + done, c, scratch);
            }
            for (int64_t i = 0; i < c; ++i) {
                if (scratch[i] >= vocab)
                    throw IoError("token file '" + sh.path + "': /tokens[" + std::to_string(local + done + i) +
                                  "] = " + std::to_string(scratch[i]) + " is not a valid token id (vocab_size " +
                                  std::to_string(vocab) + "); the shard is corrupt");
                if (width == 2) reinterpret_cast<uint16_t*>(out)[i] = uint16_t(scratch[i]);
                else reinterpret_cast<uint32_t*>(out)[i] = scratch[i];
            }
            out += size_t(c) * size_t(width);
            done += c;
        }
        at += take;
        n -= take;
        ++k;
    }
}

void TokenReader::read(const Source& src, int64_t o, int64_t n, void* out, int width) const {
    unsigned char* p = static_cast<unsigned char*>(out);
    o %= src.len;
    while (n > 0) {
        const int64_t take = std::min(n, src.len - o);
        read_stream(src, src.begin + o, take, p, width);
        p += size_t(take) * size_t(width);
        n -= take;
        o = 0;
    }
}

}  // namespace quintet
