// The communicator of one rank (size 1): every collective is the identity (or a copy), sends and
// receives to oneself are not allowed. For what runs the model on one process without a grid:
// generation, tests of one chunk.
#pragma once
#include <cstring>

#include "quintet/comm/communicator.hpp"

namespace quintet {

class SelfCommunicator final : public Communicator {
public:
    SelfCommunicator() : Communicator("self") {}
    int rank() const override { return 0; }
    int size() const override { return 1; }
    void all_reduce_sum(float*, size_t) const override {}
    void all_reduce_sum(double*, size_t) const override {}
    void all_reduce_max(double*, size_t) const override {}
    void all_reduce_max(float*, size_t) const override {}
    void reduce_scatter_sum(const float* send, float* recv, size_t count) const override {
        if (send != recv) std::memmove(recv, send, count * sizeof(float));
    }
    void all_gather(const float* send, float* recv, size_t count) const override {
        if (send != recv) std::memmove(recv, send, count * sizeof(float));
    }
    void all_to_allv(const float* send, const int* sc, const int* sd, float* recv, const int*,
                     const int* rd) const override {
        std::memmove(recv + rd[0], send + sd[0], size_t(sc[0]) * sizeof(float));
    }
    void all_to_allv(const int32_t* send, const int* sc, const int* sd, int32_t* recv, const int*,
                     const int* rd) const override {
        std::memmove(recv + rd[0], send + sd[0], size_t(sc[0]) * sizeof(int32_t));
    }
    void all_to_all_counts(const int* send_counts, int* recv_counts) const override {
        recv_counts[0] = send_counts[0];
    }
    void broadcast(void*, size_t, int) const override {}
    void barrier() const override {}
    void send(const float*, size_t, int, int) const override { fail(); }
    void recv(float*, size_t, int, int, const char*) const override { fail(); }
    int isend(const float*, size_t, int, int) const override { fail(); }
    void wait(int) const override { fail(); }
    bool test(int) const override { fail(); }

private:
    [[noreturn]] static void fail() {
        throw std::logic_error("SelfCommunicator: point-to-point to oneself");
    }
};

}  // namespace quintet
