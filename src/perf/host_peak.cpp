// Host FMA peak: measured with kernels' FMA loop, cached per host name and CPU model.
#include "quintet/perf/host_peak.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
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
// "key1=v1 key2=v2 cpu=<model>" of this CPU model, or false.
bool read_pair(const std::string& kind, const char* fmt, double* a, double* b) {
    std::ifstream f(cache_file(kind));
    std::string line;
    if (!std::getline(f, line)) return false;
    auto c = line.find(" cpu=");
    if (c == std::string::npos || line.substr(c + 5) != cpu_model()) return false;
    double x = 0, y = 0;
    const int n = std::sscanf(line.c_str(), fmt, &x, &y);
    if (n < 1 || x <= 0) return false;
    *a = x;
    if (b) *b = y;
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
}  // namespace

HostPeak host_fma_peak(bool remeasure) {
    const std::string path = host_peak_cache_path(), cpu = cpu_model();
    HostPeak p;
    // One line: gflops_per_core=<x> isa=<isa> one_core=<y> cpu=<model name to the end of the line>
    double cached = 0, cached_one = 0;
    {
        std::ifstream f(path);
        std::string line;
        char isa[32] = {0};
        auto c = std::string::npos;
        if (std::getline(f, line) && (c = line.find(" cpu=")) != std::string::npos &&
            line.substr(c + 5) == cpu &&
            std::sscanf(line.c_str(), "gflops_per_core=%lf isa=%31s one_core=%lf", &cached, isa,
                        &cached_one) == 3 &&
            cached > 0 && cached_one > 0)
            p.isa = isa;
        else
            cached = cached_one = 0;
    }
    // A peak is only ever read low (another process on the cores), and a low one would inflate
    // every MFU on this host for good. An sgemm is FMAs, so one thread's sgemm rate (cached by
    // `quintet peak`, plan and study) above one core's FMA rate alone says the cached peak was
    // read on a busy host: measure again and keep the higher of the two readings.
    double sgemm_one = 0;
    const bool plausible = cached > 0 && (!read_sgemm_cache(&sgemm_one) || cached_one >= sgemm_one);
    if (!remeasure && plausible) {
        p.gflops_per_core = cached, p.cpu = cpu, p.source = "cached in " + path;
        return p;
    }
    // Every core at once, then per core: a virtual machine's "cores" may be SMT siblings that
    // share FMA units, and only running them together shows it (one alone reads the whole core).
    const int cores = host_cores();
    const FmaPeak m = cpu_measure_fma_peak(cores);
    const FmaPeak one = cores > 1 ? cpu_measure_fma_peak(1) : m;
    p.gflops_per_core = m.gflops / cores, p.isa = m.isa, p.cpu = cpu, p.source = "measured";
    double alone = one.gflops;
    if (!remeasure) {  // --remeasure replaces the entry; otherwise readings only ever go up
        p.gflops_per_core = std::max(p.gflops_per_core, cached);
        alone = std::max(alone, cached_one);
    }
    // Best effort: a read-only home only costs a measurement next time.
    std::ostringstream o;
    o << "gflops_per_core=" << p.gflops_per_core << " isa=" << m.isa << " one_core=" << alone;
    write_line("fma_peak", o.str());
    return p;
}

bool read_link_cache(LinkFigures* out) {
    return read_pair("links", "gbs=%lf latency_s=%lf", &out->gbs, &out->latency_s);
}
void write_link_cache(const LinkFigures& l) {
    std::ostringstream o;
    o << "gbs=" << l.gbs << " latency_s=" << l.latency_s;
    write_line("links", o.str());
}
// Per BLAS: a build with the other one (CMake QUINTET_BLAS) measures its own rate.
const std::string kSgemmKind = std::string("sgemm_") + QUINTET_BLAS_NAME;
bool read_sgemm_cache(double* g) { return read_pair(kSgemmKind, "gflops_per_core=%lf", g, nullptr); }
void write_sgemm_cache(double g) {
    std::ostringstream o;
    o << "gflops_per_core=" << g;
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
        // A rate above the FMA peak of the cores the node's ranks use is a measurement error (a
        // clock that jumped, a reading taken while ranks were idle): it is neither cached nor used.
        const double ceiling = host_fma_peak().gflops_per_core * std::min(host_cores(), ranks * max_threads);
        const bool impossible = node_measured > ceiling;
        double best = 0;
        if (read_pair(kind, "gflops=%lf", &best, nullptr) && best > ceiling) best = 0;  // an impossible cached one
        if (!impossible && (best == 0 || node_measured > best)) {
            std::ostringstream o;
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
