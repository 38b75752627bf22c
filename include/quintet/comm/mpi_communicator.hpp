// Communicator over an MPI communicator, for host memory. Errors are returned, not fatal
// (MPI_ERRORS_RETURN), so every call is checked and reported with its text and file:line.
// Deadlines (communicator.hpp): blocking collectives are timed by a Watchdog (they are much
// faster than MPI's non-blocking ones); point-to-point waits and overlapped reductions poll with
// the deadline. Each communicator numbers its operations (seq()), for the fault report.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "quintet/comm/communicator.hpp"
#include "quintet/comm/watchdog.hpp"
#include "quintet/core/trace.hpp"

namespace quintet {

void check_mpi(int rc, const char* what, const char* file, int line);
#define QUINTET_MPI(call) ::quintet::check_mpi((call), #call, __FILE__, __LINE__)

class MpiCommunicator final : public Communicator {
public:
    // Takes ownership of `comm` (freed in the destructor unless it is MPI_COMM_WORLD/SELF).
    // `watchdog` (may be null: then blocking collectives have no deadline) times blocking calls.
    explicit MpiCommunicator(MPI_Comm comm, std::string name = "world", double deadline_s = 0,
                             std::shared_ptr<Watchdog> watchdog = nullptr);
    ~MpiCommunicator() override;
    MpiCommunicator(const MpiCommunicator&) = delete;
    MpiCommunicator& operator=(const MpiCommunicator&) = delete;

    MPI_Comm handle() const { return comm_; }
    uint64_t seq() const { return seq_; }  // operations started on this communicator so far
    const std::vector<int>& world_ranks() const { return world_ranks_; }  // of the members, by rank
    int rank() const override { return rank_; }
    int size() const override { return size_; }
    void all_reduce_sum(float* buf, size_t n) const override;
    void all_reduce_sum(double* buf, size_t n) const override;
    void all_reduce_max(double* buf, size_t n) const override;
    void all_reduce_max(float* buf, size_t n) const override;
    void reduce_scatter_sum(const float* send, float* recv, size_t count) const override;
    void all_gather(const float* send, float* recv, size_t count) const override;
    void all_to_allv(const float* send, const int* sc, const int* sd, float* recv, const int* rc,
                     const int* rd) const override;
    void all_to_allv(const int32_t* send, const int* sc, const int* sd, int32_t* recv,
                     const int* rc, const int* rd) const override;
    void all_to_all_counts(const int* send_counts, int* recv_counts) const override;
    int iall_to_allv(const float* send, const int* sc, const int* sd, float* recv, const int* rc,
                     const int* rd) const override;
    void wait_all_to_allv(int handle) const override;
    void broadcast(void* buf, size_t bytes, int root) const override;
    void barrier() const override;
    void send(const float* buf, size_t n, int peer, int tag) const override;
    void recv(float* buf, size_t n, int peer, int tag, const char* what = "recv") const override;
    int isend(const float* buf, size_t n, int peer, int tag) const override;
    void wait(int handle) const override;
    bool test(int handle) const override;
    int irecv(float* buf, size_t n, int peer, int tag) const override;
    void wait_recv(int handle, const char* what = "recv") const override;
    int iall_reduce_sum(float* buf, size_t n) const override;
    int ireduce_scatter_sum(const float* send, float* recv, size_t count) const override;
    int iall_gather(const float* send, float* recv, size_t count) const override;
    void wait_reduce(int handle) const override;
    void progress() const override;  // tests the started reductions and exchanges

    // ---- host scalars (counts, checksums, per-rank figures) ----
    void all_reduce_sum(int* buf, size_t n) const;
    void all_reduce_sum(uint64_t* buf, size_t n) const;
    void all_reduce_min(int* buf, size_t n) const;
    void all_reduce_max(int* buf, size_t n) const;
    // recv[size()*n] on `root` = every rank's send[n] in rank order (recv is not read elsewhere).
    void gather(const double* send, double* recv, size_t n, int root) const;
    // Every rank's text on `root`, in rank order (cut at 255 bytes; the others get an empty list).
    std::vector<std::string> gather_text(const std::string& mine, int root) const;
    // A barrier that waits asleep (polling every 2 ms) instead of spinning: ranks waiting for a
    // measurement on another rank of their node must leave it the cores.
    void barrier_asleep() const;

    // ---- sub-communicators (collective over this one) ----
    // Each inherits this one's deadline and watchdog; set_deadline/set_watchdog change them.
    // The ranks with the same colour, ordered by key; colour < 0: not a member (nullptr).
    std::unique_ptr<MpiCommunicator> split(int color, int key, std::string name) const;
    // The ranks that share this rank's node (its memory and cores).
    std::unique_ptr<MpiCommunicator> split_node(std::string name = "node") const;
    // A Cartesian topology over these ranks with dims[0] the slowest-varying (row-major, MPI's
    // order; ranks are not reordered), and the sub-grid keeping the dimensions marked in `keep`.
    std::unique_ptr<MpiCommunicator> cartesian(const std::vector<int>& dims, std::string name) const;
    std::unique_ptr<MpiCommunicator> cartesian_sub(const std::vector<int>& keep, std::string name) const;
    std::vector<int> cartesian_coords() const;  // this rank's coordinates (a Cartesian one)
    void set_watchdog(std::shared_ptr<Watchdog> w) { watchdog_ = std::move(w); }

private:
    MPI_Comm comm_;
    int rank_ = 0, size_ = 1;
    std::shared_ptr<Watchdog> watchdog_;
    std::vector<int> world_ranks_;
    mutable uint64_t seq_ = 0;
    trace::Track track_;  // where this communicator's waits go on the timeline (its group's axis)
    // Marks a blocking operation for the watchdog and the timeline (RAII).
    struct Timed {
        Timed(const MpiCommunicator& c, const char* op);
        ~Timed();
        const MpiCommunicator& c;
        trace::Wait wait;
    };
    // Completes `req` within the deadline, else throws DeadlineError naming `op` (and `peer`
    // for point-to-point waits; -1 for collectives). The wait is `event` on `track` in the
    // timeline (op as its detail when they differ).
    void complete(MPI_Request& req, const char* op, int peer, const char* event, trace::Track track) const;
    void all_reduce(void* buf, size_t n, MPI_Datatype type, MPI_Op op, const char* what) const;
    int new_handle() const;
    mutable std::vector<MPI_Request> requests_;  // isend/irecv handles index this
    mutable std::vector<int> peer_of_;           // peer rank of each isend/irecv handle
    // iall_reduce_sum handles index this (apart from requests_: progress() completes these
    // requests, and a completed slot of requests_ may be handed to the next isend)
    mutable std::vector<MPI_Request> reductions_;
    mutable std::vector<const char*> reduction_ops_;  // what each of reductions_ is (deadline messages)
    mutable std::vector<MPI_Request> exchanges_;  // iall_to_allv handles index this
};

}  // namespace quintet
