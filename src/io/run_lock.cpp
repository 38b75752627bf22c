#include "quintet/io/run_lock.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utime.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "quintet/core/error.hpp"

namespace fs = std::filesystem;

namespace quintet {

namespace {

std::string host_name() {
    char h[256] = {0};
    gethostname(h, sizeof h - 1);
    return h;
}

// Tries to create the lock; "" on success, else the holder's line.
std::string try_create(const std::string& path) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd >= 0) {
        std::ostringstream o;
        o << host_name() << " " << getpid() << " " << std::time(nullptr) << "\n";
        const std::string s = o.str();
        const ssize_t n = ::write(fd, s.data(), s.size());
        ::fsync(fd);
        ::close(fd);
        if (n != ssize_t(s.size())) rank_fail("cannot write " + path + ": " + std::strerror(errno));
        return "";
    }
    if (errno != EEXIST) rank_fail("cannot create " + path + ": " + std::strerror(errno));
    std::ifstream f(path);
    std::string line;
    std::getline(f, line);
    return line.empty() ? "(unreadable holder)" : line;
}

// Whether process `pid` of this host still runs (a zombie -- killed, not yet reaped -- does not).
bool alive(long pid) {
    if (pid <= 0) return false;
    if (::kill(pid_t(pid), 0) != 0 && errno == ESRCH) return false;
    std::ifstream st("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(st, line)) return true;  // no /proc: trust kill()
    const size_t close = line.rfind(')');
    return !(close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z');
}

}  // namespace

RunLock::RunLock(const std::string& run_dir, const MpiCommunicator& comm, double stale_after_s, std::string* warning,
                 const std::string& what) {
    const int rank = comm.rank();
    path_ = (fs::path(run_dir) / "lock").string();
    char refusal[512] = {0}, taken[512] = {0};
    if (rank == 0) {
        std::error_code ec;
        created_ = !fs::exists(run_dir, ec);
        dir_ = run_dir;
        fs::create_directories(run_dir, ec);
        for (int attempt = 0; attempt < 2; ++attempt) {
            const std::string holder = try_create(path_);
            if (holder.empty()) {
                held_ = true;
                break;
            }
            std::istringstream in(holder);
            std::string host;
            long pid = 0;
            in >> host >> pid;
            struct stat st {};
            const double age = ::stat(path_.c_str(), &st) == 0 ? std::difftime(std::time(nullptr), st.st_mtime) : 0;
            const bool same_host = host == host_name();
            const bool stale = (same_host && !alive(pid)) ||
                               (!same_host && age > stale_after_s);
            if (!stale || attempt == 1) {
                const std::string owner = what.empty() ? "output.run_dir '" + run_dir + "'" : what;
                std::snprintf(refusal, sizeof refusal,
                              "%s is in use by another %s (lock held by host %s, pid %ld, refreshed %.0f s ago): "
                              "one at a time. Choose another %s, or remove %s if that job is gone",
                              owner.c_str(), what.empty() ? "run" : "job", host.c_str(), pid, age,
                              what.empty() ? "output.run_dir" : "output", path_.c_str());
                break;
            }
            std::snprintf(taken, sizeof taken, "took over the stale lock of %s (host %s, pid %ld: %s)",
                          run_dir.c_str(), host.c_str(), pid, same_host ? "no such process" : "not refreshed");
            fs::remove(path_, ec);
        }
    }
    comm.broadcast(refusal, sizeof refusal, 0);
    comm.broadcast(taken, sizeof taken, 0);
    if (refusal[0]) throw ConfigError(refusal);
    if (taken[0] && warning) *warning = taken;
}

RunLock::~RunLock() {
    if (!held_) return;
    std::error_code ec;
    fs::remove(path_, ec);
    // A run that stopped before writing anything leaves no folder behind.
    if (created_ && fs::is_empty(dir_, ec)) fs::remove(dir_, ec);
}

void RunLock::touch() const {
    if (held_) ::utime(path_.c_str(), nullptr);
}

}  // namespace quintet
