// The vocab-parallel cross-entropy (max and sum-exp reduced over tp, the full logits never
// gathered) against the unsharded fused kernel, on random logits, with an uneven vocabulary
// split (50 rows over 3 ranks) and targets on every rank.
// ctest: labels=mpi ranks=3
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <random>

#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/parallel/layout.hpp"
#include "quintet/parallel/vocab_parallel.hpp"

using namespace quintet;

TEST(VocabParallel, CrossEntropyAndGradientEqualTheUnshardedOnes) {
    MpiCommunicator world(MPI_COMM_WORLD);
    TensorParallel tp(world, false);
    auto be = make_cpu_backend(1);
    const int N = 9, V = 50;
    std::mt19937 g(5);
    std::normal_distribution<float> d(0.0f, 3.0f);
    std::vector<float> full(N * V);
    for (auto& x : full) x = d(g);
    std::vector<int32_t> tgt(N);
    for (int n = 0; n < N; ++n) tgt[n] = int32_t(g() % V);
    // Unsharded reference.
    std::vector<float> ref = full, ref_loss(N);
    be->xent_forward_backward(ref.data(), ref_loss.data(), tgt.data(), N, V, 0.25f);
    // This rank's shard.
    Range r = split_range(V, world.size(), world.rank());
    const int Vl = int(r.size());
    std::vector<float> shard(size_t(N) * Vl), loss(N);
    std::vector<int32_t> local(N);
    for (int n = 0; n < N; ++n) {
        for (int i = 0; i < Vl; ++i) shard[size_t(n) * Vl + i] = full[size_t(n) * V + r.lo + i];
        local[n] = tgt[n] >= int(r.lo) && tgt[n] < int(r.hi) ? tgt[n] - int(r.lo) : -1;
    }
    VocabParallelScratch sc;
    vocab_parallel_xent(*be, tp, shard.data(), loss.data(), local.data(), N, Vl, 0.25f, true, sc);
    for (int n = 0; n < N; ++n) {
        EXPECT_NEAR(loss[n], ref_loss[n], 2e-5 * std::abs(ref_loss[n]) + 1e-6) << n;
        for (int i = 0; i < Vl; ++i)
            EXPECT_NEAR(shard[size_t(n) * Vl + i], ref[size_t(n) * V + r.lo + i], 1e-6) << n << "," << i;
    }
    EXPECT_GT(tp.counters.bytes, 0.0);  // statistics really went over the communicator
}
