#include "quintet/core/trace.hpp"

#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <unordered_map>

namespace quintet::trace {

namespace {

std::vector<Event> g_events;
std::vector<char> g_details;  // the detail texts, each NUL-terminated
int32_t g_step = 0;
double g_stretch = 1.0;
int g_compute_depth = 0;  // compute spans open (the outermost one is stretched)
// intern(): stable storage, one entry per distinct text.
std::deque<std::string> g_names;
std::unordered_map<std::string, const char*> g_name_index;

constexpr const char* kTrackNames[kTracks] = {"step", "compute", "data", "tp", "cp", "ep",
                                              "pp", "dp", "zero", "world", "checkpoint"};

void json_string(std::FILE* f, const char* s) {
    std::fputc('"', f);
    for (const unsigned char* p = reinterpret_cast<const unsigned char*>(s); *p; ++p) {
        if (*p == '"' || *p == '\\') std::fprintf(f, "\\%c", *p);
        else if (*p < 0x20) std::fprintf(f, "\\u%04x", *p);
        else std::fputc(*p, f);
    }
    std::fputc('"', f);
}

// ns -> microseconds with three decimals, exactly (no floating point on the way).
void micros(std::FILE* f, int64_t ns) {
    if (ns < 0) {
        std::fputc('-', f);
        ns = -ns;
    }
    std::fprintf(f, "%lld.%03lld", (long long)(ns / 1000), (long long)(ns % 1000));
}

}  // namespace

const char* track_name(Track t) { return int(t) < kTracks ? kTrackNames[int(t)] : "?"; }

Track track_of_group(const std::string& n) {
    auto starts = [&](const char* p) { return n.rfind(p, 0) == 0; };
    if (n.find("checkpoint") != std::string::npos) return Track::checkpoint;
    if (starts("tp")) return Track::tp;
    if (n == "cp") return Track::cp;
    if (n == "ep") return Track::ep;
    if (starts("pp")) return Track::pp;
    if (n == "dp" || n == "dp_cp" || n == "edp") return Track::dp;
    return Track::world;
}

void start_recording(size_t reserve) {
    g_events.clear();
    g_details.clear();
    g_events.reserve(reserve);
    g_details.reserve(reserve * 8);
    detail::g_flags |= detail::kRecording;
}

void stop_recording() { detail::g_flags &= ~detail::kRecording; }

void set_step(int32_t step) { g_step = step; }
int32_t current_step() { return g_step; }

size_t open(Track track, const char* name, int mb, int chunk, const char* text) {
    Event e;
    e.t0 = now_ns();
    e.wait_ns = detail::g_wait_total_ns;  // made relative at close
    e.name = name;
    e.step = g_step;
    e.mb = int16_t(mb), e.chunk = int16_t(chunk);
    e.track = track;
    if (text) {
        e.detail = uint32_t(g_details.size());
        g_details.insert(g_details.end(), text, text + std::strlen(text) + 1);
    }
    g_events.push_back(e);
    return g_events.size() - 1;
}

void close(size_t index) {
    if (index >= g_events.size()) return;  // recording restarted meanwhile
    Event& e = g_events[index];
    e.t1 = now_ns();
    e.wait_ns = detail::g_wait_total_ns - e.wait_ns;
}

const std::vector<Event>& events() { return g_events; }

const char* detail_text(const Event& e) { return e.detail == ~0u ? "" : g_details.data() + e.detail; }

const char* intern(const std::string& text) {
    const auto it = g_name_index.find(text);
    if (it != g_name_index.end()) return it->second;
    g_names.push_back(text);
    const char* p = g_names.back().c_str();
    g_name_index.emplace(text, p);
    return p;
}

void set_stretch(double factor) {
    g_stretch = factor > 1.0 ? factor : 1.0;
    if (g_stretch > 1.0) detail::g_flags |= detail::kStretch;
    else detail::g_flags &= ~detail::kStretch;
}
double stretch() { return g_stretch; }

void Span::begin(Track t, const char* name, int mb, int chunk) {
    on_ = true;
    t0_ = now_ns();
    w0_ = detail::g_wait_total_ns;
    compute_ = t == Track::compute;
    if (compute_) outer_compute_ = g_compute_depth++ == 0;
    if (detail::g_flags & detail::kRecording) index_ = open(t, name, mb, chunk);
}

void Span::end() {
    if (outer_compute_ && g_stretch > 1.0) {
        // Spin (not sleep): the rank stays busy, as on a slow node. Yielding in the loop leaves
        // a core this rank shares (more ranks than cores) to the others, so only this rank is slow.
        const int64_t own = (now_ns() - t0_) - (detail::g_wait_total_ns - w0_);
        const int64_t until = now_ns() + int64_t(double(own > 0 ? own : 0) * (g_stretch - 1.0));
        while (now_ns() < until) sched_yield();
    }
    if (index_ != ~size_t(0)) close(index_);
    if (compute_) --g_compute_depth;
    on_ = false;
}

std::string write_json(const std::string& path, const ProcessInfo& who, int64_t origin_ns) {
    const std::string tmp = path + ".tmp" + std::to_string(getpid());
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f) return "cannot create " + tmp + ": " + std::strerror(errno);
    const int pid = who.rank + 1;  // viewers take pid 0 for "no process" (the kernel's idle task)
    std::fprintf(f, "{\"traceEvents\":[\n");
    std::fprintf(f, "{\"name\":\"process_name\",\"cat\":\"__metadata\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":", pid);
    json_string(f, who.name.c_str());
    std::fprintf(f, "}},\n{\"name\":\"process_sort_index\",\"cat\":\"__metadata\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
                    "\"args\":{\"sort_index\":%d}}",
                 pid, who.rank);
    bool used[kTracks] = {};
    for (const Event& e : g_events) used[int(e.track)] = true;
    for (int t = 0; t < kTracks; ++t)
        if (used[t])  // a viewer shows a named thread even when it is empty
            std::fprintf(f, ",\n{\"name\":\"thread_name\",\"cat\":\"__metadata\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                        "\"args\":{\"name\":\"%s\"}},\n{\"name\":\"thread_sort_index\",\"cat\":\"__metadata\",\"ph\":"
                        "\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"sort_index\":%d}}",
                     pid, t + 1, kTrackNames[t], pid, t + 1, t);
    for (const Event& e : g_events) {
        if (e.t1 < 0) continue;  // still open when written (a run cut short): left out
        std::fprintf(f, ",\n{\"name\":");
        json_string(f, e.name);
        std::fprintf(f, ",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":", track_name(e.track), pid,
                     int(e.track) + 1);
        micros(f, e.t0 - origin_ns);
        std::fprintf(f, ",\"dur\":");
        micros(f, e.t1 - e.t0);
        std::fprintf(f, ",\"args\":{\"step\":%d", e.step);
        if (e.mb >= 0) std::fprintf(f, ",\"mb\":%d", e.mb);
        if (e.chunk >= 0) std::fprintf(f, ",\"chunk\":%d", e.chunk);
        if (e.wait_ns > 0 && (e.track == Track::step || e.track == Track::compute || e.track == Track::checkpoint)) {
            std::fprintf(f, ",\"wait_us\":");
            micros(f, e.wait_ns);
        }
        if (e.detail != ~0u) {
            std::fprintf(f, ",\"detail\":");
            json_string(f, detail_text(e));
        }
        std::fprintf(f, "}}");
    }
    std::fprintf(f, "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{%s}}\n", who.other_json.c_str());
    const bool ok = std::fflush(f) == 0 && !std::ferror(f);
    if (std::fclose(f) != 0 || !ok) {
        std::remove(tmp.c_str());
        return "cannot write " + tmp + " (disk full?)";
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        const std::string err = std::strerror(errno);
        std::remove(tmp.c_str());
        return "cannot rename " + tmp + " to " + path + ": " + err;
    }
    return "";
}

}  // namespace quintet::trace
