// The MPI communicator on 4 ranks (and its 2- and 3-rank sub-communicators): all-to-all-v with
// uneven (and zero) counts for float and int32 payloads, the counts exchange that precedes it,
// and deadlines -- a receive that never arrives throws DeadlineError naming the communicator,
// the operation and the peer; the watchdog reports a blocking operation that overran; the
// non-blocking reduce-scatter and all-gather, several in flight at once.
// ctest: labels=mpi ranks=4
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/comm/watchdog.hpp"

using namespace quintet;

namespace {

// Rank r sends (r + 2*p) % 4 elements to rank p (some zero), each value encoding (r, p, i).
void check_all_to_allv(const MpiCommunicator& c) {
    const int n = c.size(), r = c.rank();
    auto count = [&](int from, int to) { return (from + 2 * to + n) % (n + 1); };
    std::vector<int> sc(n), sd(n), rc(n), rd(n), rc_exchanged(n);
    int stot = 0, rtot = 0;
    for (int p = 0; p < n; ++p) {
        sc[p] = count(r, p);
        sd[p] = stot;
        stot += sc[p];
    }
    c.all_to_all_counts(sc.data(), rc_exchanged.data());
    for (int p = 0; p < n; ++p) {
        rc[p] = count(p, r);
        EXPECT_EQ(rc_exchanged[p], rc[p]) << "counts from " << p;
        rd[p] = rtot;
        rtot += rc[p];
    }
    std::vector<float> sf(size_t(std::max(stot, 1))), rf(size_t(std::max(rtot, 1)), -1.0f);
    std::vector<int32_t> si(sf.size()), ri(rf.size(), -1);
    for (int p = 0; p < n; ++p)
        for (int i = 0; i < sc[p]; ++i) {
            sf[size_t(sd[p] + i)] = float(1000 * r + 100 * p + i);
            si[size_t(sd[p] + i)] = (1 << 30) + 1000 * r + 100 * p + i;  // not exact as a float
        }
    c.all_to_allv(sf.data(), sc.data(), sd.data(), rf.data(), rc.data(), rd.data());
    c.all_to_allv(si.data(), sc.data(), sd.data(), ri.data(), rc.data(), rd.data());
    for (int p = 0; p < n; ++p)
        for (int i = 0; i < rc[p]; ++i) {
            EXPECT_EQ(rf[size_t(rd[p] + i)], float(1000 * p + 100 * r + i));
            EXPECT_EQ(ri[size_t(rd[p] + i)], (1 << 30) + 1000 * p + 100 * r + i);
        }
}

TEST(Communicator, AllToAllvWithUnevenCountsOn2To4Ranks) {
    MpiCommunicator world(MPI_COMM_WORLD);
    ASSERT_EQ(world.size(), 4);
    check_all_to_allv(world);
    for (int parts : {2, 3}) {  // sub-communicators of 2 and 3 ranks (rank 3 alone when 3)
        MPI_Comm sub;
        const int color = world.rank() < parts ? 0 : 1;
        MPI_Comm_split(MPI_COMM_WORLD, color, world.rank(), &sub);
        MpiCommunicator c(sub, "sub");
        check_all_to_allv(c);
    }
}

// ZeRO-2/3's overlapped collectives: several reduce-scatters and all-gathers in flight at
// once (one of them in place), completed in any order by wait_reduce; the handles restart
// once all are done, and a second round reuses them.
TEST(Communicator, NonBlockingReduceScatterAndAllGather) {
    MpiCommunicator world(MPI_COMM_WORLD);
    const int n = world.size(), r = world.rank();
    const size_t count = 5;
    for (int round = 0; round < 2; ++round) {
        std::vector<float> send(count * size_t(n)), recv(count, -1.0f), gathered(count * size_t(n), -1.0f);
        std::vector<float> inplace(count * size_t(n), -1.0f);
        for (size_t i = 0; i < send.size(); ++i) send[i] = float(100 * r + int(i) + round);
        std::vector<float> mine(count);
        for (size_t i = 0; i < count; ++i) mine[i] = float(1000 * r + int(i));
        std::copy(mine.begin(), mine.end(), inplace.begin() + long(size_t(r) * count));
        const int h1 = world.ireduce_scatter_sum(send.data(), recv.data(), count);
        const int h2 = world.iall_gather(mine.data(), gathered.data(), count);
        const int h3 = world.iall_gather(inplace.data() + size_t(r) * count, inplace.data(), count);
        EXPECT_EQ(h1, 0);  // handles restart at 0 every round
        world.progress();
        world.wait_reduce(h3);
        world.wait_reduce(h1);
        world.wait_reduce(h2);
        for (size_t i = 0; i < count; ++i) {
            float want = 0;
            for (int q = 0; q < n; ++q) want += float(100 * q + int(size_t(r) * count + i) + round);
            EXPECT_EQ(recv[i], want) << "reduce-scatter element " << i;
        }
        for (int q = 0; q < n; ++q)
            for (size_t i = 0; i < count; ++i) {
                EXPECT_EQ(gathered[size_t(q) * count + i], float(1000 * q + int(i)));
                EXPECT_EQ(inplace[size_t(q) * count + i], float(1000 * q + int(i)));
            }
    }
}

TEST(Communicator, ReceiveThatNeverArrivesThrowsDeadlineError) {
    MpiCommunicator world(MPI_COMM_WORLD, "tp", 0.5);
    if (world.rank() == 0) {
        std::vector<float> buf(4);
        const auto t0 = std::chrono::steady_clock::now();
        try {
            world.recv(buf.data(), buf.size(), 1, 99, "pipeline recv_fwd");
            ADD_FAILURE() << "no DeadlineError";
        } catch (const DeadlineError& e) {
            const std::string m = e.what();
            EXPECT_NE(m.find("pipeline recv_fwd"), std::string::npos) << m;
            EXPECT_NE(m.find("tp communicator"), std::string::npos) << m;
            EXPECT_NE(m.find("peer rank 1"), std::string::npos) << m;
            EXPECT_NE(m.find("train.collective_timeout_s"), std::string::npos) << m;
        }
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_GE(s, 0.5);
        EXPECT_LT(s, 5.0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

TEST(Communicator, WatchdogReportsABlockingOperationPastItsDeadline) {
    Watchdog dog(7);
    std::string report;
    std::mutex mu;
    dog.on_expiry([&](const std::string& r) {
        std::lock_guard<std::mutex> lock(mu);
        report = r;
    });
    const std::string name = "dp_cp";
    dog.begin("all_reduce_sum", &name, 1, 4, 42, 0.2);
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    dog.end();
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_NE(report.find("rank 7"), std::string::npos) << report;
    EXPECT_NE(report.find("all_reduce_sum #42"), std::string::npos) << report;
    EXPECT_NE(report.find("dp_cp communicator (rank 1 of 4)"), std::string::npos) << report;
    // An operation within its deadline is not reported.
    report.clear();
    dog.begin("barrier", &name, 0, 4, 43, 5.0);
    dog.end();
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    EXPECT_TRUE(report.empty()) << report;
}

}  // namespace
