// Host FMA peak: measured with kernels' FMA loop, cached per host name and CPU model.
#include "quintet/perf/host_peak.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "quintet/kernels/backend.hpp"

namespace quintet {

namespace {

std::string cpu_model() {
    std::ifstream f("/proc/cpuinfo");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("model name", 0) == 0) {
            auto p = line.find(':');
            std::string m = p == std::string::npos ? line : line.substr(p + 1);
            m.erase(0, m.find_first_not_of(' '));
            return m;
        }
    return "unknown";
}

std::string host_name() {
    char h[256] = {0};
    gethostname(h, sizeof h - 1);
    return h[0] ? h : "localhost";
}

}  // namespace

namespace {
double status_kib(const char* key) {
    std::ifstream f("/proc/self/status");
    std::string line;
    const size_t n = std::strlen(key);
    while (std::getline(f, line))
        if (line.compare(0, n, key) == 0) return std::atof(line.c_str() + n) * 1024.0;
    return 0;
}
}  // namespace

double process_rss_bytes() { return status_kib("VmRSS:"); }
double process_peak_rss_bytes() { return status_kib("VmHWM:"); }

namespace {
// The first number of a one-line file (or the value of `key` in a "key value" file), -1 when
// absent; cgroup v2's "max" reads as no limit.
double read_number(const std::string& path, const char* key = nullptr) {
    std::ifstream f(path);
    std::string word;
    if (!key) return f >> word && word != "max" ? std::atof(word.c_str()) : -1;
    double v = 0;
    while (f >> word >> v)
        if (word == key) return v;
    return -1;
}

// The memory limit of this process's cgroup less what the cgroup uses, or -1 without one. The
// path /proc/self/cgroup names may be the host's (inside a container the mount shows only the
// container's part): its tails are tried until one exists under the mount.
double cgroup_available_bytes() {
    std::ifstream f("/proc/self/cgroup");
    std::string line;
    double best = -1;
    while (std::getline(f, line)) {
        const size_t a = line.find(':'), b = line.find(':', a + 1);
        if (a == std::string::npos || b == std::string::npos) continue;
        const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
        const bool v1 = controllers.find("memory") != std::string::npos, v2 = controllers.empty();
        if (!v1 && !v2) continue;
        for (size_t cut = 0; cut != std::string::npos; cut = path.find('/', cut + 1)) {
            const std::string tail = path.substr(cut);
            double limit = -1, used = -1;
            static const char* const kV1[] = {"/sys/fs/cgroup/memory", nullptr};
            static const char* const kV2[] = {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"};
            for (const char* mount : v1 ? kV1 : kV2) {
                if (!mount) break;
                const std::string dir = std::string(mount) + (tail == "/" ? "" : tail);
                if (!std::filesystem::is_directory(dir)) continue;
                // v1: the effective limit of the hierarchy; v2: memory.max of this group.
                limit = v1 ? read_number(dir + "/memory.stat", "hierarchical_memory_limit") : read_number(dir + "/memory.max");
                used = read_number(dir + (v1 ? "/memory.usage_in_bytes" : "/memory.current"));
                break;
            }
            if (used < 0) continue;
            if (limit > 0 && limit < 1e18) best = best < 0 ? limit - used : std::min(best, limit - used);
            break;
        }
    }
    return best;
}
}  // namespace

double host_available_memory_bytes() {
    double avail = -1;
    std::ifstream f("/proc/meminfo");
    std::string line;
    while (std::getline(f, line))
        if (line.compare(0, 13, "MemAvailable:") == 0) avail = std::atof(line.c_str() + 13) * 1024.0;
    const double group = cgroup_available_bytes();
    if (group >= 0) avail = avail < 0 ? group : std::min(avail, group);
    return avail;
}

int host_cores() {
    if (const char* e = std::getenv("QUINTET_CORES"); e && std::atoi(e) > 0) return std::atoi(e);
    return std::max(1, int(sysconf(_SC_NPROCESSORS_ONLN)));
}

std::string host_peak_cache_path() {
    std::string dir;
    if (const char* e = std::getenv("QUINTET_CACHE_DIR"); e && *e) dir = e;
    else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) dir = std::string(x) + "/quintet";
    else if (const char* h = std::getenv("HOME"); h && *h) dir = std::string(h) + "/.cache/quintet";
    else dir = "/tmp/quintet-cache";
    return dir + "/fma_peak-" + host_name();
}

namespace {
std::string cache_file(const std::string& kind) {
    const std::string p = host_peak_cache_path();
    return p.substr(0, p.rfind('/') + 1) + kind + "-" + host_name();
}
// One line "key1=v1 key2=v2 ... cpu=<model to the end of the line>" of this CPU model, as its
// keys and values; empty when absent or written for another CPU.
std::map<std::string, std::string> read_entry(const std::string& kind) {
    std::ifstream f(cache_file(kind));
    std::string line;
    std::map<std::string, std::string> kv;
    if (!std::getline(f, line)) return kv;
    const auto c = line.find(" cpu=");
    if (c == std::string::npos || line.substr(c + 5) != cpu_model()) return kv;
    std::istringstream in(line.substr(0, c));
    std::string tok;
    while (in >> tok)
        if (const auto eq = tok.find('='); eq != std::string::npos) kv[tok.substr(0, eq)] = tok.substr(eq + 1);
    return kv;
}
double number(const std::map<std::string, std::string>& kv, const std::string& key) {
    const auto it = kv.find(key);
    return it == kv.end() ? 0.0 : std::atof(it->second.c_str());
}
// "key1=v1 key2=v2 cpu=<model>" of this CPU model, or false.
bool read_pair(const std::string& kind, const char* k1, double* a, const char* k2, double* b) {
    const auto kv = read_entry(kind);
    const double x = number(kv, k1);
    if (x <= 0) return false;
    *a = x;
    if (b) *b = number(kv, k2);
    return true;
}
void write_line(const std::string& kind, const std::string& text) {
    const std::string path = cache_file(kind);
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    const std::string tmp = path + ".tmp" + std::to_string(getpid());
    {
        std::ofstream o(tmp);
        o << text << " cpu=" << cpu_model() << "\n";
    }
    std::filesystem::rename(tmp, path, ec);
    if (ec) std::filesystem::remove(tmp, ec);
}
std::string fmt(double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%.4g", x);
    return b;
}
}  // namespace

std::string HostPeak::describe() const {
    std::string s = source;
    if (ceiling_per_core > 0) s += "; " + fmt(gflops_per_core / ceiling_per_core) + " of the CPU's bound " + fmt(ceiling_per_core);
    return s;
}

HostPeak host_fma_peak(bool remeasure, bool add_reading) {
    const std::string path = host_peak_cache_path(), cpu = cpu_model();
    const FmaCeiling ceiling = cpu_fma_ceiling();
    const double bound = ceiling.gflops_per_core;  // 0: unknown
    HostPeak p;
    p.cpu = cpu, p.ceiling_per_core = bound, p.ceiling_what = ceiling.describe();
    // One line: gflops_per_core=<x> isa=<isa> one_core=<y> readings=<n> [low=1] cpu=<model name>
    auto kv = read_entry("fma_peak");
    double cached = number(kv, "gflops_per_core"), cached_one = number(kv, "one_core");
    int readings = int(number(kv, "readings"));
    if (cached > 0 && cached_one > 0 && kv.count("isa")) p.isa = kv["isa"];
    else cached = cached_one = 0, readings = 0;
    readings = std::max(readings, cached > 0 ? 1 : 0);  // an entry from before the count: one reading
    double sgemm_one = 0;
    read_sgemm_cache(&sgemm_one);
    // A peak can only be read low (another process on the cores), and a low one would inflate
    // every MFU on this host for good; so it is measured again, the highest reading kept, until
    // kPeakReadings runs have read it; when a run's step went faster than it (low=1); and when
    // one thread's sgemm (FMAs, so it cannot beat them) beat one core's figure. A cached figure
    // above the CPU's own bound is an error and not used.
    std::string why;
    if (remeasure) why = "--remeasure";
    else if (cached <= 0) why = "nothing cached";
    else if (bound > 0 && std::max(cached, cached_one) > bound)
        why = "the cached " + fmt(std::max(cached, cached_one)) + " GFLOP/s is above the CPU's bound " + fmt(bound),
        cached = cached_one = 0, readings = 0;
    else if (kv.count("low")) why = "a run's step went faster than the cached figure";
    else if (sgemm_one > 1.05 * cached_one) why = "one thread's sgemm (" + fmt(sgemm_one) + ") beat the cached one-core figure";
    else if (readings < kPeakReadings) why = "reading " + std::to_string(readings + 1) + " of " + std::to_string(kPeakReadings);
    else if (add_reading) why = "a reading asked for";
    if (why.empty()) {
        p.gflops_per_core = cached;
        p.source = "cached in " + path + ", the highest of " + std::to_string(readings) + " readings";
        return p;
    }
    // Every core at once, then per core: a virtual machine's "cores" may be SMT siblings that
    // share FMA units, and only running them together shows it (one alone reads the whole core).
    const int cores = host_cores();
    const FmaPeak m = cpu_measure_fma_peak(cores);
    const FmaPeak one = cores > 1 ? cpu_measure_fma_peak(1) : m;
    double per_core = m.gflops / cores, alone = one.gflops;
    std::string rejected;
    if (bound > 0 && alone > bound) {  // a clock that jumped: the reading is not kept
        rejected = "; this reading (" + fmt(alone) + ") was above the CPU's bound and is not kept";
        per_core = std::min(per_core, cached > 0 ? cached : bound), alone = std::min(alone, cached_one > 0 ? cached_one : bound);
    }
    if (!remeasure) {  // --remeasure starts the entry afresh; otherwise readings only ever go up
        per_core = std::max(per_core, cached);
        alone = std::max(alone, cached_one);
    }
    // An sgemm on one thread is FMAs on one core: the core does at least that.
    if (sgemm_one > alone && (bound <= 0 || sgemm_one <= bound)) alone = sgemm_one;
    const int n = remeasure ? 1 : readings + 1;
    p.gflops_per_core = per_core, p.isa = m.isa;
    p.source = "measured now (" + why + "), the highest of " + std::to_string(n) + " readings" + rejected;
    // Best effort: a read-only home only costs a measurement next time.
    std::ostringstream o;
    o.precision(17);  // the figure as measured, to the last bit
    o << "gflops_per_core=" << per_core << " isa=" << m.isa << " one_core=" << alone << " readings=" << n;
    write_line("fma_peak", o.str());
    return p;
}

void host_peak_note_achieved(double ratio) {
    if (!(ratio > 1)) return;
    // The step's rate is a rate the cores really reached: the cached figure rises to it, and is
    // marked so that the next run measures again.
    auto kv = read_entry("fma_peak");
    const double cached = number(kv, "gflops_per_core"), one = number(kv, "one_core");
    if (cached <= 0 || !kv.count("isa")) return;
    const double bound = cpu_fma_ceiling().gflops_per_core;
    const double raised = bound > 0 ? std::min(bound, cached * ratio) : cached * ratio;
    std::ostringstream o;
    o.precision(17);  // the figure as measured, to the last bit
    o << "gflops_per_core=" << std::max(cached, raised) << " isa=" << kv["isa"] << " one_core=" << std::max(one, raised)
      << " readings=" << std::max(1, int(number(kv, "readings"))) << " low=1";
    write_line("fma_peak", o.str());
}

bool read_link_cache(LinkFigures* out) { return read_pair("links", "gbs", &out->gbs, "latency_s", &out->latency_s); }
void write_link_cache(const LinkFigures& l) {
    std::ostringstream o;
    o.precision(17);  // the figure as measured, to the last bit
    o << "gbs=" << l.gbs << " latency_s=" << l.latency_s;
    write_line("links", o.str());
}
// Per BLAS: a build with the other one (CMake QUINTET_BLAS) measures its own rate.
const std::string kSgemmKind = std::string("sgemm_") + QUINTET_BLAS_NAME;
namespace {
// The one-thread sgemm entry: its rate (0 when absent or above the CPU's bound), its readings
// and whether a run marked it low.
struct SgemmEntry {
    double gflops = 0;
    int readings = 0;
    bool low = false;
};
SgemmEntry sgemm_entry() {
    const auto kv = read_entry(kSgemmKind);
    SgemmEntry e;
    e.gflops = number(kv, "gflops_per_core");
    const double bound = cpu_fma_ceiling().gflops_per_core;
    if (e.gflops <= 0 || (bound > 0 && e.gflops > bound)) return {};  // faster than the CPU can be: an error
    e.readings = std::max(1, int(number(kv, "readings")));
    e.low = kv.count("low") > 0;
    return e;
}
}  // namespace

bool read_sgemm_cache(double* g, int* readings) {
    const SgemmEntry e = sgemm_entry();
    if (e.gflops <= 0) return false;
    *g = e.gflops;
    if (readings) *readings = e.low ? 0 : e.readings;
    return true;
}
double write_sgemm_cache(double g, bool replace) {
    const SgemmEntry e = replace ? SgemmEntry{} : sgemm_entry();
    g = std::max(g, e.gflops);  // readings only ever go up
    std::ostringstream o;
    o.precision(17);  // the figure as measured, to the last bit
    o << "gflops_per_core=" << g << " readings=" << e.readings + 1;
    write_line(kSgemmKind, o.str());
    return g;
}
double host_sgemm_gflops_per_core(std::string* source) {
    const SgemmEntry e = sgemm_entry();
    if (e.gflops > 0 && !e.low && e.readings >= kPeakReadings) {
        if (source)
            *source = "cached in " + cache_file(kSgemmKind) + ", the highest of " + std::to_string(e.readings) + " readings";
        return e.gflops;
    }
    auto be = make_cpu_backend(1);
    const double now = cpu_measure_sgemm_gflops(*be, 1024, 5);
    const double bound = cpu_fma_ceiling().gflops_per_core;
    if (bound > 0 && now > bound) {  // not kept: a clock that jumped
        if (source) *source = "this reading (" + fmt(now) + ") was above the CPU's bound " + fmt(bound) + " and is not kept";
        return e.gflops > 0 ? e.gflops : bound;
    }
    const double g = write_sgemm_cache(now);
    if (source)
        *source = "measured now (" + fmt(now) + " on 1 thread), the highest of " + std::to_string(e.readings + 1) +
                  " readings, kept in " + cache_file(kSgemmKind);
    return g;
}
void sgemm_note_achieved(double gflops_per_core) {
    const SgemmEntry e = sgemm_entry();
    if (e.gflops <= 0 || gflops_per_core <= e.gflops) return;
    std::ostringstream o;
    o.precision(17);  // the figure as measured, to the last bit
    o << "gflops_per_core=" << gflops_per_core << " readings=" << e.readings << " low=1";
    write_line(kSgemmKind, o.str());
}

double job_fma_peak_flops(const MpiCommunicator& world, int threads_per_rank, HostPeak* info) {
    const std::unique_ptr<MpiCommunicator> node = world.split_node();
    const int local = node->rank();
    int node_threads = threads_per_rank;
    node->all_reduce_sum(&node_threads, 1);
    // The node's first rank measures while the others wait asleep: a rank spinning in a
    // blocking MPI call would take a core from the measurement and halve the peak it reads.
    HostPeak p;
    double per_core = 0, node_peak = 0;
    node->barrier();  // everyone here (done with earlier work) before the measurement starts
    if (local == 0) {
        p = host_fma_peak();
        per_core = p.gflops_per_core;
        node_peak = per_core * 1e9 * std::min(host_cores(), node_threads);
    }
    node->barrier_asleep();  // the first rank joins once its measurement is done
    node->broadcast(&per_core, sizeof per_core, 0);
    double total = node_peak;
    world.all_reduce_sum(&total, 1);
    if (info) {
        if (local != 0) p.gflops_per_core = per_core, p.source = "from this node's first rank";
        *info = p;
    }
    return total;
}

double job_sgemm_flops(const MpiCommunicator& world, double measured_gflops, int threads_per_rank,
                       double* measured_flops) {
    const std::unique_ptr<MpiCommunicator> node = world.split_node();
    const int local = node->rank(), ranks = node->size();
    double node_measured = measured_gflops;
    node->all_reduce_sum(&node_measured, 1);
    int max_threads = threads_per_rank;
    node->all_reduce_max(&max_threads, 1);
    double mine[2] = {0, 0};  // this node's rate and its measurement, from its first rank only
    if (local == 0) {
        // The best node-wide measurement seen on this host for this arrangement of ranks and
        // threads: contention only ever makes a measurement lower.
        const std::string kind = kSgemmKind + "_r" + std::to_string(ranks) + "t" + std::to_string(max_threads);
        // A rate above the CPU's own bound for the cores the node's ranks use is a measurement
        // error (a clock that jumped): it is neither cached nor used. (The bound, not the measured
        // FMA peak: a peak read low on a busy host would throw real rates away.)
        const double per_core_bound = cpu_fma_ceiling().gflops_per_core;
        const double ceiling = per_core_bound > 0 ? per_core_bound * std::min(host_cores(), ranks * max_threads) : 1e300;
        const bool impossible = node_measured > ceiling;
        double best = 0;
        if (read_pair(kind, "gflops", &best, nullptr, nullptr) && best > ceiling) best = 0;  // an impossible cached one
        if (!impossible && (best == 0 || node_measured > best)) {
            std::ostringstream o;
            o.precision(17);  // the figure as measured, to the last bit
            o << "gflops=" << node_measured;
            write_line(kind, o.str());
        }
        const double measured = impossible ? (best > 0 ? best : ceiling) : node_measured;
        mine[0] = std::max(best, measured), mine[1] = measured;
    }
    world.all_reduce_sum(mine, 2);
    if (measured_flops) *measured_flops = mine[1] * 1e9;
    return mine[0] * 1e9;
}

}  // namespace quintet
