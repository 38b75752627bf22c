#include "quintet/comm/watchdog.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace quintet {

namespace {
int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}
}  // namespace

Watchdog::Watchdog(int rank) : rank_(rank) {
    expiry_ = [](const std::string& report) {
        std::fprintf(stderr, "%s\n", report.c_str());
        std::fflush(stderr);
        _exit(4);
    };
    thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

void Watchdog::on_expiry(std::function<void(const std::string&)> f) {
    std::lock_guard<std::mutex> lock(mu_);
    expiry_ = std::move(f);
}

void Watchdog::set_status_dir(const std::string& dir) {
    std::lock_guard<std::mutex> lock(mu_);
    status_dir_ = dir;
    if (dir.empty()) return;
    std::error_code ec;
    std::filesystem::remove(std::filesystem::path(dir) / std::to_string(rank_), ec);  // a previous job's
}

void Watchdog::publish(const std::string& comm, uint64_t seq, const char* op) const {
    if (status_dir_.empty()) return;
    const std::string path = status_dir_ + "/" + std::to_string(rank_), tmp = path + ".tmp";
    std::error_code ec;
    std::filesystem::create_directories(status_dir_, ec);  // first long wait only: no empty folders
    if (FILE* f = std::fopen(tmp.c_str(), "w")) {
        std::fprintf(f, "%s %llu %s\n", comm.c_str(), (unsigned long long)seq, op);
        std::fclose(f);
        std::rename(tmp.c_str(), path.c_str());
    }
}

std::string Watchdog::absent(const std::vector<int>& members, const std::string& comm, uint64_t seq) const {
    if (status_dir_.empty()) return "";
    std::string out;
    for (int m : members) {
        if (m == rank_) continue;
        std::ifstream f(status_dir_ + "/" + std::to_string(m));
        std::string c, op;
        unsigned long long q = 0;
        const bool seen = bool(f >> c >> q) && std::getline(f, op);
        if (seen && c == comm && q == seq) continue;  // waiting in the same operation: it arrived
        out += (out.empty() ? "" : ", ") + std::to_string(m) +
               (seen ? " (last seen waiting in" + op + " #" + std::to_string(q) + " on " + c + ")" : " (no report)");
    }
    return out.empty() ? "" : "; world ranks that did not arrive: " + out;
}

void Watchdog::begin(const char* op, const std::string* comm, int comm_rank, int comm_size,
                     uint64_t seq, double deadline_s, const std::vector<int>* members) {
    members_.store(members, std::memory_order_relaxed);
    op_.store(op, std::memory_order_relaxed);
    comm_.store(comm, std::memory_order_relaxed);
    comm_rank_.store(comm_rank, std::memory_order_relaxed);
    comm_size_.store(comm_size, std::memory_order_relaxed);
    seq_.store(seq, std::memory_order_relaxed);
    deadline_s_.store(deadline_s, std::memory_order_relaxed);
    start_ns_.store(now_ns(), std::memory_order_release);
}

void Watchdog::end() { start_ns_.store(0, std::memory_order_release); }

void Watchdog::run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
        cv_.wait_for(lock, std::chrono::milliseconds(100));
        if (stop_) break;
        const int64_t start = start_ns_.load(std::memory_order_acquire);
        const double deadline = deadline_s_.load(std::memory_order_relaxed);
        if (start == 0 || deadline <= 0) continue;
        const double waited = double(now_ns() - start) * 1e-9;
        const std::string* comm = comm_.load(std::memory_order_relaxed);
        const uint64_t seq = seq_.load(std::memory_order_relaxed);
        if (waited > 1.0 && published_ != seq && comm) {  // a long wait: tell the others where we are
            publish(*comm, seq, op_.load(std::memory_order_relaxed));
            published_ = seq;
        }
        if (waited <= deadline) continue;
        const std::vector<int>* members = members_.load(std::memory_order_relaxed);
        const std::string missing = members && comm ? absent(*members, *comm, seq) : "";
        char msg[2048];
        std::snprintf(msg, sizeof msg,
                      "quintet: rank %d: error: %s #%llu on the %s communicator (rank %d of %d) did "
                      "not complete within %.0f s (train.collective_timeout_s = %g): a rank of "
                      "this group stopped answering, failed, or runs a different schedule%s; "
                      "ending the job (exit status 4)",
                      rank_, op_.load(std::memory_order_relaxed),
                      (unsigned long long)seq_.load(std::memory_order_relaxed),
                      comm ? comm->c_str() : "?", comm_rank_.load(), comm_size_.load(), waited,
                      deadline, missing.c_str());
        expiry_(msg);
        start_ns_.store(0);  // a replaced handler that returns reports once
    }
}

}  // namespace quintet
