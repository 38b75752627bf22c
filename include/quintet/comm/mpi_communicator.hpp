// Communicator over an MPI communicator, for host memory. Errors are returned, not fatal
// (MPI_ERRORS_RETURN), so every call is checked and reported with its text and file:line.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "quintet/comm/communicator.hpp"

namespace quintet {

void check_mpi(int rc, const char* what, const char* file, int line);
#define QUINTET_MPI(call) ::quintet::check_mpi((call), #call, __FILE__, __LINE__)

class MpiCommunicator final : public Communicator {
public:
    // Takes ownership of `comm` (freed in the destructor unless it is MPI_COMM_WORLD/SELF).
    explicit MpiCommunicator(MPI_Comm comm);
    ~MpiCommunicator() override;
    MpiCommunicator(const MpiCommunicator&) = delete;
    MpiCommunicator& operator=(const MpiCommunicator&) = delete;

    MPI_Comm handle() const { return comm_; }
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
    void send(const float* buf, size_t n, int peer, int tag) const override;
    void recv(float* buf, size_t n, int peer, int tag, double timeout_s = 0,
              const char* what = "recv") const override;
    int isend(const float* buf, size_t n, int peer, int tag) const override;
    void wait(int handle) const override;
    bool test(int handle) const override;
    int irecv(float* buf, size_t n, int peer, int tag) const override;
    void wait_recv(int handle, double timeout_s = 0, const char* what = "recv") const override;
    void broadcast(void* buf, size_t bytes, int root) const override;
    void barrier() const override;
    int iall_reduce_sum(float* buf, size_t n) const override;
    void wait_reduce(int handle) const override;
    void progress() const override;

private:
    MPI_Comm comm_;
    int rank_ = 0, size_ = 1;
    int new_handle() const;
    mutable std::vector<MPI_Request> requests_;  // isend/irecv handles index this
    mutable std::vector<int> peer_of_;           // source rank of each irecv handle
    // iall_reduce_sum handles index this (apart from requests_: progress() completes these
    // requests, and a completed slot of requests_ may be handed to the next isend)
    mutable std::vector<MPI_Request> reductions_;
};

}  // namespace quintet
