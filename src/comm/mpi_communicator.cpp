#include "quintet/comm/mpi_communicator.hpp"

#include <algorithm>
#include <climits>
#include <unistd.h>

#include "quintet/core/error.hpp"

namespace quintet {

void check_mpi(int rc, const char* what, const char* file, int line) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    rank_fail(std::string(file) + ":" + std::to_string(line) + ": " + what + " failed: " +
              std::string(text, len));
}

namespace {
// MPI counts are int: large buffers go in chunks.
constexpr size_t kMaxCount = size_t(INT_MAX) / 2;
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    QUINTET_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    QUINTET_MPI(MPI_Comm_rank(comm_, &rank_));
    QUINTET_MPI(MPI_Comm_size(comm_, &size_));
}

MpiCommunicator::~MpiCommunicator() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF && comm_ != MPI_COMM_NULL)
        MPI_Comm_free(&comm_);
}

void MpiCommunicator::all_reduce_sum(float* buf, size_t n) const {
    for (size_t off = 0; off < n; off += kMaxCount)
        QUINTET_MPI(MPI_Allreduce(MPI_IN_PLACE, buf + off, int(std::min(kMaxCount, n - off)),
                                  MPI_FLOAT, MPI_SUM, comm_));
}
void MpiCommunicator::all_reduce_sum(double* buf, size_t n) const {
    QUINTET_MPI(MPI_Allreduce(MPI_IN_PLACE, buf, int(n), MPI_DOUBLE, MPI_SUM, comm_));
}
void MpiCommunicator::all_reduce_max(double* buf, size_t n) const {
    QUINTET_MPI(MPI_Allreduce(MPI_IN_PLACE, buf, int(n), MPI_DOUBLE, MPI_MAX, comm_));
}
void MpiCommunicator::all_reduce_max(float* buf, size_t n) const {
    QUINTET_MPI(MPI_Allreduce(MPI_IN_PLACE, buf, int(n), MPI_FLOAT, MPI_MAX, comm_));
}
void MpiCommunicator::reduce_scatter_sum(const float* send, float* recv, size_t count) const {
    QUINTET_CHECK(count <= kMaxCount, "reduce_scatter count too large");
    QUINTET_MPI(MPI_Reduce_scatter_block(send, recv, int(count), MPI_FLOAT, MPI_SUM, comm_));
}
void MpiCommunicator::all_gather(const float* send, float* recv, size_t count) const {
    QUINTET_CHECK(count <= kMaxCount, "all_gather count too large");
    QUINTET_MPI(MPI_Allgather(send == recv + size_t(rank_) * count ? MPI_IN_PLACE : send,
                              int(count), MPI_FLOAT, recv, int(count), MPI_FLOAT, comm_));
}
void MpiCommunicator::all_to_allv(const float* send, const int* sc, const int* sd, float* recv,
                                  const int* rc, const int* rd) const {
    QUINTET_MPI(MPI_Alltoallv(send, sc, sd, MPI_FLOAT, recv, rc, rd, MPI_FLOAT, comm_));
}
void MpiCommunicator::send(const float* buf, size_t n, int peer, int tag) const {
    QUINTET_MPI(MPI_Send(buf, int(n), MPI_FLOAT, peer, tag, comm_));
}
void MpiCommunicator::recv(float* buf, size_t n, int peer, int tag, double timeout_s,
                           const char* what) const {
    if (timeout_s <= 0) {
        QUINTET_MPI(MPI_Recv(buf, int(n), MPI_FLOAT, peer, tag, comm_, MPI_STATUS_IGNORE));
        return;
    }
    wait_recv(irecv(buf, n, peer, tag), timeout_s, what);
}
int MpiCommunicator::new_handle() const {
    size_t h = 0;
    while (h < requests_.size() && requests_[h] != MPI_REQUEST_NULL) ++h;
    if (h == requests_.size()) requests_.push_back(MPI_REQUEST_NULL);
    return int(h);
}
int MpiCommunicator::irecv(float* buf, size_t n, int peer, int tag) const {
    int h = new_handle();
    QUINTET_MPI(MPI_Irecv(buf, int(n), MPI_FLOAT, peer, tag, comm_, &requests_[size_t(h)]));
    if (peer_of_.size() < requests_.size()) peer_of_.resize(requests_.size());
    peer_of_[size_t(h)] = peer;
    return h;
}
void MpiCommunicator::wait_recv(int h, double timeout_s, const char* what) const {
    MPI_Request& req = requests_[size_t(h)];
    if (timeout_s <= 0) {
        QUINTET_MPI(MPI_Wait(&req, MPI_STATUS_IGNORE));
        return;
    }
    const double start = MPI_Wtime();
    int done = 0;
    for (long spins = 0;; ++spins) {
        QUINTET_MPI(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
        if (done) return;
        double waited = MPI_Wtime() - start;
        if (waited > timeout_s) {
            MPI_Cancel(&req);
            rank_fail(std::string(what) + ": nothing arrived from rank " + std::to_string(peer_of_[size_t(h)]) +
                      " in " + std::to_string(int(waited)) +
                      " s (QUINTET_P2P_TIMEOUT_S); the peer failed or the schedules disagree");
        }
        // Spin briefly for latency, then yield the core (ranks may share cores).
        if (spins > 1000) usleep(waited < 0.01 ? 10 : 200);
    }
}
int MpiCommunicator::isend(const float* buf, size_t n, int peer, int tag) const {
    int h = new_handle();
    QUINTET_MPI(MPI_Isend(buf, int(n), MPI_FLOAT, peer, tag, comm_, &requests_[size_t(h)]));
    return h;
}
bool MpiCommunicator::test(int h) const {
    int done = 0;
    QUINTET_MPI(MPI_Test(&requests_[size_t(h)], &done, MPI_STATUS_IGNORE));
    return done != 0;
}
void MpiCommunicator::wait(int h) const {
    QUINTET_MPI(MPI_Wait(&requests_[size_t(h)], MPI_STATUS_IGNORE));
}
void MpiCommunicator::broadcast(void* buf, size_t bytes, int root) const {
    QUINTET_MPI(MPI_Bcast(buf, int(bytes), MPI_BYTE, root, comm_));
}
void MpiCommunicator::barrier() const { QUINTET_MPI(MPI_Barrier(comm_)); }
int MpiCommunicator::iall_reduce_sum(float* buf, size_t n) const {
    QUINTET_CHECK(n <= size_t(INT_MAX), "iall_reduce_sum: more than 2^31-1 floats in one bucket");
    reductions_.push_back(MPI_REQUEST_NULL);
    QUINTET_MPI(MPI_Iallreduce(MPI_IN_PLACE, buf, int(n), MPI_FLOAT, MPI_SUM, comm_, &reductions_.back()));
    return int(reductions_.size()) - 1;
}
void MpiCommunicator::wait_reduce(int h) const {
    QUINTET_MPI(MPI_Wait(&reductions_[size_t(h)], MPI_STATUS_IGNORE));
    for (MPI_Request r : reductions_)
        if (r != MPI_REQUEST_NULL) return;
    reductions_.clear();  // all done: handles restart at 0 (capacity kept: no allocation)
}
void MpiCommunicator::progress() const {
    int done = 0;
    for (MPI_Request& r : reductions_)
        if (r != MPI_REQUEST_NULL) QUINTET_MPI(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
}

}  // namespace quintet
