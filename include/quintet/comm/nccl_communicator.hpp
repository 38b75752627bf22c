// Communicator over NCCL, for device memory: one NCCL communicator per MPI communicator (per
// grid axis), bootstrapped by MPI (rank 0 makes the unique id, MPI_Bcast over that
// communicator, ncclCommInitRank). Collectives run on the backend's comm stream, ordered after
// the compute work queued so far and before the compute work queued next, so callers keep
// MPI-like semantics without blocking the host. Defined only in CUDA builds with NCCL
// (QUINTET_WITH_NCCL). Not an MPI replacement for host data beyond the small scalar ops below.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <string>
#include <vector>

#include "quintet/comm/communicator.hpp"
#include "quintet/kernels/cuda_backend.hpp"

struct ncclComm;  // ncclComm_t without nccl.h

namespace quintet {

// The GPU this rank drives: its rank among the ranks of its node (MPI_Comm_split_type
// MPI_COMM_TYPE_SHARED over `world`) modulo the node's visible GPU count.
// Collective over `world`. Throws ConfigError naming train.device when the node has no GPU.
int cuda_local_device(MPI_Comm world);

class NcclCommunicator final : public Communicator {
public:
    // Collective over `comm`. `be` gives the device (already chosen, e.g. from
    // cuda_local_device), the comm stream the collectives run on and the compute stream they are
    // ordered with. `comm` is not kept (nor freed): NCCL needs it only for the bootstrap.
    NcclCommunicator(MPI_Comm comm, CudaBackend& be, std::string name = "nccl",
                     double deadline_s = 0);
    ~NcclCommunicator() override;
    NcclCommunicator(const NcclCommunicator&) = delete;
    NcclCommunicator& operator=(const NcclCommunicator&) = delete;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    // Device buffers, or host buffers (staged through the device and blocking, as MPI): the
    // scalar reductions the trainer does on host (loss sums, norms) work unchanged.
    void all_reduce_sum(float* buf, size_t n) const override;
    void all_reduce_sum(double* buf, size_t n) const override;
    void all_reduce_max(double* buf, size_t n) const override;
    void all_reduce_max(float* buf, size_t n) const override;
    void broadcast(void* buf, size_t bytes, int root) const override;
    // Device buffers only (checked).
    void reduce_scatter_sum(const float* send, float* recv, size_t count) const override;
    void all_gather(const float* send, float* recv, size_t count) const override;
    // Counts/displacements are host arrays (elements), as MPI_Alltoallv; one ncclGroup of
    // ncclSend/ncclRecv pairs.
    void all_to_allv(const float* send, const int* send_counts, const int* send_displs,
                     float* recv, const int* recv_counts, const int* recv_displs) const override;
    void all_to_allv(const int32_t* send, const int* send_counts, const int* send_displs,
                     int32_t* recv, const int* recv_counts, const int* recv_displs) const override;
    // Host counts (staged through the device; blocks the host until they arrived).
    void all_to_all_counts(const int* send_counts, int* recv_counts) const override;
    // Point-to-point: NCCL has no tags (`tag` is ignored); messages between two ranks match in
    // the order they are posted. A send completes on the device only when its receive is
    // posted, so isend() is deferred: it joins the next recv/send/wait in one ncclGroup, which
    // makes the MPI pattern "isend to peer; recv from peer; wait" deadlock-free. Completion is
    // stream-ordered: compute work queued after recv()/wait() sees the data / may reuse the
    // buffer; the host is not blocked unless recv has a timeout.
    void send(const float* buf, size_t n, int peer, int tag) const override;
    // With a deadline the host polls until the data arrived; past it the NCCL communicator is
    // aborted and a DeadlineError names `what` and the peer.
    void recv(float* buf, size_t n, int peer, int tag, const char* what = "recv") const override;
    int isend(const float* buf, size_t n, int peer, int tag) const override;
    void wait(int handle) const override;
    // Queues a deferred isend if needed, then polls its completion on the device (true: done,
    // and the handle is free).
    bool test(int handle) const override;
    // Blocks the host until every rank has reached it (a 1-element all-reduce + stream sync).
    void barrier() const override;

    // ---- DP overlap ----
    // Queue an all-reduce on the comm stream that the compute stream does NOT wait for, so the
    // backward pass continues; wait_pending() makes compute work queued next wait for it.
    void all_reduce_sum_async(float* buf, size_t n) const;
    void wait_pending() const;
    // The Communicator face of the two above (handles are all 0: one wait orders them all).
    int iall_reduce_sum(float* buf, size_t n) const override {
        all_reduce_sum_async(buf, n);
        return 0;
    }
    // ZeRO-2/3: the same, on the comm stream, for the gradient reduce-scatters and the
    // parameter all-gathers.
    int ireduce_scatter_sum(const float* send, float* recv, size_t count) const override;
    int iall_gather(const float* send, float* recv, size_t count) const override;
    void wait_reduce(int) const override { wait_pending(); }

private:
    struct PendingSend {
        const float* buf;
        size_t n;
        int peer, handle;
    };
    void enter() const;                  // comm stream waits for the compute work queued so far
    void leave() const;                  // compute stream waits for the comm work queued so far
    void* staging(size_t bytes) const;   // device scratch for host-buffer collectives
    void host_all_reduce(void* buf, size_t n, size_t elem, int dtype, int op) const;
    // The host waits for the comm stream's work so far, within the deadline (then the NCCL
    // communicator is aborted and DeadlineError names `op`).
    void host_wait(const char* op, int peer = -1) const;
    void alltoallv(const void* send, const int* sc, const int* sd, void* recv, const int* rc,
                   const int* rd, int dtype, size_t elem) const;
    void device_all_reduce(void* buf, size_t n, int dtype, int op) const;
    // Queue the deferred isends (and `extra`, a send or recv, when given) as one ncclGroup on
    // the comm stream, then mark their handles complete at that point of the stream.
    void flush_sends(const float* extra_buf = nullptr, size_t extra_n = 0, int extra_peer = -1,
                     bool extra_is_recv = false) const;

    CudaBackend& be_;
    mutable ncclComm* comm_ = nullptr;  // null after a recv timeout aborted it
    int rank_ = 0, size_ = 1, device_ = 0;
    void* ev_compute_ = nullptr;          // cudaEvent_t
    void* ev_comm_ = nullptr;             // cudaEvent_t
    mutable void* stage_ = nullptr;       // device staging buffer
    mutable size_t stage_bytes_ = 0;
    mutable std::vector<PendingSend> pending_;  // isends not yet queued
    mutable std::vector<void*> handle_event_;   // handle -> cudaEvent_t marking its completion
    mutable std::vector<int> handle_state_;     // 0 free, 1 deferred, 2 queued
};

}  // namespace quintet
