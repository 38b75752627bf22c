// The deadline of blocking collectives. Open MPI's blocking collectives are 2-3x faster than
// their non-blocking twins on shared memory (docs/architecture.md, "Deadlines"), so they stay
// blocking, and a watchdog thread times them instead: a communicator marks the start and end of
// each blocking operation here (two atomic stores, no MPI); the thread wakes every 100 ms and,
// once an operation has run past its deadline, reports it and ends this process with exit status
// 4 (a transient fault, docs/reliability.md), which makes mpirun end the whole job. The thread
// makes no MPI calls (MPI_THREAD_FUNNELED is enough). Waits that poll (point-to-point,
// overlapped buckets) check their deadline themselves and throw DeadlineError instead.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace quintet {

class Watchdog {
public:
    // `rank` names this process in the report.
    explicit Watchdog(int rank);
    ~Watchdog();
    Watchdog(const Watchdog&) = delete;
    Watchdog& operator=(const Watchdog&) = delete;

    // What the thread does when a deadline passes: by default print `report` to stderr and
    // _exit(4). The faults issue replaces it (fault file, naming the ranks that did not arrive).
    void on_expiry(std::function<void(const std::string& report)> f);

    // One blocking operation at a time (the MPI-calling thread is single). `op` and `comm` must
    // outlive the operation (string literals, the communicator's name); `members` (may be null):
    // the world ranks of the communicator, for naming the ranks that did not arrive.
    void begin(const char* op, const std::string* comm, int comm_rank, int comm_size,
               uint64_t seq, double deadline_s, const std::vector<int>* members = nullptr);
    void end();

    // The side channel that names the ranks that did not arrive (docs/reliability.md): each rank
    // that has waited in one operation for over a second writes "comm seq op" to
    // status_dir/<world rank> (the thread for blocking collectives, the polling waits themselves
    // otherwise); when a deadline passes, the members whose file does not show the same
    // operation -- no file, or an older one -- are the ranks that never arrived. No MPI call:
    // it works while the collective is stuck. "" = off.
    void set_status_dir(const std::string& dir);
    void publish(const std::string& comm, uint64_t seq, const char* op) const;
    // ", ranks that did not arrive: 3 (last seen: ...), 5 (no report)" for an operation, or "".
    std::string absent(const std::vector<int>& members, const std::string& comm, uint64_t seq) const;

private:
    void run();
    int rank_;
    std::atomic<int64_t> start_ns_{0};  // 0: no operation in progress
    std::atomic<const char*> op_{nullptr};
    std::atomic<const std::string*> comm_{nullptr};
    std::atomic<int> comm_rank_{0}, comm_size_{0};
    std::atomic<uint64_t> seq_{0};
    std::atomic<double> deadline_s_{0};
    std::atomic<const std::vector<int>*> members_{nullptr};
    std::string status_dir_;  // set before the first operation
    uint64_t published_ = 0;  // the thread's last published sequence number
    std::function<void(const std::string&)> expiry_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace quintet
