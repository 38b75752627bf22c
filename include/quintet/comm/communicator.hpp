// One interface for the collectives every parallel axis uses. Implementations: MPI for host
// memory (comm/mpi_communicator), NCCL for device memory (comm/nccl_communicator). A
// communicator is a value handed to whoever needs it; nothing below main() names
// MPI_COMM_WORLD. Every method is collective over this communicator's ranks unless it says
// point-to-point.
//
// Deadlines: every operation that waits -- a collective, a receive, a wait on a send -- waits at
// most deadline() seconds (train.collective_timeout_s; 0 = forever). When the deadline passes it
// throws DeadlineError naming the communicator (its group: "tp", "dp_cp", ...), the operation and
// how long it waited, so a rank that stopped answering ends the job instead of hanging it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace quintet {

// A wait that passed its deadline (a rank-local failure: the job is aborted with exit status 4,
// a transient fault; docs/reliability.md).
struct DeadlineError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

class Communicator {
public:
    explicit Communicator(std::string name = "comm", double deadline_s = 0)
        : name_(std::move(name)), deadline_s_(deadline_s) {}
    virtual ~Communicator() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    const std::string& name() const { return name_; }  // the group it spans: "tp", "dp_cp", ...
    double deadline() const { return deadline_s_; }    // seconds; 0 = none
    void set_deadline(double s) { deadline_s_ = s; }

    virtual void all_reduce_sum(float* buf, size_t n) const = 0;
    virtual void all_reduce_sum(double* buf, size_t n) const = 0;
    virtual void all_reduce_max(double* buf, size_t n) const = 0;
    virtual void all_reduce_max(float* buf, size_t n) const = 0;
    // recv[count] = sum over ranks of send[rank*count, (rank+1)*count)
    virtual void reduce_scatter_sum(const float* send, float* recv, size_t count) const = 0;
    // recv[size*count] = concatenation of every rank's send[count]
    virtual void all_gather(const float* send, float* recv, size_t count) const = 0;
    // Variable all-to-all; counts and displacements (host arrays [size]) in elements. The
    // int32 form carries integer payloads (token ids, expert indices) bit for bit.
    virtual void all_to_allv(const float* send, const int* send_counts, const int* send_displs,
                             float* recv, const int* recv_counts, const int* recv_displs) const = 0;
    virtual void all_to_allv(const int32_t* send, const int* send_counts, const int* send_displs,
                             int32_t* recv, const int* recv_counts, const int* recv_displs) const = 0;
    // The counts exchange that precedes an all_to_allv: recv_counts[r] = rank r's
    // send_counts[this rank] (host arrays [size]).
    virtual void all_to_all_counts(const int* send_counts, int* recv_counts) const = 0;
    // Non-blocking all_to_allv (MoE's token exchange, overlapped with the shared expert):
    // complete once wait_all_to_allv(handle) returns; the buffers and the four host arrays stay
    // untouched meanwhile. The default exchanges at once (correct, without overlap).
    virtual int iall_to_allv(const float* send, const int* send_counts, const int* send_displs,
                             float* recv, const int* recv_counts, const int* recv_displs) const {
        all_to_allv(send, send_counts, send_displs, recv, recv_counts, recv_displs);
        return -1;
    }
    virtual void wait_all_to_allv(int handle) const { (void)handle; }
    virtual void broadcast(void* buf, size_t bytes, int root) const = 0;
    virtual void barrier() const = 0;

    // Point-to-point (pipeline, ring attention). `what` names the transfer in a deadline message.
    virtual void send(const float* buf, size_t n, int peer, int tag) const = 0;
    virtual void recv(float* buf, size_t n, int peer, int tag, const char* what = "recv") const = 0;
    // Non-blocking send; `buf` must stay untouched until wait(handle) returns.
    virtual int isend(const float* buf, size_t n, int peer, int tag) const = 0;
    virtual void wait(int handle) const = 0;
    virtual bool test(int handle) const = 0;  // true once the send completed (then handle is free)
    // Non-blocking receive, completed by wait_recv. The default defers the whole receive to
    // wait_recv (correct, without overlap); MPI posts it at once so the message can land while
    // this rank computes.
    virtual int irecv(float* buf, size_t n, int peer, int tag) const;
    virtual void wait_recv(int handle, const char* what = "recv") const;

    // Non-blocking in-place sum (the DP gradient buckets that overlap the backward): started
    // now, complete once wait_reduce(handle) returns; `buf` is not touched by the caller
    // meanwhile. Every rank starts them in the same order. The default reduces at once
    // (correct, without overlap); MPI uses MPI_Iallreduce, NCCL the comm stream.
    virtual int iall_reduce_sum(float* buf, size_t n) const {
        all_reduce_sum(buf, n);
        return -1;
    }
    virtual void wait_reduce(int handle) const { (void)handle; }
    // Non-blocking reduce_scatter_sum and all_gather (ZeRO-2/3's gradient reductions and
    // parameter gathers, overlapped with compute), completed by wait_reduce like the above;
    // neither buffer is touched meanwhile. The defaults run at once.
    virtual int ireduce_scatter_sum(const float* send, float* recv, size_t count) const {
        reduce_scatter_sum(send, recv, count);
        return -1;
    }
    virtual int iall_gather(const float* send, float* recv, size_t count) const {
        all_gather(send, recv, count);
        return -1;
    }
    // Lets started operations advance while the caller computes (MPI moves data only inside
    // its calls, unless it runs a progress thread).
    virtual void progress() const {}

private:
    std::string name_;
    double deadline_s_ = 0;
    struct DeferredRecv {
        float* buf;
        size_t n;
        int peer, tag;
    };
    mutable std::vector<DeferredRecv> deferred_;
};

inline int Communicator::irecv(float* buf, size_t n, int peer, int tag) const {
    deferred_.push_back({buf, n, peer, tag});
    return int(deferred_.size()) - 1;
}
inline void Communicator::wait_recv(int h, const char* what) const {
    DeferredRecv d = deferred_[size_t(h)];
    recv(d.buf, d.n, d.peer, d.tag, what);
    if (size_t(h) + 1 == deferred_.size()) deferred_.pop_back();
}

}  // namespace quintet
