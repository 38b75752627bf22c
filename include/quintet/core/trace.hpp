// This rank's timeline (docs/observability.md): what it did and when, one track per activity --
// the step and its phases, compute (forward and backward per microbatch and chunk, the
// optimizer, with the profile's operations nested), each axis's communication, data waits,
// checkpoint writes -- recorded while train.trace_steps asks and written as Chrome Trace Event
// JSON. Always on, and as cheap as two clock reads per wait: the seconds this rank was blocked,
// per track (on other ranks: communication; on its data), which the per-rank figures (/ranks/*)
// and the straggler report read. The communicators, the pipeline executor, the profile scopes,
// the sampler and the trainer feed it; nothing here knows what they are.
//
// One thread (the rank's main thread) records; a disabled span costs one branch.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace quintet::trace {

// The activities of a rank, one thread each in the trace (tid = value + 1, in this order).
enum class Track : uint8_t { step, compute, data, tp, cp, ep, pp, dp, zero, world, checkpoint, count };
constexpr int kTracks = int(Track::count);
const char* track_name(Track t);  // "step", "compute", "data", "tp", ...
// The track of a communicator's waits, by its name (its group: "tp", "tp_kv_group", "dp_cp",
// "edp", "pp_tied", "world (checkpoint I/O)", ...): tp*, cp, ep, pp*, dp/dp_cp/edp, checkpoint
// I/O; anything else is world.
Track track_of_group(const std::string& communicator_name);

inline int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

namespace detail {
constexpr int kRecording = 1, kStretch = 2;
inline int g_flags = 0;  // what spans do besides nothing: record events, stretch compute
inline int64_t g_wait_ns[kTracks] = {};
inline int64_t g_wait_total_ns = 0;
}  // namespace detail

// ---- always on: seconds blocked ----------------------------------------------------------------
inline void add_wait(Track t, int64_t ns) {
    detail::g_wait_ns[int(t)] += ns;
    detail::g_wait_total_ns += ns;
}
// Nanoseconds blocked since the process started, on one track or on all; callers take differences.
inline int64_t waited_ns(Track t) { return detail::g_wait_ns[int(t)]; }
inline int64_t waited_ns() { return detail::g_wait_total_ns; }

// ---- recording ---------------------------------------------------------------------------------
struct Event {
    int64_t t0 = 0, t1 = -1;  // steady-clock ns; t1 < 0: still open
    int64_t wait_ns = 0;      // of which blocked (on any track) while it was open
    const char* name = "";    // static storage (a literal, or intern()ed)
    uint32_t detail = ~0u;    // offset of a text in the detail arena (~0u: none)
    int32_t step = 0;         // 1-based, as the progress line counts; 0 = between steps
    int16_t mb = -1, chunk = -1;
    Track track = Track::step;
};

// Starts recording (events reserved for `reserve`; more grow the store) / stops it. Events of
// an earlier recording are dropped by start.
void start_recording(size_t reserve = size_t(1) << 16);
void stop_recording();
inline bool recording() { return (detail::g_flags & detail::kRecording) != 0; }
void set_step(int32_t step);  // the step the next events belong to
int32_t current_step();
// An event opened now on `track` (its index), closed by close(index). detail: a text copied
// into the trace (args.detail), e.g. the transfer a wait is for; null = none.
size_t open(Track track, const char* name, int mb = -1, int chunk = -1, const char* detail = nullptr);
void close(size_t index);
const std::vector<Event>& events();
const char* detail_text(const Event& e);  // "" when none
// A stable copy of a name built at run time (interned: one allocation per distinct text).
const char* intern(const std::string& text);

// ---- compute stretch (the slow-rank fault injection: docs/reliability.md) -----------------------
// factor > 1: every outermost compute span spins, at its end, for (factor - 1) x its own
// compute time (its length less what it waited), so this rank computes factor times as long
// while it keeps every collective; 1: off.
void set_stretch(double factor);
double stretch();

// An activity of this rank on `track`; an event while recording. On Track::compute the
// outermost span is what the stretch lengthens.
class Span {
public:
    Span(Track t, const char* name, int mb = -1, int chunk = -1) {
        if (detail::g_flags) begin(t, name, mb, chunk);
    }
    ~Span() {
        if (on_) end();
    }
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;

private:
    void begin(Track t, const char* name, int mb, int chunk);
    void end();
    bool on_ = false, compute_ = false, outer_compute_ = false;
    size_t index_ = ~size_t(0);
    int64_t t0_ = 0, w0_ = 0;
};

// This rank blocked: on other ranks (a communicator's wait, on that communicator's track) or on
// its data. Always counted (waited_ns); an event while recording.
class Wait {
public:
    Wait(Track t, const char* name, const char* detail = nullptr) : t_(t), t0_(now_ns()) {
        if (detail::g_flags & detail::kRecording) index_ = open(t, name, -1, -1, detail);
    }
    ~Wait() {
        add_wait(t_, now_ns() - t0_);
        if (index_ != ~size_t(0)) close(index_);
    }
    Wait(const Wait&) = delete;
    Wait& operator=(const Wait&) = delete;

private:
    Track t_;
    int64_t t0_;
    size_t index_ = ~size_t(0);
};

// ---- output ------------------------------------------------------------------------------------
// Who recorded: the trace's process (pid = rank + 1: viewers take pid 0 for no process) and
// what otherData says about it.
struct ProcessInfo {
    int rank = 0;
    std::string name;        // "rank 5 (node03) pp 1 tp 1", the process's name in the viewer
    std::string other_json;  // a JSON object's members (no braces) for otherData
};
// The recorded events as one Trace Event JSON object: metadata (the process and its threads'
// names and order), then every event, ts and dur in microseconds from `origin_ns` (this rank's
// reading of the common start, docs/observability.md "Clocks"). Written to `path` through a
// temporary and a rename; returns "" or what failed.
std::string write_json(const std::string& path, const ProcessInfo& who, int64_t origin_ns);

}  // namespace quintet::trace
