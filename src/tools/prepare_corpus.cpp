#include "prepare_corpus.hpp"

#include <glob.h>
#include <omp.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>

#include "quintet/core/error.hpp"
#include "quintet/io/token_data.hpp"

namespace quintet {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kBlock = size_t(8) << 20;  // bytes of text per part of a long document

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

[[noreturn]] void bad_input(const std::string& what) { throw ConfigError("prepare: " + what); }

// A plain or gzip-compressed file (zlib reads both), in blocks or lines.
class TextFile {
public:
    explicit TextFile(const std::string& path) : path_(path) {
        f_ = gzopen(path.c_str(), "rb");
        if (!f_) bad_input("input '" + path + "' cannot be opened for reading");
        gzbuffer(f_, 1 << 20);
    }
    ~TextFile() {
        if (f_) gzclose(f_);
    }
    TextFile(const TextFile&) = delete;
    TextFile& operator=(const TextFile&) = delete;
    // Appends up to n bytes; returns how many (0 at the end).
    size_t read(std::string& out, size_t n) {
        const size_t at = out.size();
        out.resize(at + n);
        const int got = gzread(f_, out.data() + at, unsigned(n));
        if (got < 0) fail();
        out.resize(at + size_t(got));
        return size_t(got);
    }
    // The next line without its '\n'; false at the end.
    bool line(std::string& out) {
        out.clear();
        char buf[65536];
        for (;;) {
            if (!gzgets(f_, buf, sizeof buf)) {
                int err = 0;
                gzerror(f_, &err);
                if (err != Z_OK && err != Z_BUF_ERROR) fail();
                return !out.empty();
            }
            out += buf;
            if (!out.empty() && out.back() == '\n') {
                out.pop_back();
                return true;
            }
        }
    }
    int64_t raw_offset() const { return int64_t(gzoffset(f_)); }
    // The uncompressed position; seek (plain files only: gzip inputs are never split).
    int64_t tell() const { return int64_t(gztell(f_)); }
    void seek(int64_t at) {
        if (gzseek(f_, z_off_t(at), SEEK_SET) < 0) fail();
    }

private:
    [[noreturn]] void fail() {
        int err = 0;
        const char* msg = gzerror(f_, &err);
        bad_input("input '" + path_ + "' cannot be read: " + (msg ? msg : "error") +
                  " (a truncated or corrupt gzip file?)");
    }
    std::string path_;
    gzFile f_ = nullptr;
};

// A part of a document: text[begin, end) of `text` (the pre-tokenizer sees all of `text`).
struct Part {
    std::string text;
    size_t begin = 0, end = 0;
    bool first = false, last = false;  // begins / ends its document
    std::vector<uint32_t> ids;
};

// The position of the last place in s[from, size) where a part may end: before a line starting
// with an ASCII letter (tokenizer_cut's rule); 0 when none.
size_t last_cut(const std::string& s, size_t from) {
    for (size_t p = s.size(); p > from + 1; --p) {
        const unsigned char c = static_cast<unsigned char>(s[p - 1]);
        if (s[p - 2] == '\n' && ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')) return p - 1;
    }
    return 0;
}

// A unit of work: bytes [begin, end) of one input (end -1: to its end). A large plain or JSON
// Lines file is cut into units of about kUnitBytes at places where the tokens cannot differ (a
// line start; for plain text one that begins with an ASCII letter), so ranks share it; the units
// depend on the file alone, never on the number of ranks.
struct Unit {
    size_t file = 0;
    int64_t begin = 0, end = -1;
    bool first = true, last = true;  // the file's first / last unit
};

int64_t unit_bytes() {
    if (const char* e = std::getenv("QUINTET_PREPARE_UNIT_BYTES"); e && std::atoll(e) > 0) return std::atoll(e);
    return int64_t(64) << 20;
}

// The first place at or after `from` where a unit may begin; -1 when none before the end.
int64_t next_boundary(const std::string& path, int64_t from, bool jsonl) {
    TextFile in(path);
    in.seek(from - 1);
    std::string buf;
    int64_t base = from - 1;
    while (in.read(buf, 1 << 16) > 0) {
        for (size_t i = 1; i < buf.size(); ++i) {
            const unsigned char c = static_cast<unsigned char>(buf[i]);
            if (buf[i - 1] == '\n' && (jsonl || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z'))) return base + int64_t(i);
        }
        base += int64_t(buf.size()) - 1;
        buf.erase(0, buf.size() - 1);
    }
    return -1;
}

int64_t lines_before(const std::string& path, int64_t at) {
    TextFile in(path);
    std::string buf;
    int64_t n = 0, seen = 0;
    while (seen < at && in.read(buf, size_t(std::min<int64_t>(1 << 20, at - seen))) > 0) {
        n += std::count(buf.begin(), buf.end(), '\n');
        seen += int64_t(buf.size());
        buf.clear();
    }
    return n;
}

// Streams the parts of one unit of an input file to `emit(Part&&)`, in order.
template <class Emit>
void for_each_part(const CorpusJob& job, const std::string& path, const Unit& unit, bool can_cut, Emit&& emit,
                   const std::function<void(int64_t)>& progress) {
    TextFile in(path);
    if (unit.begin > 0) in.seek(unit.begin);
    auto left = [&] { return unit.end < 0 ? int64_t(kBlock) : std::min<int64_t>(int64_t(kBlock), unit.end - in.tell()); };
    if (!job.jsonl_key.empty()) {
        std::string line;
        auto line_no = [&](int64_t n) { return std::to_string(n + (unit.begin > 0 ? lines_before(path, unit.begin) : 0)); };
        for (int64_t n = 1; (unit.end < 0 || in.tell() < unit.end) && in.line(line); ++n) {
            if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines
            nlohmann::json j;
            try {
                j = nlohmann::json::parse(line);
            } catch (const std::exception& e) {
                bad_input("input '" + path + "' line " + line_no(n) + ": not JSON (" + e.what() + ")");
            }
            const auto it = j.is_object() ? j.find(job.jsonl_key) : j.end();
            if (!j.is_object() || it == j.end() || !it->is_string())
                bad_input("input '" + path + "' line " + line_no(n) + ": no string field \"" + job.jsonl_key +
                          "\" (--jsonl-key); the line is a JSON " + std::string(j.type_name()));
            Part p;
            p.text = it->get<std::string>();
            if (p.text.empty()) continue;
            p.end = p.text.size();
            p.first = p.last = true;
            emit(std::move(p));
            if ((n & 1023) == 0) progress(in.raw_offset());
        }
        progress(in.raw_offset());
        return;
    }
    std::string buf;
    bool doc_open = false;  // a document's first part was emitted
    if (!job.sep.empty()) {
        // Documents between separators, each whole (empty ones dropped).
        auto doc = [&](std::string text) {
            if (text.empty()) return;
            Part p;
            p.text = std::move(text);
            p.end = p.text.size();
            p.first = p.last = true;
            emit(std::move(p));
        };
        for (bool more = true; more;) {
            more = in.read(buf, kBlock) > 0;
            progress(in.raw_offset());
            size_t at = 0;
            for (size_t next; (next = buf.find(job.sep, at)) != std::string::npos; at = next + job.sep.size())
                doc(buf.substr(at, next - at));
            buf.erase(0, at);
        }
        doc(std::move(buf));
        return;
    }
    // The whole file is one document, in parts cut where the tokenizer allows.
    doc_open = !unit.first;
    for (bool more = true; more;) {
        const int64_t n = left();
        more = n > 0 && in.read(buf, size_t(n)) > 0;
        progress(in.raw_offset());
        if (!more || !can_cut || buf.size() < kBlock) continue;
        const size_t cut = last_cut(buf, 0);
        if (cut == 0) continue;
        Part p;
        p.text = buf;  // the pre-tokenizer sees past the cut
        p.end = cut;
        p.first = !doc_open;
        doc_open = true;
        emit(std::move(p));
        buf.erase(0, cut);
    }
    if (buf.empty() && !doc_open) return;  // an empty file: no document
    if (!unit.last) {
        // A unit that ends inside the document: its last part sees a little of the next unit.
        Part p;
        p.end = buf.size();
        p.text = std::move(buf);
        std::string after;
        in.seek(unit.end);
        in.read(after, 4096);
        p.text += after;
        p.first = !doc_open;
        emit(std::move(p));
        return;
    }
    if (!buf.empty()) {
        Part p;
        p.text = std::move(buf);
        p.end = p.text.size();
        p.first = !doc_open;
        p.last = true;
        emit(std::move(p));
    } else {
        Part p;  // close the document (its eos)
        p.last = true;
        emit(std::move(p));
    }
}

std::string tmp_dir_of(const CorpusJob& job) {
    return job.shard_tokens > 0 ? (fs::path(job.output) / ".prepare.tmp").string() : job.output + ".parts.tmp";
}

}  // namespace

std::vector<std::string> corpus_inputs(const std::vector<std::string>& inputs) {
    std::vector<std::string> files;
    std::error_code ec;
    for (const auto& in : inputs) {
        std::vector<std::string> found;
        if (in.find_first_of("*?[") != std::string::npos) {
            glob_t g{};
            if (::glob(in.c_str(), 0, nullptr, &g) == 0)
                for (size_t i = 0; i < g.gl_pathc; ++i)
                    if (fs::is_regular_file(g.gl_pathv[i], ec)) found.emplace_back(g.gl_pathv[i]);
            globfree(&g);
            if (found.empty()) bad_input("option --input = '" + in + "': the glob matches no files");
        } else if (fs::is_directory(in, ec)) {
            for (auto it = fs::recursive_directory_iterator(in, ec); it != fs::recursive_directory_iterator(); ++it)
                if (it->is_regular_file(ec) && it->path().filename().string()[0] != '.')
                    found.push_back(it->path().string());
            if (found.empty()) bad_input("option --input = '" + in + "': the directory holds no files");
        } else if (fs::exists(in, ec)) {
            found.push_back(in);
        } else {
            bad_input("option --input = '" + in + "': no such file, directory or glob");
        }
        std::sort(found.begin(), found.end());
        files.insert(files.end(), found.begin(), found.end());
    }
    return files;
}

std::string corpus_sample_text(const CorpusJob& job, size_t limit) {
    // Parts cut at every 8 MB block (the sample is only bytes), and reading stops at the limit,
    // so the memory is the sample's.
    struct Enough {};
    std::string text;
    bool first = true;
    try {
        for (const auto& f : job.files)
            for_each_part(job, f, Unit{}, true, [&](Part&& p) {
                if (p.first && !first) text += '\n';
                first = false;
                text.append(p.text, p.begin, p.end - p.begin);
                if (limit && text.size() >= limit) throw Enough{};
            }, [](int64_t) {});
    } catch (const Enough&) {
    }
    if (limit && text.size() > limit) text.resize(limit);
    return text;
}

int prepare_corpus(const CorpusJob& job, const Tokenizer& tok, const MpiCommunicator& world) {
    const int rank = world.rank(), size = world.size();
    const auto t0 = Clock::now();
    const size_t n_files = job.files.size();
    std::error_code ec;
    const bool can_cut = tok.cuts_at_line_starts();
    // The units of work: whole files, and large plain or JSON Lines files (not gzip, not
    // --split-on) cut about every unit_bytes() at a line start.
    std::vector<Unit> units;
    const int64_t U = unit_bytes();
    for (size_t f = 0; f < n_files; ++f) {
        const std::string& path = job.files[f];
        const int64_t size_f = int64_t(fs::file_size(path, ec));
        const bool gz = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
        const bool jsonl = !job.jsonl_key.empty();
        std::vector<int64_t> starts{0};
        if (!gz && job.sep.empty() && (jsonl || can_cut))
            for (int64_t at = U; at < size_f; at = std::max(at + U, starts.back() + U)) {
                const int64_t b = next_boundary(path, std::max(at, starts.back() + 1), jsonl);
                if (b < 0 || b >= size_f) break;
                starts.push_back(b);
            }
        for (size_t k = 0; k < starts.size(); ++k)
            units.push_back({f, starts[k], k + 1 < starts.size() ? starts[k + 1] : -1, k == 0, k + 1 == starts.size()});
    }
    const size_t nf = units.size();
    // Units to ranks by size (the largest first, to the least loaded rank): deterministic.
    std::vector<int64_t> bytes(nf);
    for (size_t i = 0; i < nf; ++i)
        bytes[i] = (units[i].end < 0 ? int64_t(fs::file_size(job.files[units[i].file], ec)) : units[i].end) -
                   units[i].begin;
    std::vector<size_t> by_size(nf);
    std::iota(by_size.begin(), by_size.end(), 0);
    std::stable_sort(by_size.begin(), by_size.end(), [&](size_t a, size_t b) { return bytes[a] > bytes[b]; });
    std::vector<int> owner(nf);
    std::vector<int64_t> load(size_t(size), 0);
    for (size_t i : by_size) {
        const int r = int(std::min_element(load.begin(), load.end()) - load.begin());
        owner[i] = r;
        load[size_t(r)] += bytes[i];
    }
    const std::string tmp = tmp_dir_of(job);
    if (rank == 0) {
        fs::remove_all(tmp, ec);
        fs::create_directories(tmp, ec);
        if (ec) bad_input("option --output = '" + job.output + "': cannot create '" + tmp + "': " + ec.message());
    }
    world.barrier();
    auto raw_path = [&](size_t u) { return tmp + "/unit_" + std::to_string(u) + ".ids"; };

    // 1. Every rank encodes its files into raw id files (in order), parts over the threads.
    std::vector<double> counts(nf, 0.0), docs(nf, 0.0);
    std::string error;
    const int threads = omp_get_max_threads();
    const int width = tok.vocab_size() <= 65536 ? 2 : 4;  // the raw ids as the shards store them
    std::vector<uint16_t> narrow;
    int64_t done_bytes = 0, my_tokens = 0, my_docs = 0;
    Clock::time_point last_print = Clock::now();
    const auto t_enc = Clock::now();
    try {
        for (size_t f = 0; f < nf; ++f) {
            if (owner[f] != rank) continue;
            FILE* out = std::fopen(raw_path(f).c_str(), "wb");
            if (!out) rank_fail("prepare: cannot write '" + raw_path(f) + "'");
            std::vector<Part> batch;
            size_t batch_bytes = 0;
            int64_t file_tokens = 0;
            auto flush = [&] {
#pragma omp parallel for schedule(dynamic, 1)
                for (size_t i = 0; i < batch.size(); ++i) {
                    Part& p = batch[i];
                    if (p.first && job.bos_id >= 0) p.ids.push_back(uint32_t(job.bos_id));
                    if (p.end > p.begin) tok.encode_range(p.text, p.begin, p.end, p.ids);
                    if (p.last && job.eos_id >= 0) p.ids.push_back(uint32_t(job.eos_id));
                }
                for (const Part& p : batch) {
                    size_t wrote = 0;
                    if (width == 2) {
                        narrow.assign(p.ids.begin(), p.ids.end());
                        wrote = std::fwrite(narrow.data(), 2, narrow.size(), out);
                    } else {
                        wrote = std::fwrite(p.ids.data(), 4, p.ids.size(), out);
                    }
                    if (wrote != p.ids.size()) rank_fail("prepare: cannot write '" + raw_path(f) + "' (disk full?)");
                    file_tokens += int64_t(p.ids.size());
                    my_docs += p.last ? 1 : 0;
                    docs[f] += p.last ? 1 : 0;
                }
                batch.clear();
                batch_bytes = 0;
            };
            const int64_t before = done_bytes;
            for_each_part(job, job.files[units[f].file], units[f], can_cut, [&](Part&& p) {
                batch_bytes += p.text.size();
                batch.push_back(std::move(p));
                if (batch_bytes >= size_t(threads) * 2 * kBlock || batch.size() >= size_t(threads) * 256) flush();
            }, [&](int64_t raw) {
                done_bytes = before + raw - units[f].begin;
                if (rank != 0 || since(last_print) < 2.0) return;
                last_print = Clock::now();
                const double s = since(t_enc), mbs = done_bytes / 1e6 / std::max(s, 1e-9);
                const double left = double(load[0] - done_bytes) / 1e6 / std::max(mbs, 1e-9);
                std::printf("prepare: %.1f / %.1f MB%s (%.0f%%), %.1f MB/s, %lld documents, %.2f M tokens, ETA %.0f s\n",
                            done_bytes / 1e6, load[0] / 1e6, size > 1 ? " of rank 0's share" : "",
                            100.0 * double(done_bytes) / double(std::max<int64_t>(load[0], 1)), mbs,
                            (long long)my_docs, (my_tokens + file_tokens) / 1e6, left);
                std::fflush(stdout);
            });
            flush();
            if (std::fclose(out) != 0) rank_fail("prepare: cannot write '" + raw_path(f) + "' (disk full?)");
            counts[f] = double(file_tokens);
            my_tokens += file_tokens;
            done_bytes = before + bytes[f];
        }
    } catch (const ConfigError& e) {
        error = e.what();
    }
    // A bad input on any rank stops every rank alike, with that rank's message (exit status 2).
    double failed = error.empty() ? -1.0 : double(size - rank);  // the lowest failing rank wins
    world.all_reduce_max(&failed, 1);
    if (failed > 0) {
        const int from = size - int(failed);
        uint64_t len = error.size();
        world.broadcast(&len, sizeof len, from);
        error.resize(len);
        world.broadcast(error.data(), len, from);
        world.barrier();
        if (rank == 0) fs::remove_all(tmp, ec);
        throw ConfigError(error);
    }
    world.all_reduce_sum(counts.data(), nf);
    world.all_reduce_sum(docs.data(), nf);
    const double enc_s = since(t_enc);

    // 2. The token stream cut into shards of shard_tokens; shard k written by rank k % size.
    std::vector<int64_t> start(nf + 1, 0);
    for (size_t f = 0; f < nf; ++f) start[f + 1] = start[f] + int64_t(counts[f]);
    const int64_t total = start[nf];
    if (total < 2) {
        world.barrier();
        if (rank == 0) fs::remove_all(tmp, ec);
        bad_input("the inputs encode to " + std::to_string(total) + " token(s); need at least 2");
    }
    const int64_t per = job.shard_tokens > 0 ? job.shard_tokens : total;
    int64_t n_shards = (total + per - 1) / per;
    // A last shard of a single token cannot train: it joins the one before.
    int64_t last_len = total - (n_shards - 1) * per;
    if (n_shards > 1 && last_len < 2) --n_shards, last_len += per;
    const auto t_write = Clock::now();
    std::vector<uint32_t> buf(size_t(1) << 20);
    std::vector<uint16_t> buf16(width == 2 ? buf.size() : 0);
    for (int64_t k = rank; k < n_shards; k += size) {
        const int64_t a = k * per, b = k + 1 == n_shards ? total : a + per;
        char name[32];
        std::snprintf(name, sizeof name, "shard_%06lld.h5", (long long)k);
        const std::string path = job.shard_tokens > 0 ? (fs::path(job.output) / name).string() : job.output;
        TokenFileWriter w(path, b - a, tok, job.eos_id, job.bos_id);
        size_t f = size_t(std::upper_bound(start.begin(), start.end(), a) - start.begin()) - 1;
        for (int64_t at = a; at < b;) {
            while (start[f + 1] <= at) ++f;
            const int64_t n = std::min<int64_t>({b - at, start[f + 1] - at, int64_t(buf.size())});
            FILE* in = std::fopen(raw_path(f).c_str(), "rb");
            void* into = width == 2 ? static_cast<void*>(buf16.data()) : static_cast<void*>(buf.data());
            if (!in || std::fseek(in, long((at - start[f]) * width), SEEK_SET) != 0 ||
                std::fread(into, size_t(width), size_t(n), in) != size_t(n))
                rank_fail("prepare: cannot read back '" + raw_path(f) + "'");
            std::fclose(in);
            if (width == 2) std::copy(buf16.begin(), buf16.begin() + n, buf.begin());
            w.write(at - a, buf.data(), n);
            at += n;
        }
        w.commit();
    }
    world.barrier();
    if (rank == 0) fs::remove_all(tmp, ec);
    double in_bytes = 0;
    for (int64_t x : bytes) in_bytes += double(x);
    double slowest = enc_s;
    world.all_reduce_max(&slowest, 1);
    if (rank == 0) {
        const double all_docs = std::accumulate(docs.begin(), docs.end(), 0.0);
        std::printf("prepare: encoded %.1f MB of %zu file(s) in %.2f s (%.1f MB/s; %d rank(s) x %d thread(s))\n",
                    in_bytes / 1e6, n_files, slowest, slowest > 0 ? in_bytes / 1e6 / slowest : 0.0, size, threads);
        std::printf("prepare: %.0f document(s) -> %lld tokens, tokenizer %s, stored as %s in %lld shard(s) %s '%s' "
                    "(%.2f s; writing %.2f s)\n",
                    all_docs, (long long)total, tok.describe().c_str(), tok.vocab_size() <= 65536 ? "uint16" : "uint32",
                    (long long)n_shards, job.shard_tokens > 0 ? "under" : "as", job.output.c_str(), since(t0),
                    since(t_write));
    }
    return 0;
}

}  // namespace quintet
