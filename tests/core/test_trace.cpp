// The timeline recorder (core/trace.hpp) on its own: waits counted whether or not it records,
// events only while it does, nested in the order they opened, the profile's scopes nested on the
// compute track (communication scopes left to the communicators), the compute stretch of the
// slow-rank injection, and the Trace Event file it writes (read back with nlohmann-json).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "quintet/core/profile.hpp"
#include "quintet/core/trace.hpp"

using namespace quintet;
namespace fs = std::filesystem;

namespace {

void busy(int64_t ns) {
    const int64_t until = trace::now_ns() + ns;
    while (trace::now_ns() < until) {
    }
}

}  // namespace

TEST(Trace, WaitsAreCountedAlwaysAndEventsOnlyWhileRecording) {
    trace::stop_recording();
    const int64_t tp0 = trace::waited_ns(trace::Track::tp), all0 = trace::waited_ns();
    {
        trace::Wait w(trace::Track::tp, "all_reduce_sum");
        busy(200000);
    }
    EXPECT_GE(trace::waited_ns(trace::Track::tp) - tp0, 200000);
    EXPECT_EQ(trace::waited_ns() - all0, trace::waited_ns(trace::Track::tp) - tp0);
    trace::start_recording();
    EXPECT_TRUE(trace::events().empty());
    trace::set_step(7);
    {
        trace::Span step(trace::Track::step, "step");
        trace::Span fwd(trace::Track::compute, "forward", 3, 1);
        {
            QUINTET_PROFILE("rmsnorm");  // an operation: nested on compute
            busy(50000);
        }
        {
            QUINTET_PROFILE("comm.tp");  // communication: the communicator's own event stands
            trace::Wait w(trace::Track::tp, "all_reduce_sum", "tp detail");
            busy(100000);
        }
    }
    trace::stop_recording();
    {
        trace::Span after(trace::Track::compute, "forward");  // not recorded
    }
    const auto& ev = trace::events();
    ASSERT_EQ(ev.size(), 4u);
    EXPECT_STREQ(ev[0].name, "step");
    EXPECT_STREQ(ev[1].name, "forward");
    EXPECT_EQ(ev[1].mb, 3);
    EXPECT_EQ(ev[1].chunk, 1);
    EXPECT_EQ(ev[1].step, 7);
    EXPECT_STREQ(ev[2].name, "rmsnorm");
    EXPECT_EQ(ev[2].track, trace::Track::compute);
    EXPECT_STREQ(ev[3].name, "all_reduce_sum");
    EXPECT_EQ(ev[3].track, trace::Track::tp);
    EXPECT_STREQ(trace::detail_text(ev[3]), "tp detail");
    // Nested: each inside the one before it, in the order they opened.
    EXPECT_LE(ev[0].t0, ev[1].t0);
    EXPECT_GE(ev[0].t1, ev[1].t1);
    EXPECT_LE(ev[1].t0, ev[2].t0);
    EXPECT_GE(ev[1].t1, ev[3].t1);
    EXPECT_LE(ev[2].t1, ev[3].t0);
    // The forward knows what it waited inside it.
    EXPECT_GE(ev[1].wait_ns, 100000);
    EXPECT_LT(ev[1].wait_ns, ev[1].t1 - ev[1].t0);
}

TEST(Trace, TheStretchLengthensTheOutermostComputeSpanByItsOwnCompute) {
    trace::start_recording();
    trace::set_stretch(3.0);
    int64_t own = 0;
    {
        trace::Span fwd(trace::Track::compute, "forward");
        const int64_t t = trace::now_ns();
        {
            trace::Span inner(trace::Track::compute, "recompute");  // nested: not stretched itself
            busy(1000000);
        }
        {
            trace::Wait w(trace::Track::pp, "recv");  // waiting is not computing: not stretched
            busy(2000000);
        }
        own = trace::now_ns() - t - 2000000;
    }
    trace::set_stretch(1.0);
    trace::stop_recording();
    const auto& ev = trace::events();
    ASSERT_EQ(ev.size(), 3u);
    const int64_t outer = ev[0].t1 - ev[0].t0, inner = ev[1].t1 - ev[1].t0;
    // own compute ~1 ms, so the span is at least 3 x 1 ms + the 2 ms wait; the nested one is not.
    EXPECT_GE(outer, 3 * own + 2000000 - 200000);
    EXPECT_LT(inner, 2 * 1000000 + 500000);
    EXPECT_EQ(trace::stretch(), 1.0);
}

TEST(Trace, WritesATraceEventFile) {
    trace::start_recording();
    trace::set_step(2);
    {
        trace::Span fwd(trace::Track::compute, "forward", 0, 0);
        trace::Wait w(trace::Track::pp, "recv", "stage 0: \"recv_fwd\" mb 0");
        busy(10000);
    }
    trace::stop_recording();
    const fs::path dir = fs::temp_directory_path() / ("quintet_trace_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    trace::ProcessInfo who;
    who.rank = 3;
    who.name = "rank 3 (host, tp 1)";
    who.other_json = "\"rank\":3";
    const int64_t origin = trace::events().front().t0 - 1500;  // 1.5 us before the first event
    ASSERT_EQ(trace::write_json((dir / "rank3.json").string(), who, origin), "");
    std::ifstream in(dir / "rank3.json");
    const nlohmann::json j = nlohmann::json::parse(in);
    fs::remove_all(dir);
    ASSERT_TRUE(j["traceEvents"].is_array());
    EXPECT_EQ(j["otherData"]["rank"], 3);
    std::vector<std::string> threads;
    int x = 0;
    for (const auto& e : j["traceEvents"]) {
        EXPECT_EQ(e["pid"], 4);  // rank + 1
        if (e["ph"] == "M" && e["name"] == "process_name") EXPECT_EQ(e["args"]["name"], "rank 3 (host, tp 1)");
        if (e["ph"] == "M" && e["name"] == "thread_name") threads.push_back(e["args"]["name"]);
        if (e["ph"] != "X") continue;
        ++x;
        EXPECT_EQ(e["args"]["step"], 2);
        if (e["name"] == "forward") {
            EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 1.5);
            EXPECT_EQ(e["cat"], "compute");
            EXPECT_GT(e["args"]["wait_us"].get<double>(), 9.9);
        } else {
            EXPECT_EQ(e["name"], "recv");
            EXPECT_EQ(e["cat"], "pp");
            EXPECT_EQ(e["args"]["detail"], "stage 0: \"recv_fwd\" mb 0");
        }
    }
    EXPECT_EQ(x, 2);
    EXPECT_EQ(threads, (std::vector<std::string>{"compute", "pp"}));  // only the activities used
}
