#include "quintet/train/timeline.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "quintet/core/error.hpp"
#include "quintet/core/process.hpp"
#include "quintet/core/trace.hpp"
#include "quintet/train/stragglers.hpp"

namespace quintet {

namespace fs = std::filesystem;

namespace {

std::string steps_text(const TrainConfig& t) {
    return t.trace_from == t.trace_to ? std::to_string(t.trace_from)
                                      : std::to_string(t.trace_from) + "-" + std::to_string(t.trace_to);
}

std::string json_text(const std::string& s) {
    std::string o = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') o += '\\', o += char(c);
        else if (c < 0x20) o += ' ';
        else o += char(c);
    }
    return o + "\"";
}

}  // namespace

void check_trace_folder(const Deck& deck, const MpiCommunicator& world) {
    if (deck.train.trace_from <= 0) return;
    char why[512] = {0};
    const fs::path dir = fs::path(deck.output.run_dir) / "trace";
    if (world.rank() == 0) {
        std::error_code ec;
        fs::create_directories(dir, ec);
        if (ec || !fs::is_directory(dir)) {
            std::snprintf(why, sizeof why, "the folder %s cannot be made (%s)", dir.c_str(),
                          ec ? ec.message().c_str() : "a file of that name is in the way");
        } else {
            const fs::path probe = dir / (".write_check" + std::to_string(::getpid()));
            std::ofstream f(probe);
            f << "x";
            f.close();
            if (!f) std::snprintf(why, sizeof why, "the folder %s cannot be written to", dir.c_str());
            fs::remove(probe, ec);
        }
    }
    world.broadcast(why, sizeof why, 0);
    if (why[0])
        config_fail("train.trace_steps", steps_text(deck.train),
                    std::string("each rank writes its timeline under run_dir/trace, but ") + why +
                        "; choose another output.run_dir, or leave train.trace_steps empty");
}

Timeline::Timeline(const ProcessGrid& grid, const Deck& deck, std::function<void(const std::string&)> log)
    : grid_(grid), from_(deck.train.trace_from), to_(deck.train.trace_to),
      dir_((fs::path(deck.output.run_dir) / "trace").string()), log_(std::move(log)) {}

void Timeline::begin(int64_t start_step) {
    if (from_ > 0 && start_step >= to_)
        log_("note: train.trace_steps = " + std::to_string(from_) + "-" + std::to_string(to_) +
             " lies before this run's first step (" + std::to_string(start_step + 1) + ", resumed): nothing is traced");
}

void Timeline::before_step(int64_t s) {
    if (from_ <= 0 || recording_ || written_ || s + 1 < from_ || s + 1 > to_) return;
    // The common zero: every rank leaves the second barrier at about the same moment (the first
    // absorbs the ranks still finishing earlier work). A third one measures how well.
    const MpiCommunicator& world = grid_.world();
    world.barrier();
    world.barrier();
    origin_ns_ = trace::now_ns();
    world.barrier();
    double spread[2] = {double(trace::now_ns() - origin_ns_) * 1e-3, 0};
    spread[1] = -spread[0];
    world.all_reduce_max(spread, 2);
    spread_us_ = spread[0] + spread[1];
    int64_t id = std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
    world.broadcast(&id, sizeof id, 0);
    run_id_ = id;
    trace::start_recording();
    recording_ = true;
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "trace: recording steps %d-%d on every rank (clocks aligned by a barrier: the ranks left the next "
                  "one within %.0f us of each other)",
                  from_, to_, spread_us_);
    log_(buf);
}

void Timeline::after_step(int64_t done) {
    if (recording_ && done >= to_) {
        write();
        log_("trace: steps " + std::to_string(from_) + "-" + std::to_string(to_) + " written to " + dir_ +
             "/rank<r>.json; `quintet trace " + fs::path(dir_).parent_path().string() +
             "` merges them for Perfetto or chrome://tracing");
    }
}

void Timeline::finish() {
    if (recording_) write();
}

void Timeline::write() {
    trace::stop_recording();
    recording_ = false;
    written_ = true;
    const Layout& l = grid_.layout();
    const int r = grid_.rank();
    const Coords c = l.coords_of(r);
    const std::string host = host_name(), place = rank_place(l, r);
    trace::ProcessInfo who;
    who.rank = r;
    who.name = "rank " + std::to_string(r) + " (" + host + (place.empty() ? "" : ", " + place) + ")";
    char other[1024];
    std::snprintf(other, sizeof other,
                  "\"rank\":%d,\"host\":%s,\"world\":%d,\"layout\":%s,\"coords\":{\"tp\":%d,\"cp\":%d,\"dp\":%d,"
                  "\"pp\":%d,\"ep\":%d},\"steps\":[%d,%d],\"run_id\":%lld,\"clock\":%s,\"barrier_spread_us\":%.1f",
                  r, json_text(host).c_str(), l.world(), json_text(l.describe()).c_str(), c[kTP], c[kCP], c[kDP], c[kPP],
                  l.dp_cp_index(r) % l.ep, from_, to_, (long long)run_id_,
                  json_text("steady clock of each rank; zero where it left a common barrier").c_str(), spread_us_);
    who.other_json = other;
    const std::string path = (fs::path(dir_) / ("rank" + std::to_string(r) + ".json")).string();
    const std::string err = trace::write_json(path, who, origin_ns_);
    if (!err.empty()) {
        std::fprintf(stderr, "quintet: rank %d: warning: its timeline was not written: %s\n", r, err.c_str());
        std::fflush(stderr);
    }
}

}  // namespace quintet
