// What one kind of communication cost one rank since the counters were last reset: the same
// three figures for every axis (tensor, context, expert parallelism), which the trainer writes
// to /timing/<axis>_* every step.
#pragma once

namespace quintet {

struct CommCounters {
    double seconds = 0;    // from posting each transfer to its completion
    double exposed_s = 0;  // of which this rank was blocked (all of it for a blocking collective)
    double bytes = 0;      // payload this rank sent
    // One blocking transfer: all of its time is exposed.
    void blocking(double secs, double sent) {
        seconds += secs, exposed_s += secs, bytes += sent;
    }
    void reset() { *this = CommCounters{}; }
};

}  // namespace quintet
