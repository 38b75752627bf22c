#include "quintet/comm/mpi_communicator.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>

#include "quintet/core/clock.hpp"
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
// ZeRO-2/3's overlapped operations: their waits go on the timeline's zero track.
constexpr const char* kZeroReduce = "reduce_scatter_sum (overlapped ZeRO gradient)";
constexpr const char* kZeroGather = "all_gather (prefetched ZeRO-3 parameters)";
}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name, double deadline_s,
                                 std::shared_ptr<Watchdog> watchdog)
    : Communicator(std::move(name), deadline_s), comm_(comm), watchdog_(std::move(watchdog)),
      track_(trace::track_of_group(this->name())) {
    QUINTET_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    QUINTET_MPI(MPI_Comm_rank(comm_, &rank_));
    QUINTET_MPI(MPI_Comm_size(comm_, &size_));
    // The members' world ranks, for naming the ones that did not arrive at a deadline.
    MPI_Group mine, world;
    QUINTET_MPI(MPI_Comm_group(comm_, &mine));
    QUINTET_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world));
    std::vector<int> local(size_t(size_), 0);
    for (int i = 0; i < size_; ++i) local[size_t(i)] = i;
    world_ranks_.resize(size_t(size_));
    QUINTET_MPI(MPI_Group_translate_ranks(mine, size_, local.data(), world, world_ranks_.data()));
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
}

MpiCommunicator::~MpiCommunicator() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF && comm_ != MPI_COMM_NULL)
        MPI_Comm_free(&comm_);
}

MpiCommunicator::Timed::Timed(const MpiCommunicator& comm, const char* op) : c(comm), wait(comm.track_, op) {
    ++c.seq_;
    if (c.watchdog_ && c.deadline() > 0)
        c.watchdog_->begin(op, &c.name(), c.rank_, c.size_, c.seq_, c.deadline(), &c.world_ranks_);
}
MpiCommunicator::Timed::~Timed() {
    if (c.watchdog_ && c.deadline() > 0) c.watchdog_->end();
}

void MpiCommunicator::complete(MPI_Request& req, const char* op, int peer, const char* event,
                               trace::Track track) const {
    trace::Wait timeline(track, event, op == event ? nullptr : op);
    if (deadline() <= 0) {
        QUINTET_MPI(MPI_Wait(&req, MPI_STATUS_IGNORE));
        return;
    }
    int done = 0;
    QUINTET_MPI(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    const double start = MPI_Wtime();
    bool published = false;
    for (long spins = 1;; ++spins) {
        QUINTET_MPI(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
        if (done) return;
        // Spin for latency, then give the core away (ranks may share cores): yield, and once
        // the wait is long, sleep between polls.
        if (spins < 64) continue;
        const double waited = MPI_Wtime() - start;
        if (waited > 1.0 && !published && watchdog_) {  // a long wait: tell the others where we are
            watchdog_->publish(name(), seq_, op);
            published = true;
        }
        if (waited > deadline()) {
            if (peer >= 0) MPI_Cancel(&req);
            // Point-to-point: the peer is the one; a collective: the members that never posted it.
            const std::string missing = !watchdog_ ? ""
                                        : peer >= 0 ? watchdog_->absent({world_ranks_[size_t(peer)]}, name(), seq_)
                                                    : watchdog_->absent(world_ranks_, name(), seq_);
            char msg[2048];
            std::snprintf(msg, sizeof msg,
                          "%s (operation #%llu) on the %s communicator (rank %d of %d)%s%s did not "
                          "complete within "
                          "%.0f s (train.collective_timeout_s = %g): a rank of this group stopped "
                          "answering, failed, or runs a different schedule%s",
                          op, (unsigned long long)seq_, name().c_str(), rank_, size_, peer >= 0 ? "; peer rank " : "",
                          peer >= 0 ? std::to_string(peer).c_str() : "", waited, deadline(), missing.c_str());
            throw DeadlineError(msg);
        }
        if (waited < 0.01) sched_yield();
        else usleep(waited < 1.0 ? 50 : 1000);
    }
}

void MpiCommunicator::all_reduce(void* buf, size_t n, MPI_Datatype type, MPI_Op op,
                                 const char* what) const {
    Timed t(*this, what);
    int bytes = 0;
    QUINTET_MPI(MPI_Type_size(type, &bytes));
    for (size_t off = 0; off < n; off += kMaxCount)
        QUINTET_MPI(MPI_Allreduce(MPI_IN_PLACE, static_cast<char*>(buf) + off * size_t(bytes),
                                  int(std::min(kMaxCount, n - off)), type, op, comm_));
}

void MpiCommunicator::all_reduce_sum(float* buf, size_t n) const {
    all_reduce(buf, n, MPI_FLOAT, MPI_SUM, "all_reduce_sum");
}
void MpiCommunicator::all_reduce_sum(double* buf, size_t n) const {
    all_reduce(buf, n, MPI_DOUBLE, MPI_SUM, "all_reduce_sum");
}
void MpiCommunicator::all_reduce_max(double* buf, size_t n) const {
    all_reduce(buf, n, MPI_DOUBLE, MPI_MAX, "all_reduce_max");
}
void MpiCommunicator::all_reduce_max(float* buf, size_t n) const {
    all_reduce(buf, n, MPI_FLOAT, MPI_MAX, "all_reduce_max");
}
void MpiCommunicator::reduce_scatter_sum(const float* send, float* recv, size_t count) const {
    QUINTET_CHECK(count <= kMaxCount, "reduce_scatter count too large");
    Timed t(*this, "reduce_scatter_sum");
    QUINTET_MPI(MPI_Reduce_scatter_block(send, recv, int(count), MPI_FLOAT, MPI_SUM, comm_));
}
void MpiCommunicator::all_gather(const float* send, float* recv, size_t count) const {
    QUINTET_CHECK(count <= kMaxCount, "all_gather count too large");
    Timed t(*this, "all_gather");
    QUINTET_MPI(MPI_Allgather(send == recv + size_t(rank_) * count ? MPI_IN_PLACE : send,
                              int(count), MPI_FLOAT, recv, int(count), MPI_FLOAT, comm_));
}
void MpiCommunicator::all_to_allv(const float* send, const int* sc, const int* sd, float* recv,
                                  const int* rc, const int* rd) const {
    Timed t(*this, "all_to_allv");
    QUINTET_MPI(MPI_Alltoallv(send, sc, sd, MPI_FLOAT, recv, rc, rd, MPI_FLOAT, comm_));
}
void MpiCommunicator::all_to_allv(const int32_t* send, const int* sc, const int* sd, int32_t* recv,
                                  const int* rc, const int* rd) const {
    Timed t(*this, "all_to_allv (int32)");
    QUINTET_MPI(MPI_Alltoallv(send, sc, sd, MPI_INT32_T, recv, rc, rd, MPI_INT32_T, comm_));
}
void MpiCommunicator::all_to_all_counts(const int* send_counts, int* recv_counts) const {
    Timed t(*this, "all_to_all_counts");
    QUINTET_MPI(MPI_Alltoall(send_counts, 1, MPI_INT, recv_counts, 1, MPI_INT, comm_));
}
int MpiCommunicator::iall_to_allv(const float* send, const int* sc, const int* sd, float* recv,
                                  const int* rc, const int* rd) const {
    ++seq_;
    size_t h = 0;
    while (h < exchanges_.size() && exchanges_[h] != MPI_REQUEST_NULL) ++h;
    if (h == exchanges_.size()) exchanges_.push_back(MPI_REQUEST_NULL);
    QUINTET_MPI(MPI_Ialltoallv(send, sc, sd, MPI_FLOAT, recv, rc, rd, MPI_FLOAT, comm_, &exchanges_[h]));
    return int(h);
}
void MpiCommunicator::wait_all_to_allv(int h) const {
    static constexpr const char* kOp = "all_to_allv (overlapped)";
    complete(exchanges_[size_t(h)], kOp, -1, kOp, track_);
}
void MpiCommunicator::broadcast(void* buf, size_t bytes, int root) const {
    QUINTET_CHECK(bytes <= size_t(INT_MAX), "broadcast of more than 2 GiB");
    Timed t(*this, "broadcast");
    QUINTET_MPI(MPI_Bcast(buf, int(bytes), MPI_BYTE, root, comm_));
}
void MpiCommunicator::barrier() const {
    Timed t(*this, "barrier");
    QUINTET_MPI(MPI_Barrier(comm_));
}

void MpiCommunicator::all_reduce_sum(int* buf, size_t n) const { all_reduce(buf, n, MPI_INT, MPI_SUM, "all_reduce_sum"); }
void MpiCommunicator::all_reduce_sum(uint64_t* buf, size_t n) const {
    all_reduce(buf, n, MPI_UINT64_T, MPI_SUM, "all_reduce_sum");
}
void MpiCommunicator::all_reduce_min(int* buf, size_t n) const { all_reduce(buf, n, MPI_INT, MPI_MIN, "all_reduce_min"); }
void MpiCommunicator::all_reduce_max(int* buf, size_t n) const { all_reduce(buf, n, MPI_INT, MPI_MAX, "all_reduce_max"); }

void MpiCommunicator::gather(const double* send, double* recv, size_t n, int root) const {
    QUINTET_CHECK(n <= kMaxCount, "gather count too large");
    Timed t(*this, "gather");
    QUINTET_MPI(MPI_Gather(send, int(n), MPI_DOUBLE, recv, int(n), MPI_DOUBLE, root, comm_));
}

std::vector<std::string> MpiCommunicator::gather_text(const std::string& mine, int root) const {
    constexpr size_t kWidth = 256;
    char send[kWidth] = {0};
    std::snprintf(send, kWidth, "%s", mine.c_str());
    std::vector<char> all(rank_ == root ? kWidth * size_t(size_) : 0);
    {
        Timed t(*this, "gather");
        QUINTET_MPI(MPI_Gather(send, int(kWidth), MPI_CHAR, all.data(), int(kWidth), MPI_CHAR, root, comm_));
    }
    std::vector<std::string> out;
    for (size_t r = 0; r < all.size() / kWidth; ++r) out.emplace_back(all.data() + r * kWidth);
    return out;
}

void MpiCommunicator::barrier_asleep() const {
    trace::Wait timeline(track_, "barrier (asleep)");
    ++seq_;
    MPI_Request req;
    QUINTET_MPI(MPI_Ibarrier(comm_, &req));
    const double start = now_s();
    for (int done = 0;;) {
        QUINTET_MPI(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
        if (done) return;
        if (deadline() > 0 && now_s() - start > deadline())
            throw DeadlineError("barrier (operation #" + std::to_string(seq_) + ") on the " + name() +
                                " communicator did not complete within " + std::to_string(int(deadline())) +
                                " s (train.collective_timeout_s): a rank of this group stopped answering");
        usleep(2000);
    }
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::split(int color, int key, std::string name) const {
    MPI_Comm sub;
    QUINTET_MPI(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub));
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiCommunicator>(sub, std::move(name), deadline(), watchdog_);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::split_node(std::string name) const {
    MPI_Comm node;
    QUINTET_MPI(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    return std::make_unique<MpiCommunicator>(node, std::move(name), deadline(), watchdog_);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::cartesian(const std::vector<int>& dims, std::string name) const {
    std::vector<int> d = dims, periods(dims.size(), 0);
    MPI_Comm cart;
    QUINTET_MPI(MPI_Cart_create(comm_, int(d.size()), d.data(), periods.data(), /*reorder=*/0, &cart));
    return std::make_unique<MpiCommunicator>(cart, std::move(name), deadline(), watchdog_);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::cartesian_sub(const std::vector<int>& keep, std::string name) const {
    std::vector<int> k = keep;
    MPI_Comm sub;
    QUINTET_MPI(MPI_Cart_sub(comm_, k.data(), &sub));
    return std::make_unique<MpiCommunicator>(sub, std::move(name), deadline(), watchdog_);
}

std::vector<int> MpiCommunicator::cartesian_coords() const {
    int ndims = 0;
    QUINTET_MPI(MPI_Cartdim_get(comm_, &ndims));
    std::vector<int> c(size_t(ndims), 0);
    QUINTET_MPI(MPI_Cart_coords(comm_, rank_, ndims, c.data()));
    return c;
}

void MpiCommunicator::send(const float* buf, size_t n, int peer, int tag) const {
    wait(isend(buf, n, peer, tag));
}
void MpiCommunicator::recv(float* buf, size_t n, int peer, int tag, const char* what) const {
    wait_recv(irecv(buf, n, peer, tag), what);
}
int MpiCommunicator::new_handle() const {
    size_t h = 0;
    while (h < requests_.size() && requests_[h] != MPI_REQUEST_NULL) ++h;
    if (h == requests_.size()) {
        requests_.push_back(MPI_REQUEST_NULL);
        peer_of_.push_back(-1);
    }
    return int(h);
}
int MpiCommunicator::irecv(float* buf, size_t n, int peer, int tag) const {
    QUINTET_CHECK(n <= size_t(INT_MAX), "irecv of more than 2^31-1 floats");
    ++seq_;
    int h = new_handle();
    QUINTET_MPI(MPI_Irecv(buf, int(n), MPI_FLOAT, peer, tag, comm_, &requests_[size_t(h)]));
    peer_of_[size_t(h)] = peer;
    return h;
}
void MpiCommunicator::wait_recv(int h, const char* what) const {
    complete(requests_[size_t(h)], what, peer_of_[size_t(h)], "recv", track_);
}
int MpiCommunicator::isend(const float* buf, size_t n, int peer, int tag) const {
    QUINTET_CHECK(n <= size_t(INT_MAX), "isend of more than 2^31-1 floats");
    ++seq_;
    int h = new_handle();
    QUINTET_MPI(MPI_Isend(buf, int(n), MPI_FLOAT, peer, tag, comm_, &requests_[size_t(h)]));
    peer_of_[size_t(h)] = peer;
    return h;
}
bool MpiCommunicator::test(int h) const {
    int done = 0;
    QUINTET_MPI(MPI_Test(&requests_[size_t(h)], &done, MPI_STATUS_IGNORE));
    return done != 0;
}
void MpiCommunicator::wait(int h) const {
    complete(requests_[size_t(h)], "send", peer_of_[size_t(h)], "send", track_);
}
int MpiCommunicator::iall_reduce_sum(float* buf, size_t n) const {
    QUINTET_CHECK(n <= size_t(INT_MAX), "iall_reduce_sum: more than 2^31-1 floats in one bucket");
    ++seq_;
    reductions_.push_back(MPI_REQUEST_NULL);
    reduction_ops_.push_back("all_reduce_sum (overlapped bucket)");
    QUINTET_MPI(MPI_Iallreduce(MPI_IN_PLACE, buf, int(n), MPI_FLOAT, MPI_SUM, comm_, &reductions_.back()));
    return int(reductions_.size()) - 1;
}
int MpiCommunicator::ireduce_scatter_sum(const float* send, float* recv, size_t count) const {
    QUINTET_CHECK(count <= kMaxCount, "ireduce_scatter_sum count too large");
    ++seq_;
    reductions_.push_back(MPI_REQUEST_NULL);
    reduction_ops_.push_back(kZeroReduce);
    QUINTET_MPI(MPI_Ireduce_scatter_block(send, recv, int(count), MPI_FLOAT, MPI_SUM, comm_, &reductions_.back()));
    return int(reductions_.size()) - 1;
}
int MpiCommunicator::iall_gather(const float* send, float* recv, size_t count) const {
    QUINTET_CHECK(count <= kMaxCount, "iall_gather count too large");
    ++seq_;
    reductions_.push_back(MPI_REQUEST_NULL);
    reduction_ops_.push_back(kZeroGather);
    QUINTET_MPI(MPI_Iallgather(send == recv + size_t(rank_) * count ? MPI_IN_PLACE : send, int(count), MPI_FLOAT,
                               recv, int(count), MPI_FLOAT, comm_, &reductions_.back()));
    return int(reductions_.size()) - 1;
}
void MpiCommunicator::wait_reduce(int h) const {
    const char* op = reduction_ops_[size_t(h)];
    complete(reductions_[size_t(h)], op, -1, op, op == kZeroReduce || op == kZeroGather ? trace::Track::zero : track_);
    for (MPI_Request r : reductions_)
        if (r != MPI_REQUEST_NULL) return;
    reductions_.clear();  // all done: handles restart at 0 (capacity kept: no allocation)
    reduction_ops_.clear();
}
void MpiCommunicator::progress() const {
    int done = 0;
    for (MPI_Request& r : reductions_)
        if (r != MPI_REQUEST_NULL) QUINTET_MPI(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
    for (MPI_Request& r : exchanges_)
        if (r != MPI_REQUEST_NULL) QUINTET_MPI(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
}

}  // namespace quintet
