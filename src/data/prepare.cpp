// The prepare pipeline (prepare.hpp). Stages, in order:
//   1. the output checked and locked; the state folder made or (--resume) checked against the job;
//   2. units of work planned from the inputs alone (a file, or a piece of a large plain file cut
//      at a line start), text inputs checked to be text;
//   3. every rank encodes its units (parts on all its threads) into STATE/unit_N.ids, each renamed
//      into place when whole, with its counts in STATE/unit_N.json;
//   4. the ranks agree (stop, bad input, I/O failure or done); the token stream, unit after unit,
//      is cut into shards written by rank k mod N;
//   5. the manifest, last; the state folder removed.
#include "quintet/data/prepare.hpp"

#include <hdf5.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "quintet/core/checksum.hpp"
#include "quintet/core/error.hpp"
#include "quintet/data/corpus_documents.hpp"
#include "quintet/data/corpus_manifest.hpp"
#include "quintet/io/run_lock.hpp"
#include "quintet/io/token_data.hpp"
#include "quintet/io/tokenizer_store.hpp"
#include "quintet/tokenizer/tokenizer_spec.hpp"

namespace quintet {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kBlock = size_t(8) << 20;  // bytes of text per part of a long document (as in corpus_documents)
constexpr size_t kHead = size_t(64) << 10;  // bytes of a text input checked to be text

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// SIGINT, SIGTERM and SIGUSR1 stop the job at the next part (docs/data.md, "Faults").
volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_prepare_signal(int sig) { g_signal = sig; }
bool stopping() { return g_signal != 0; }

int64_t unit_bytes() {
    if (const char* e = std::getenv("QUINTET_PREPARE_UNIT_BYTES"); e && std::atoll(e) > 0) return std::atoll(e);
    return int64_t(64) << 20;
}

std::string unit_name(const std::string& state, size_t u, const char* ext) {
    return (fs::path(state) / ("unit_" + std::to_string(u) + ext)).string();
}

nlohmann::json counts_json(const UnitCounts& c) {
    return {{"tokens", c.tokens}, {"documents", c.documents}, {"bad_lines", c.bad_lines}, {"bad_examples", c.bad_examples}};
}

// A small file written whole or not at all (tmp + rename); IoError on failure.
void write_small(const std::string& path, const std::string& text) {
    const std::string tmp = path + ".part";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out << text;
        out.flush();
        if (!out) {
            std::error_code ec;
            fs::remove(tmp, ec);
            throw IoError("cannot write '" + tmp + "' (disk full?)");
        }
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) throw IoError("cannot rename '" + tmp + "': " + ec.message());
}

std::string read_small(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream buf;
    buf << in.rdbuf();
    return buf.str();
}

// What identifies a job for --resume: every input (path, size, time), every option that changes
// the tokens, and the tokenizer. The command line itself may differ (--resume, the rank count).
nlohmann::ordered_json job_identity(const PrepareJob& job, const Tokenizer& tok, int64_t unit_size) {
    nlohmann::ordered_json j;
    j["tokenizer"] = Checksum::hex(tok.fingerprint());
    j["jsonl_key"] = job.keys.spec();
    j["split_on"] = job.sep;
    j["shard_tokens"] = job.shard_tokens;
    j["bos_id"] = job.bos_id;
    j["eos_id"] = job.eos_id;
    j["max_bad_lines"] = job.max_bad_lines;
    j["binary"] = job.binary;
    j["unit_bytes"] = unit_size;
    j["inputs"] = nlohmann::ordered_json::array();
    for (const auto& f : job.files) j["inputs"].push_back({f.path, f.bytes, f.mtime_ns});
    return j;
}

// The first key where two identities differ, for the refusal of --resume.
std::string identity_difference(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b) {
    for (auto it = a.begin(); it != a.end(); ++it) {
        if (!b.contains(it.key())) return it.key();
        if (*it != b[it.key()]) {
            if (it.key() != "inputs" || !it->is_array() || !b[it.key()].is_array()) return it.key();
            const auto &x = *it, &y = b[it.key()];
            for (size_t i = 0; i < std::min(x.size(), y.size()); ++i)
                if (x[i] != y[i])
                    return "input '" + x[i][0].get<std::string>() + "' (its path, size or modification time changed)";
            return "the number of inputs (" + std::to_string(y.size()) + " then, " + std::to_string(x.size()) + " now)";
        }
    }
    return "";
}

int cores_available() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
    return std::max(1, int(sysconf(_SC_NPROCESSORS_ONLN)));
}

// Every rank's status after a stage: 0 done, 1 stopped by a signal, 2 bad input, 4 an I/O
// failure; the worst wins and the lowest rank with it gives the message.
struct Agreement {
    int status = 0;
    std::string message;
};

Agreement agree(const MpiCommunicator& world, int status, const std::string& message) {
    const int size = world.size(), rank = world.rank();
    double key[2] = {double(status), status ? double(size - rank) : 0.0};
    double worst = key[0];
    world.all_reduce_max(&worst, 1);
    double who = status == int(worst) && worst > 0 ? key[1] : 0.0;
    world.all_reduce_max(&who, 1);
    Agreement a;
    a.status = int(worst);
    if (a.status == 0) return a;
    const int from = size - int(who);
    std::string msg = rank == from ? message : std::string();
    uint64_t len = msg.size();
    world.broadcast(&len, sizeof len, from);
    msg.resize(len);
    if (len) world.broadcast(msg.data(), len, from);
    a.message = msg;
    return a;
}

void remove_quietly(const fs::path& p) {
    std::error_code ec;
    fs::remove_all(p, ec);
}

}  // namespace

void prepare_catch_signals() {
    std::signal(SIGINT, on_prepare_signal);
    std::signal(SIGTERM, on_prepare_signal);
    std::signal(SIGUSR1, on_prepare_signal);
}

bool prepare_interrupted() { return stopping(); }

std::string prepare_state_dir(const PrepareJob& job) {
    if (job.shard_tokens > 0) return (fs::path(job.output) / ".prepare").string();
    return job.output + ".prepare";
}

std::string prepare_check_output(const PrepareJob& job, const MpiCommunicator& world) {
    std::error_code ec;
    const std::string& out = job.output;
    auto bad = [&](const std::string& why) { throw ConfigError("prepare option --output = '" + out + "': " + why); };
    const bool slash = !out.empty() && out.back() == '/';
    for (const auto& f : job.files)
        if (fs::exists(out, ec) && fs::equivalent(f.path, out, ec)) bad("is an input file; choose another path");
    if (job.shard_tokens > 0) {
        if (fs::exists(out, ec) && !fs::is_directory(out, ec))
            bad("is a file; with --shard-tokens the output is the directory of the shards");
        bool found = false;
        if (fs::is_directory(out, ec)) {
            (void)manifest_read(out, found);
            if (found && !job.resume)
                bad("already holds a complete corpus (manifest.json); choose a new directory, or remove this one");
            if (!found && !fs::exists(prepare_state_dir(job), ec))
                for (const auto& e : fs::directory_iterator(out, ec))
                    if (e.path().extension() == ".h5")
                        bad("already holds token files (" + e.path().filename().string() +
                            ") that no interrupted prepare left; choose a new or empty directory");
        }
        world.barrier();
        if (world.rank() == 0) fs::create_directories(out, ec);
        world.barrier();
        if (!fs::is_directory(out, ec)) bad("cannot create the directory: " + ec.message());
        return found ? "complete" : "";
    }
    if (slash || fs::is_directory(out, ec))
        bad(std::string(slash ? "ends with '/'" : "is a directory") +
            ": a directory of shards needs --shard-tokens N (tokens per shard); for one token file give a file name, "
            "e.g. '" + (fs::path(out) / "corpus.h5").string() + "'");
    if (fs::exists(out, ec) && !job.resume) {
        const bool token_file = H5Fis_hdf5(out.c_str()) > 0 && [&] {
            try {
                (void)token_file_info(out);
                return true;
            } catch (const std::exception&) {
                return false;
            }
        }();
        if (!token_file) bad("exists and is not a token file; prepare never overwrites it (choose another path)");
        if (!job.force) bad("exists (a token file); give --force to replace it, or choose another path");
    }
    const fs::path parent = fs::absolute(out, ec).parent_path();
    world.barrier();
    if (world.rank() == 0) fs::create_directories(parent, ec);
    world.barrier();
    if (!fs::is_directory(parent, ec)) bad("cannot create its directory '" + parent.string() + "'");
    return "";
}

void prepare_tidy(const PrepareJob& job, const MpiCommunicator& world) {
    const std::string state = prepare_state_dir(job);
    std::error_code ec;
    if (!fs::exists(state, ec)) return;
    RunLock lock(state, world, 3600.0, nullptr, "prepare --output '" + job.output + "'");
    if (world.rank() == 0)
        for (const auto& e : fs::directory_iterator(state, ec))
            if (e.path().filename() != "lock") remove_quietly(e.path());
    lock.remove_folder_when_released();
}

TokenizerState prepare_saved_tokenizer(const PrepareJob& job) {
    const std::string path = (fs::path(prepare_state_dir(job)) / kCorpusTokenizerName).string();
    std::error_code ec;
    if (!job.resume || !fs::exists(path, ec)) return {};
    return corpus_tokenizer_read(path, "").state();
}

std::string corpus_sample_text(const PrepareJob& job, size_t limit) {
    // Parts cut at every 8 MB block (the sample is only bytes), and reading stops at the limit,
    // so the memory is the sample's.
    struct Enough {};
    std::string text;
    bool first = true;
    UnitCounts ignored;
    PrepareJob lenient = job;
    lenient.max_bad_lines = INT64_MAX;  // the encoding pass counts and refuses them
    try {
        for (const auto& f : job.files)
            for_each_part(lenient, f, Unit{}, true, ignored, [&](Part&& p) {
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

int prepare_run(const PrepareJob& job, const Tokenizer& tok, const MpiCommunicator& world) {
    const int rank = world.rank(), size = world.size();
    const auto t0 = Clock::now();
    std::error_code ec;
    const bool shards = job.shard_tokens > 0;
    const std::string state = prepare_state_dir(job);
    const int64_t U = unit_bytes();
    const nlohmann::ordered_json identity = job_identity(job, tok, U);

    // Threads: the rank's share of the node's cores, unless told.
    int threads = job.threads;
    if (threads <= 0) {
        if (const char* e = std::getenv("OMP_NUM_THREADS"); e && std::atoi(e) > 0) {
            threads = std::atoi(e);
        } else {
            const int local = world.split_node()->size();
            threads = std::max(1, std::min(cores_available(), int(sysconf(_SC_NPROCESSORS_ONLN)) / local));
        }
    }
    omp_set_num_threads(threads);

    // 1. The lock, then the state: new, or an interrupted prepare's to continue.
    RunLock lock(state, world, 3600.0, nullptr, "prepare --output '" + job.output + "'");
    char refusal[1024] = {0};
    int64_t resumed_units = 0;
    if (rank == 0) {
        const std::string job_path = (fs::path(state) / "job.json").string();
        const bool interrupted = fs::exists(job_path, ec);
        try {
            if (interrupted && !job.resume) {
                std::snprintf(refusal, sizeof refusal,
                              "prepare option --output = '%s': an interrupted prepare of it is in '%s'; run the same "
                              "command with --resume to continue it, or remove that folder (and the output) to start "
                              "again",
                              job.output.c_str(), state.c_str());
            } else if (interrupted) {
                const auto before = nlohmann::ordered_json::parse(read_small(job_path));
                const std::string diff = identity_difference(identity, before);
                if (!diff.empty())
                    std::snprintf(refusal, sizeof refusal,
                                  "prepare --resume: the interrupted prepare in '%s' was made with another %s; run it "
                                  "as it was, or remove that folder (and the output) to start again",
                                  state.c_str(), diff.c_str());
            }
        } catch (const nlohmann::json::exception& e) {
            std::snprintf(refusal, sizeof refusal, "prepare --resume: '%s' is unreadable (%s); remove '%s' to start again",
                          job_path.c_str(), e.what(), state.c_str());
        }
        if (!refusal[0]) {
            // Whatever is not a finished unit goes: parts of units, shards of a stopped stage 4.
            for (const auto& e : fs::directory_iterator(state, ec)) {
                const std::string name = e.path().filename().string();
                const bool keep = name == "lock" || (interrupted && (name == "job.json" || name == kCorpusTokenizerName ||
                                                                     e.path().extension() == ".ids" ||
                                                                     e.path().extension() == ".json"));
                if (!keep || name.rfind("shard_", 0) == 0) remove_quietly(e.path());
            }
            if (shards)
                for (const auto& e : fs::directory_iterator(job.output, ec)) {
                    const std::string name = e.path().filename().string();
                    if (name.rfind("shard_", 0) == 0 || name == kCorpusTokenizerName ||
                        name == std::string(kCorpusTokenizerName) + ".tmp")
                        remove_quietly(e.path());
                }
            fs::remove(job.output + ".tmp", ec);
            try {
                if (!interrupted) {
                    write_small(job_path, identity.dump(1) + "\n");
                    corpus_tokenizer_write((fs::path(state) / kCorpusTokenizerName).string(), tok);
                }
            } catch (const std::exception& e) {
                std::snprintf(refusal, sizeof refusal, "prepare: cannot write the state folder '%s': %s", state.c_str(),
                              e.what());
            }
        }
    }
    world.broadcast(refusal, sizeof refusal, 0);
    if (refusal[0]) throw ConfigError(refusal);
    prepare_catch_signals();

    // 2. The units of work, and which inputs are text.
    const bool can_cut = tok.cuts_at_line_starts();
    std::vector<Unit> units;
    for (size_t f = 0; f < job.files.size(); ++f) {
        const InputFile& in = job.files[f];
        const bool jsonl = in.format == InputFormat::jsonl;
        std::vector<int64_t> starts{0};
        if (in.compression == Compression::none && (jsonl || (job.sep.empty() && can_cut)))
            for (int64_t at = U; at < in.bytes; at = std::max(at + U, starts.back() + U)) {
                const int64_t b = next_boundary(in, std::max(at, starts.back() + 1), jsonl);
                if (b < 0 || b >= in.bytes) break;
                starts.push_back(b);
            }
        for (size_t k = 0; k < starts.size(); ++k)
            units.push_back({f, starts[k], k + 1 < starts.size() ? starts[k + 1] : -1, k == 0, k + 1 == starts.size()});
    }
    const size_t nu = units.size();
    // Text inputs that are not UTF-8 (binary files): refused, skipped or kept, by --binary.
    std::vector<char> skip(job.files.size(), 0);
    char refused[1024] = {0};
    if (rank == 0 && job.binary != "keep") {
        try {
            for (size_t f = 0; f < job.files.size(); ++f) {
                if (job.files[f].format != InputFormat::text) continue;
                auto in = ByteStream::open(job.files[f]);
                std::string head, why;
                while (head.size() < kHead && in->read(head, kHead - head.size()) > 0) {
                }
                const bool whole = head.size() < kHead;
                if (looks_like_text(head, whole, why)) continue;
                if (job.binary == "skip") {
                    skip[f] = 1;
                    continue;
                }
                std::snprintf(refused, sizeof refused,
                              "prepare: input '%s' is not UTF-8 text (%s); --binary skip leaves such files out, "
                              "--binary keep tokenizes their bytes",
                              job.files[f].path.c_str(), why.c_str());
                break;
            }
        } catch (const ConfigError& e) {
            std::snprintf(refused, sizeof refused, "%s", e.what());
        }
    }
    world.broadcast(refused, sizeof refused, 0);
    if (!skip.empty()) world.broadcast(skip.data(), skip.size(), 0);
    if (refused[0]) {
        world.barrier();
        if (rank == 0)
            for (const auto& e : fs::directory_iterator(state, ec))
                if (e.path().filename() != "lock") remove_quietly(e.path());
        lock.remove_folder_when_released();
        throw ConfigError(refused);
    }
    int64_t skipped_files = 0;
    std::string first_skipped;
    for (size_t f = 0; f < skip.size(); ++f)
        if (skip[f] && skipped_files++ == 0) first_skipped = job.files[f].path;

    // Units to ranks by size (the largest first, to the least loaded rank): deterministic.
    std::vector<int64_t> bytes(nu);
    for (size_t i = 0; i < nu; ++i)
        bytes[i] = (units[i].end < 0 ? job.files[units[i].file].bytes : units[i].end) - units[i].begin;
    std::vector<size_t> by_size(nu);
    std::iota(by_size.begin(), by_size.end(), 0);
    std::stable_sort(by_size.begin(), by_size.end(), [&](size_t a, size_t b) { return bytes[a] > bytes[b]; });
    std::vector<int> owner(nu);
    std::vector<int64_t> load(size_t(size), 0);
    for (size_t i : by_size) {
        const int r = int(std::min_element(load.begin(), load.end()) - load.begin());
        owner[i] = r;
        load[size_t(r)] += bytes[i];
    }
    std::vector<char> done_before(nu, 0);
    for (size_t u = 0; u < nu; ++u) done_before[u] = fs::exists(unit_name(state, u, ".json"), ec) ? 1 : 0;
    resumed_units = std::count(done_before.begin(), done_before.end(), 1);
    if (rank == 0 && job.resume && resumed_units > 0)
        std::printf("prepare: resuming: %lld of %zu unit(s) were done\n", (long long)resumed_units, nu);

    // 3. Every rank encodes its units.
    const int width = tok.vocab_size() <= 65536 ? 2 : 4;  // the ids as the shards store them
    int status = 0;
    std::string message;
    int64_t done_bytes = 0, my_tokens = 0, my_docs = 0, my_bad = 0;
    int64_t my_load = 0;
    for (size_t u = 0; u < nu; ++u)
        if (owner[u] == rank && !done_before[u]) my_load += bytes[u];
    Clock::time_point last_print = Clock::now();
    const auto t_enc = Clock::now();
    std::string current_part;
    try {
        std::vector<uint16_t> narrow;
        for (size_t u = 0; u < nu; ++u) {
            if (owner[u] != rank || done_before[u]) continue;
            if (stopping()) throw PrepareInterrupted{};
            const Unit& unit = units[u];
            UnitCounts counts;
            counts.bad_before = my_bad;
            const std::string ids_path = unit_name(state, u, ".ids");
            current_part = ids_path + ".part";
            FILE* out = std::fopen(current_part.c_str(), "wb");
            if (!out) throw IoError("cannot write '" + current_part + "': " + std::strerror(errno));
            std::unique_ptr<FILE, int (*)(FILE*)> closer(out, std::fclose);
            std::vector<Part> batch;
            size_t batch_bytes = 0;
            auto flush = [&] {
                std::atomic<bool> stop{false};
#pragma omp parallel for schedule(dynamic, 1)
                for (size_t i = 0; i < batch.size(); ++i) {
                    if (stop.load(std::memory_order_relaxed) || stopping()) {
                        stop = true;
                        continue;
                    }
                    Part& p = batch[i];
                    if (p.first && job.bos_id >= 0) p.ids.push_back(uint32_t(job.bos_id));
                    if (p.end > p.begin) tok.encode_range(p.text, p.begin, p.end, p.ids);
                    if (p.last && job.eos_id >= 0) p.ids.push_back(uint32_t(job.eos_id));
                }
                if (stop) throw PrepareInterrupted{};
                for (const Part& p : batch) {
                    size_t wrote = 0;
                    if (width == 2) {
                        narrow.assign(p.ids.begin(), p.ids.end());
                        wrote = std::fwrite(narrow.data(), 2, narrow.size(), out);
                    } else {
                        wrote = std::fwrite(p.ids.data(), 4, p.ids.size(), out);
                    }
                    if (wrote != p.ids.size())
                        throw IoError("cannot write '" + current_part + "': " + std::strerror(errno));
                    counts.tokens += int64_t(p.ids.size());
                    counts.documents += p.last ? 1 : 0;
                }
                batch.clear();
                batch_bytes = 0;
            };
            const int64_t before = done_bytes;
            if (!skip[unit.file]) {
                for_each_part(job, job.files[unit.file], unit, can_cut, counts, [&](Part&& p) {
                    batch_bytes += p.text.size();
                    batch.push_back(std::move(p));
                    if (batch_bytes >= size_t(threads) * 2 * kBlock || batch.size() >= size_t(threads) * 256) flush();
                }, [&](int64_t raw) {
                    done_bytes = before + raw - unit.begin;
                    if (rank != 0 || since(last_print) < 2.0) return;
                    last_print = Clock::now();
                    const double s = since(t_enc), mbs = double(done_bytes) / 1e6 / std::max(s, 1e-9);
                    const double left = double(my_load - done_bytes) / 1e6 / std::max(mbs, 1e-9);
                    std::printf("prepare: %.1f / %.1f MB%s (%.0f%%), %.1f MB/s, %lld documents, %.2f M tokens, ETA %.0f s\n",
                                double(done_bytes) / 1e6, double(my_load) / 1e6, size > 1 ? " of rank 0's share" : "",
                                100.0 * double(done_bytes) / double(std::max<int64_t>(my_load, 1)), mbs,
                                (long long)(my_docs + counts.documents), double(my_tokens + counts.tokens) / 1e6, left);
                    std::fflush(stdout);
                });
                flush();
            }
            if (std::fflush(out) != 0 || ::fsync(fileno(out)) != 0)
                throw IoError("cannot write '" + current_part + "': " + std::strerror(errno));
            closer.reset();
            fs::rename(current_part, ids_path, ec);
            if (ec) throw IoError("cannot rename '" + current_part + "': " + ec.message());
            current_part.clear();
            write_small(unit_name(state, u, ".json"), counts_json(counts).dump() + "\n");
            my_tokens += counts.tokens;
            my_docs += counts.documents;
            my_bad += counts.bad_lines;
            done_bytes = before + bytes[u];
        }
    } catch (const PrepareInterrupted&) {
        status = 1;
        message = "stopped by signal " + std::to_string(int(g_signal));
    } catch (const ConfigError& e) {
        status = 2;
        message = e.what();
    } catch (const IoError& e) {
        status = 4;
        message = std::string("prepare: ") + e.what();
    }
    if (!current_part.empty()) fs::remove(current_part, ec);
    const double enc_s = since(t_enc);

    // 4. Agreement, then the counts of every unit (this run's and earlier runs').
    auto finish_failed = [&](const Agreement& a, bool keep_units) {
        world.barrier();
        if (rank == 0) {
            if (shards) {
                for (const auto& e : fs::directory_iterator(job.output, ec)) {
                    const std::string name = e.path().filename().string();
                    if (name.rfind("shard_", 0) == 0 || name.rfind(kCorpusTokenizerName, 0) == 0) remove_quietly(e.path());
                }
            } else {
                fs::remove(job.output + ".tmp", ec);
            }
            if (!keep_units) {
                for (const auto& e : fs::directory_iterator(state, ec))
                    if (e.path().filename() != "lock") remove_quietly(e.path());
                lock.remove_folder_when_released();
            } else {
                for (const auto& e : fs::directory_iterator(state, ec))
                    if (e.path().extension() == ".part" || e.path().filename().string().rfind("shard_", 0) == 0)
                        remove_quietly(e.path());
            }
        }
        world.barrier();
        if (a.status == 1) {
            int64_t finished = 0, kept = 0;
            for (size_t u = 0; u < nu; ++u)
                if (fs::exists(unit_name(state, u, ".json"), ec)) {
                    ++finished;
                    kept += int64_t(fs::file_size(unit_name(state, u, ".ids"), ec));
                }
            throw FaultError("prepare: interrupted (" + a.message + "): " + std::to_string(finished) + " of " +
                             std::to_string(nu) + " unit(s) of work are done and kept in '" + state + "' (" +
                             std::to_string(kept / 1000000) + " MB); run the same command with --resume to continue, or "
                             "remove that folder" + (shards ? " and '" + job.output + "'" : std::string()) +
                             ". No shard or temporary file is left; the output is not a corpus until prepare completes");
        }
        if (a.status == 2) throw ConfigError(a.message + " (nothing was left behind)");
        throw FaultError(a.message + "; every temporary file was removed");
    };
    Agreement a = agree(world, status, message);
    if (a.status) finish_failed(a, a.status == 1);
    std::vector<int64_t> counts(nu), docs(nu), bad(nu);
    std::vector<std::string> bad_examples;
    {
        std::string err;
        for (size_t u = 0; u < nu && err.empty(); ++u) {
            try {
                const auto j = nlohmann::json::parse(read_small(unit_name(state, u, ".json")));
                counts[u] = j.at("tokens").get<int64_t>();
                docs[u] = j.at("documents").get<int64_t>();
                bad[u] = j.at("bad_lines").get<int64_t>();
                for (const auto& x : j.at("bad_examples"))
                    if (bad_examples.size() < 5) bad_examples.push_back(x.get<std::string>());
                if (int64_t(fs::file_size(unit_name(state, u, ".ids"), ec)) != counts[u] * width)
                    err = "unit " + std::to_string(u) + "'s ids are not the size its counts say";
            } catch (const std::exception& e) {
                err = "cannot read '" + unit_name(state, u, ".json") + "': " + e.what();
            }
        }
        a = agree(world, err.empty() ? 0 : 4, "prepare: the state folder '" + state + "' is damaged: " + err);
        if (a.status) finish_failed(a, false);
    }
    const int64_t total_bad = std::accumulate(bad.begin(), bad.end(), int64_t(0));
    if (total_bad > job.max_bad_lines)
        finish_failed({2, "prepare: " + std::to_string(total_bad) + " malformed JSON lines, more than --max-bad-lines = " +
                              std::to_string(job.max_bad_lines) + " (the first: " +
                              (bad_examples.empty() ? "?" : bad_examples[0]) + ")"},
                      false);
    std::vector<int64_t> start(nu + 1, 0);
    for (size_t u = 0; u < nu; ++u) start[u + 1] = start[u] + counts[u];
    const int64_t total = start[nu];
    if (total < 2)
        finish_failed({2, "prepare: the inputs encode to " + std::to_string(total) + " token(s); need at least 2"}, false);

    // 5. The token stream cut into shards of shard_tokens; shard k written by rank k % size.
    const int64_t per = shards ? job.shard_tokens : total;
    int64_t n_shards = (total + per - 1) / per;
    int64_t last_len = total - (n_shards - 1) * per;
    if (n_shards > 1 && last_len < 2) --n_shards, last_len += per;  // a last shard of one token joins the one before
    const auto t_write = Clock::now();
    std::vector<uint64_t> shard_info(size_t(n_shards) * 3, 0);  // bytes, offset, checksum
    status = 0;
    message.clear();
    if (shards && rank == 0) {
        try {
            corpus_tokenizer_write((fs::path(job.output) / kCorpusTokenizerName).string(), tok);
        } catch (const IoError& e) {
            status = 4;
            message = std::string("prepare: ") + e.what();
        }
    }
    a = agree(world, status, message);
    if (a.status) finish_failed(a, false);
    try {
        std::vector<uint32_t> buf(size_t(1) << 20);
        std::vector<uint16_t> buf16(width == 2 ? buf.size() : 0);
        for (int64_t k = rank; k < n_shards; k += size) {
            const int64_t sa = k * per, sb = k + 1 == n_shards ? total : sa + per;
            char name[32];
            std::snprintf(name, sizeof name, "shard_%06lld.h5", (long long)k);
            const std::string path = shards ? (fs::path(job.output) / name).string() : job.output;
            TokenFileWriter w(path, sb - sa, tok, job.eos_id, job.bos_id, shards ? kCorpusTokenizerName : "");
            size_t u = size_t(std::upper_bound(start.begin(), start.end(), sa) - start.begin()) - 1;
            for (int64_t at = sa; at < sb;) {
                if (stopping()) throw PrepareInterrupted{};
                while (start[u + 1] <= at) ++u;
                const int64_t n = std::min<int64_t>({sb - at, start[u + 1] - at, int64_t(buf.size())});
                FILE* in = std::fopen(unit_name(state, u, ".ids").c_str(), "rb");
                void* into = width == 2 ? static_cast<void*>(buf16.data()) : static_cast<void*>(buf.data());
                const bool ok = in && std::fseek(in, long((at - start[u]) * width), SEEK_SET) == 0 &&
                                std::fread(into, size_t(width), size_t(n), in) == size_t(n);
                if (in) std::fclose(in);
                if (!ok) throw IoError("cannot read back '" + unit_name(state, u, ".ids") + "'");
                if (width == 2) std::copy(buf16.begin(), buf16.begin() + n, buf.begin());
                w.write(at - sa, buf.data(), n);
                at += n;
            }
            w.commit();
            shard_info[size_t(k) * 3 + 0] = uint64_t(w.bytes());
            shard_info[size_t(k) * 3 + 1] = uint64_t(w.offset());
            shard_info[size_t(k) * 3 + 2] = w.checksum();
        }
    } catch (const PrepareInterrupted&) {
        status = 1;
        message = "stopped by signal " + std::to_string(int(g_signal));
    } catch (const IoError& e) {
        status = 4;
        message = std::string("prepare: ") + e.what();
    }
    a = agree(world, status, message);
    if (a.status) finish_failed(a, a.status == 1);
    world.all_reduce_sum(shard_info.data(), shard_info.size());

    // 6. The manifest, last; then the state goes.
    status = 0;
    message.clear();
    if (rank == 0 && shards) {
        CorpusManifest m;
        m.tokenizer_fingerprint = Checksum::hex(tok.fingerprint());
        m.tokenizer_describe = tok.describe();
        m.vocab_size = tok.vocab_size();
        m.width = width;
        m.eos_id = job.eos_id;
        m.bos_id = job.bos_id;
        m.tokens = total;
        m.documents = std::accumulate(docs.begin(), docs.end(), int64_t(0));
        m.skipped_files = skipped_files;
        m.bad_lines = total_bad;
        for (int64_t k = 0; k < n_shards; ++k) {
            char name[32];
            std::snprintf(name, sizeof name, "shard_%06lld.h5", (long long)k);
            const int64_t sa = k * per, sb = k + 1 == n_shards ? total : sa + per;
            m.shards.push_back({name, sb - sa, int64_t(shard_info[size_t(k) * 3]), int64_t(shard_info[size_t(k) * 3 + 1]),
                                Checksum::hex(shard_info[size_t(k) * 3 + 2])});
        }
        for (const auto& f : job.files) m.inputs.push_back({f.path, f.bytes, f.mtime_ns});
        m.command = job.command;
        try {
            manifest_write(job.output, m);
        } catch (const std::exception& e) {
            status = 4;
            message = std::string("prepare: ") + e.what();
        }
    }
    a = agree(world, status, message);
    if (a.status) finish_failed(a, false);
    world.barrier();
    if (rank == 0)
        for (const auto& e : fs::directory_iterator(state, ec))
            if (e.path().filename() != "lock") remove_quietly(e.path());
    lock.remove_folder_when_released();
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
    std::signal(SIGUSR1, SIG_DFL);

    double in_bytes = 0;  // encoded by this run
    for (size_t u = 0; u < nu; ++u)
        if (!done_before[u]) in_bytes += double(bytes[u]);
    double slowest = enc_s;
    world.all_reduce_max(&slowest, 1);
    if (rank == 0) {
        const int64_t all_docs = std::accumulate(docs.begin(), docs.end(), int64_t(0));
        std::printf("prepare: encoded %.1f MB of %zu file(s)%s in %.2f s (%.1f MB/s; %d rank(s) x %d thread(s))\n",
                    in_bytes / 1e6, job.files.size(), resumed_units ? " (the rest was done before --resume)" : "", slowest, slowest > 0 ? in_bytes / 1e6 / slowest : 0.0, size,
                    threads);
        if (skipped_files)
            std::printf("prepare: skipped %lld input(s) that are not UTF-8 text (--binary skip; the first: '%s')\n",
                        (long long)skipped_files, first_skipped.c_str());
        if (total_bad)
            std::printf("prepare: skipped %lld malformed JSON line(s) (--max-bad-lines %lld; the first: %s)\n",
                        (long long)total_bad, (long long)job.max_bad_lines, bad_examples.empty() ? "?" : bad_examples[0].c_str());
        const std::string where = shards ? "in " + std::to_string(n_shards) + " shard(s) under '" + job.output + "'"
                                         : "in '" + job.output + "'";
        std::printf("prepare: %lld document(s) -> %lld tokens, tokenizer %s, stored as %s %s (%.2f s; writing %.2f s)\n",
                    (long long)all_docs, (long long)total, tok.describe().c_str(), width == 2 ? "uint16" : "uint32",
                    where.c_str(), since(t0), since(t_write));
        if (job.eos_id >= 0 || job.bos_id >= 0)
            std::printf("prepare: every document%s%s\n",
                        job.bos_id >= 0 ? (" begins with token " + std::to_string(job.bos_id) + " (attribute bos_id)").c_str() : "",
                        job.eos_id >= 0 ? ((job.bos_id >= 0 ? " and" : "") + std::string(" ends with token ") +
                                           std::to_string(job.eos_id) + " (attribute eos_id)").c_str()
                                        : "");
        std::fflush(stdout);
    }
    return 0;
}

}  // namespace quintet
