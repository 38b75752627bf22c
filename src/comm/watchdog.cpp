#include "quintet/comm/watchdog.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>

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

void Watchdog::begin(const char* op, const std::string* comm, int comm_rank, int comm_size,
                     uint64_t seq, double deadline_s) {
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
        if (waited <= deadline) continue;
        const std::string* comm = comm_.load(std::memory_order_relaxed);
        char msg[640];
        std::snprintf(msg, sizeof msg,
                      "quintet: rank %d: error: %s #%llu on the %s communicator (rank %d of %d) did "
                      "not complete within %.0f s (train.collective_timeout_s = %g): a rank of "
                      "this group stopped answering, failed, or runs a different schedule; "
                      "ending the job (exit status 4)",
                      rank_, op_.load(std::memory_order_relaxed),
                      (unsigned long long)seq_.load(std::memory_order_relaxed),
                      comm ? comm->c_str() : "?", comm_rank_.load(), comm_size_.load(), waited,
                      deadline);
        expiry_(msg);
        start_ns_.store(0);  // a replaced handler that returns reports once
    }
}

}  // namespace quintet
