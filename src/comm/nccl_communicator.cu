// NCCL implementation of Communicator (see nccl_communicator.hpp): bootstrap over MPI, every
// collective on the backend's comm stream, ordered after the compute stream's queued work and
// before its next work with a pair of events, so the host is never blocked except where MPI
// semantics need host data (host buffers, barrier).
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "../kernels/cuda/cuda_check.cuh"
#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/comm/nccl_communicator.hpp"
#include "quintet/core/error.hpp"

namespace quintet {

namespace {

cudaStream_t stream_of(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t event_of(void* e) { return static_cast<cudaEvent_t>(e); }

bool is_device_pointer(const void* p) {
    cudaPointerAttributes attr{};
    const cudaError_t rc = cudaPointerGetAttributes(&attr, p);
    if (rc != cudaSuccess) {  // older runtimes report plain host memory as an error
        (void)cudaGetLastError();
        return false;
    }
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

void require_device(const void* p, const char* what) {
    if (p != nullptr && !is_device_pointer(p))
        rank_fail(std::string("NcclCommunicator::") + what +
                  ": buffer is host memory; NCCL collectives need device buffers");
}

}  // namespace

int cuda_local_device(MPI_Comm world) {
    MPI_Comm node = MPI_COMM_NULL;
    QUINTET_MPI(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    int local = 0;
    QUINTET_MPI(MPI_Comm_rank(node, &local));
    QUINTET_MPI(MPI_Comm_free(&node));
    int n = 0;
    const cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        config_fail("train.device", "cuda",
                    std::string("no CUDA device on this node: ") +
                        (rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices") +
                        " (valid here: cpu)");
    }
    return local % n;
}

NcclCommunicator::NcclCommunicator(MPI_Comm comm, CudaBackend& be, std::string name, double deadline_s)
    : Communicator(std::move(name), deadline_s), be_(be) {
    QUINTET_MPI(MPI_Comm_rank(comm, &rank_));
    QUINTET_MPI(MPI_Comm_size(comm, &size_));
    device_ = be_.device_index();
    QUINTET_CUDA_CHECK(cudaSetDevice(device_));
    ncclUniqueId id{};
    if (rank_ == 0) QUINTET_NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
    QUINTET_MPI(MPI_Bcast(&id, int(sizeof(id)), MPI_BYTE, 0, comm));
    ncclComm_t c = nullptr;
    QUINTET_NCCL_CHECK(ncclCommInitRank(&c, size_, id, rank_), nullptr);
    comm_ = c;
    cudaEvent_t a = nullptr, b = nullptr;
    QUINTET_CUDA_CHECK(cudaEventCreateWithFlags(&a, cudaEventDisableTiming));
    QUINTET_CUDA_CHECK(cudaEventCreateWithFlags(&b, cudaEventDisableTiming));
    ev_compute_ = a;
    ev_comm_ = b;
}

NcclCommunicator::~NcclCommunicator() {
    if (!pending_.empty())
        std::fprintf(stderr, "NcclCommunicator: %zu isend(s) never waited for (dropped)\n",
                     pending_.size());
    QUINTET_CUDA_WARN(cudaStreamSynchronize(stream_of(be_.comm_stream())));
    if (comm_ != nullptr) {
        const ncclResult_t rc = ncclCommDestroy(comm_);
        if (rc != ncclSuccess)
            std::fprintf(stderr, "ncclCommDestroy failed: %s (ignored during clean-up)\n",
                         ncclGetErrorString(rc));
    }
    if (stage_ != nullptr) QUINTET_CUDA_WARN(cudaFree(stage_));
    for (void* e : handle_event_)
        if (e != nullptr) QUINTET_CUDA_WARN(cudaEventDestroy(event_of(e)));
    if (ev_compute_ != nullptr) QUINTET_CUDA_WARN(cudaEventDestroy(event_of(ev_compute_)));
    if (ev_comm_ != nullptr) QUINTET_CUDA_WARN(cudaEventDestroy(event_of(ev_comm_)));
}

void NcclCommunicator::enter() const {
    QUINTET_CUDA_CHECK(cudaEventRecord(event_of(ev_compute_), stream_of(be_.compute_stream())));
    QUINTET_CUDA_CHECK(cudaStreamWaitEvent(stream_of(be_.comm_stream()), event_of(ev_compute_), 0));
}

void NcclCommunicator::leave() const {
    QUINTET_CUDA_CHECK(cudaEventRecord(event_of(ev_comm_), stream_of(be_.comm_stream())));
    QUINTET_CUDA_CHECK(cudaStreamWaitEvent(stream_of(be_.compute_stream()), event_of(ev_comm_), 0));
}

void* NcclCommunicator::staging(size_t bytes) const {
    if (bytes > stage_bytes_) {
        // Grows rarely (host-buffer collectives are scalars). cudaFree waits for the device, so
        // no queued collective still uses the old buffer.
        if (stage_ != nullptr) QUINTET_CUDA_CHECK(cudaFree(stage_));
        stage_ = nullptr;
        stage_bytes_ = 0;
        QUINTET_CUDA_CHECK(cudaMalloc(&stage_, bytes));
        stage_bytes_ = bytes;
    }
    return stage_;
}

void NcclCommunicator::flush_sends(const float* extra_buf, size_t extra_n, int extra_peer,
                                   bool extra_is_recv) const {
    const bool extra = extra_peer >= 0 && extra_n > 0;
    if (pending_.empty() && !extra) return;
    cudaStream_t s = stream_of(be_.comm_stream());
    enter();
    QUINTET_NCCL_CHECK(ncclGroupStart(), comm_);
    for (const PendingSend& p : pending_)
        QUINTET_NCCL_CHECK(ncclSend(p.buf, p.n, ncclFloat, p.peer, comm_, s), comm_);
    if (extra) {
        if (extra_is_recv)
            QUINTET_NCCL_CHECK(
                ncclRecv(const_cast<float*>(extra_buf), extra_n, ncclFloat, extra_peer, comm_, s),
                comm_);
        else
            QUINTET_NCCL_CHECK(ncclSend(extra_buf, extra_n, ncclFloat, extra_peer, comm_, s), comm_);
    }
    QUINTET_NCCL_CHECK(ncclGroupEnd(), comm_);
    for (const PendingSend& p : pending_) {
        QUINTET_CUDA_CHECK(cudaEventRecord(event_of(handle_event_[size_t(p.handle)]), s));
        handle_state_[size_t(p.handle)] = 2;
    }
    pending_.clear();
}

// A collective on host memory: copy in, reduce on the device, copy out, wait (MPI semantics).
void NcclCommunicator::host_all_reduce(void* buf, size_t n, size_t elem, int dtype,
                                       int op) const {
    flush_sends();
    cudaStream_t s = stream_of(be_.comm_stream());
    void* d = staging(n * elem);
    QUINTET_CUDA_CHECK(cudaMemcpyAsync(d, buf, n * elem, cudaMemcpyHostToDevice, s));
    QUINTET_NCCL_CHECK(ncclAllReduce(d, d, n, ncclDataType_t(dtype), ncclRedOp_t(op), comm_, s),
                       comm_);
    QUINTET_CUDA_CHECK(cudaMemcpyAsync(buf, d, n * elem, cudaMemcpyDeviceToHost, s));
    host_wait("all_reduce (host buffer)");
}

void NcclCommunicator::host_wait(const char* op, int peer) const {
    cudaStream_t s = stream_of(be_.comm_stream());
    if (deadline() <= 0) {
        QUINTET_CUDA_CHECK(cudaStreamSynchronize(s));
        return;
    }
    QUINTET_CUDA_CHECK(cudaEventRecord(event_of(ev_comm_), s));
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
        const cudaError_t q = cudaEventQuery(event_of(ev_comm_));
        if (q == cudaSuccess) return;
        if (q != cudaErrorNotReady) QUINTET_CUDA_CHECK(q);
        ncclResult_t async = ncclSuccess;
        QUINTET_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async), comm_);
        QUINTET_NCCL_CHECK(async, comm_);
        const double waited =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (waited > deadline()) {
            ncclCommAbort(comm_);  // unblocks the device; this communicator is unusable
            comm_ = nullptr;
            throw DeadlineError(std::string(op) + " on the " + name() + " NCCL communicator (rank " +
                                std::to_string(rank_) + " of " + std::to_string(size_) + ")" +
                                (peer >= 0 ? "; peer rank " + std::to_string(peer) : std::string()) +
                                " did not complete within " + std::to_string(int(waited)) +
                                " s (train.collective_timeout_s); a rank stopped answering");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(waited < 0.01 ? 10 : 200));
    }
}

void NcclCommunicator::device_all_reduce(void* buf, size_t n, int dtype, int op) const {
    flush_sends();
    enter();
    QUINTET_NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclDataType_t(dtype), ncclRedOp_t(op), comm_,
                                     stream_of(be_.comm_stream())),
                       comm_);
    leave();
}

void NcclCommunicator::all_reduce_sum(float* buf, size_t n) const {
    if (n == 0) return;
    if (is_device_pointer(buf)) device_all_reduce(buf, n, ncclFloat, ncclSum);
    else host_all_reduce(buf, n, sizeof(float), ncclFloat, ncclSum);
}

void NcclCommunicator::all_reduce_sum(double* buf, size_t n) const {
    if (n == 0) return;
    if (is_device_pointer(buf)) device_all_reduce(buf, n, ncclDouble, ncclSum);
    else host_all_reduce(buf, n, sizeof(double), ncclDouble, ncclSum);
}

void NcclCommunicator::all_reduce_max(double* buf, size_t n) const {
    if (n == 0) return;
    if (is_device_pointer(buf)) device_all_reduce(buf, n, ncclDouble, ncclMax);
    else host_all_reduce(buf, n, sizeof(double), ncclDouble, ncclMax);
}

void NcclCommunicator::all_reduce_max(float* buf, size_t n) const {
    if (n == 0) return;
    if (is_device_pointer(buf)) device_all_reduce(buf, n, ncclFloat, ncclMax);
    else host_all_reduce(buf, n, sizeof(float), ncclFloat, ncclMax);
}

void NcclCommunicator::broadcast(void* buf, size_t bytes, int root) const {
    if (bytes == 0) return;
    flush_sends();
    cudaStream_t s = stream_of(be_.comm_stream());
    if (!is_device_pointer(buf)) {
        void* d = staging(bytes);
        QUINTET_CUDA_CHECK(cudaMemcpyAsync(d, buf, bytes, cudaMemcpyHostToDevice, s));
        QUINTET_NCCL_CHECK(ncclBroadcast(d, d, bytes, ncclUint8, root, comm_, s), comm_);
        QUINTET_CUDA_CHECK(cudaMemcpyAsync(buf, d, bytes, cudaMemcpyDeviceToHost, s));
        host_wait("broadcast (host buffer)");
        return;
    }
    enter();
    QUINTET_NCCL_CHECK(ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_, s), comm_);
    leave();
}

void NcclCommunicator::reduce_scatter_sum(const float* send, float* recv, size_t count) const {
    if (count == 0) return;
    require_device(send, "reduce_scatter_sum");
    require_device(recv, "reduce_scatter_sum");
    flush_sends();
    enter();
    QUINTET_NCCL_CHECK(ncclReduceScatter(send, recv, count, ncclFloat, ncclSum, comm_,
                                         stream_of(be_.comm_stream())),
                       comm_);
    leave();
}

void NcclCommunicator::all_gather(const float* send, float* recv, size_t count) const {
    if (count == 0) return;
    require_device(send, "all_gather");
    require_device(recv, "all_gather");
    flush_sends();
    enter();
    // In place when send == recv + rank*count, as NCCL allows.
    QUINTET_NCCL_CHECK(
        ncclAllGather(send, recv, count, ncclFloat, comm_, stream_of(be_.comm_stream())), comm_);
    leave();
}

void NcclCommunicator::alltoallv(const void* send, const int* sc, const int* sd, void* recv,
                                 const int* rc, const int* rd, int dtype, size_t elem) const {
    require_device(send, "all_to_allv");
    require_device(recv, "all_to_allv");
    flush_sends();
    cudaStream_t s = stream_of(be_.comm_stream());
    enter();
    QUINTET_NCCL_CHECK(ncclGroupStart(), comm_);
    for (int p = 0; p < size_; ++p) {
        if (sc[p] > 0)
            QUINTET_NCCL_CHECK(ncclSend(static_cast<const char*>(send) + size_t(sd[p]) * elem,
                                        size_t(sc[p]), ncclDataType_t(dtype), p, comm_, s),
                               comm_);
        if (rc[p] > 0)
            QUINTET_NCCL_CHECK(ncclRecv(static_cast<char*>(recv) + size_t(rd[p]) * elem,
                                        size_t(rc[p]), ncclDataType_t(dtype), p, comm_, s),
                               comm_);
    }
    QUINTET_NCCL_CHECK(ncclGroupEnd(), comm_);
    leave();
}

void NcclCommunicator::all_to_allv(const float* send, const int* sc, const int* sd, float* recv,
                                   const int* rc, const int* rd) const {
    alltoallv(send, sc, sd, recv, rc, rd, ncclFloat, sizeof(float));
}

void NcclCommunicator::all_to_allv(const int32_t* send, const int* sc, const int* sd,
                                   int32_t* recv, const int* rc, const int* rd) const {
    alltoallv(send, sc, sd, recv, rc, rd, ncclInt32, sizeof(int32_t));
}

void NcclCommunicator::all_to_all_counts(const int* send_counts, int* recv_counts) const {
    flush_sends();
    cudaStream_t s = stream_of(be_.comm_stream());
    const size_t bytes = size_t(size_) * sizeof(int);
    auto* d = static_cast<int*>(staging(2 * bytes));
    QUINTET_CUDA_CHECK(cudaMemcpyAsync(d, send_counts, bytes, cudaMemcpyHostToDevice, s));
    QUINTET_NCCL_CHECK(ncclGroupStart(), comm_);
    for (int p = 0; p < size_; ++p) {
        QUINTET_NCCL_CHECK(ncclSend(d + p, 1, ncclInt32, p, comm_, s), comm_);
        QUINTET_NCCL_CHECK(ncclRecv(d + size_ + p, 1, ncclInt32, p, comm_, s), comm_);
    }
    QUINTET_NCCL_CHECK(ncclGroupEnd(), comm_);
    QUINTET_CUDA_CHECK(cudaMemcpyAsync(recv_counts, d + size_, bytes, cudaMemcpyDeviceToHost, s));
    host_wait("all_to_all_counts");
}

void NcclCommunicator::send(const float* buf, size_t n, int peer, int) const {
    require_device(buf, "send");
    flush_sends(buf, n, peer, false);
    leave();  // buffer reusable by compute work queued next (MPI_Send semantics)
}

void NcclCommunicator::recv(float* buf, size_t n, int peer, int, const char* what) const {
    require_device(buf, what);
    flush_sends(buf, n, peer, true);
    if (deadline() > 0 && n > 0) host_wait(what, peer);
    leave();
}

int NcclCommunicator::isend(const float* buf, size_t n, int peer, int) const {
    require_device(buf, "isend");
    size_t h = 0;
    while (h < handle_state_.size() && handle_state_[h] != 0) ++h;
    if (h == handle_state_.size()) {
        cudaEvent_t e = nullptr;
        QUINTET_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        handle_event_.push_back(e);
        handle_state_.push_back(0);
    }
    if (n == 0) {  // nothing to send: complete at once
        QUINTET_CUDA_CHECK(
            cudaEventRecord(event_of(handle_event_[h]), stream_of(be_.comm_stream())));
        handle_state_[h] = 2;
        return int(h);
    }
    handle_state_[h] = 1;
    pending_.push_back({buf, n, peer, int(h)});
    return int(h);
}

void NcclCommunicator::wait(int handle) const {
    const size_t h = size_t(handle);
    QUINTET_CHECK(h < handle_state_.size() && handle_state_[h] != 0,
                  "NcclCommunicator::wait of an unknown or already waited-for handle");
    if (handle_state_[h] == 1) flush_sends();
    QUINTET_CUDA_CHECK(cudaStreamWaitEvent(stream_of(be_.compute_stream()),
                                           event_of(handle_event_[h]), 0));
    handle_state_[h] = 0;
}

bool NcclCommunicator::test(int handle) const {
    const size_t h = size_t(handle);
    QUINTET_CHECK(h < handle_state_.size() && handle_state_[h] != 0,
                  "NcclCommunicator::test of an unknown or already completed handle");
    if (handle_state_[h] == 1) flush_sends();  // a deferred send would never progress
    const cudaError_t q = cudaEventQuery(event_of(handle_event_[h]));
    if (q == cudaErrorNotReady) return false;
    QUINTET_CUDA_CHECK(q);
    handle_state_[h] = 0;
    return true;
}

void NcclCommunicator::barrier() const {
    flush_sends();
    cudaStream_t s = stream_of(be_.comm_stream());
    enter();
    auto* d = static_cast<float*>(staging(sizeof(float)));
    QUINTET_NCCL_CHECK(ncclAllReduce(d, d, 1, ncclFloat, ncclSum, comm_, s), comm_);
    host_wait("barrier");
}

void NcclCommunicator::all_reduce_sum_async(float* buf, size_t n) const {
    if (n == 0) return;
    require_device(buf, "all_reduce_sum_async");
    flush_sends();
    enter();
    QUINTET_NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, comm_,
                                     stream_of(be_.comm_stream())),
                       comm_);
}

void NcclCommunicator::wait_pending() const { leave(); }

int NcclCommunicator::ireduce_scatter_sum(const float* send, float* recv, size_t count) const {
    if (count == 0) return 0;
    require_device(send, "ireduce_scatter_sum");
    require_device(recv, "ireduce_scatter_sum");
    flush_sends();
    enter();
    QUINTET_NCCL_CHECK(ncclReduceScatter(send, recv, count, ncclFloat, ncclSum, comm_,
                                         stream_of(be_.comm_stream())),
                       comm_);
    return 0;
}

int NcclCommunicator::iall_gather(const float* send, float* recv, size_t count) const {
    if (count == 0) return 0;
    require_device(send, "iall_gather");
    require_device(recv, "iall_gather");
    flush_sends();
    enter();
    QUINTET_NCCL_CHECK(
        ncclAllGather(send, recv, count, ncclFloat, comm_, stream_of(be_.comm_stream())), comm_);
    return 0;
}

}  // namespace quintet
