#include "quintet/core/profile.hpp"

#include <chrono>
#include <cstring>

namespace quintet::profile {

namespace {
// Slots by name pointer first (string literals), by text second; the main thread only.
struct Slot {
    const char* key;
    std::string name;
    int64_t ns = 0, calls = 0;
};
std::vector<Slot> g_slots;
Scope* g_top = nullptr;

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

int slot_of(const char* name, bool by_text) {
    if (!by_text)
        for (size_t i = 0; i < g_slots.size(); ++i)
            if (g_slots[i].key == name) return int(i);
    for (size_t i = 0; i < g_slots.size(); ++i)
        if (g_slots[i].name == name) return int(i);
    g_slots.push_back({by_text ? nullptr : name, name});
    return int(g_slots.size() - 1);
}
}  // namespace

void enable(bool on) { detail::g_on = on; }

const char* joined_name(const char* role, const char* suffix) {
    struct Joined {
        const char *role, *suffix, *name;
    };
    static std::vector<Joined> known;
    for (const Joined& j : known)
        if (j.role == role && j.suffix == suffix) return j.name;
    known.push_back({role, suffix, trace::intern(std::string(role) + suffix)});
    return known.back().name;
}

void Scope::begin(const char* name, bool by_text, bool traced) {
    active_ = true;
    if (detail::g_on) {
        counted_ = true;
        slot_ = slot_of(name, by_text);
        parent_ = g_top;
        g_top = this;
        start_ns_ = now_ns();
    }
    if (traced && trace::recording() && std::strncmp(name, "comm.", 5) != 0)
        event_ = trace::open(trace::Track::compute, by_text ? trace::intern(name) : name);
}

void Scope::end() {
    if (event_ != ~size_t(0)) trace::close(event_);
    if (!counted_) return;
    const int64_t total = now_ns() - start_ns_;
    Slot& s = g_slots[size_t(slot_)];
    s.ns += total - child_ns_;
    ++s.calls;
    if (parent_) parent_->child_ns_ += total;
    g_top = parent_;
}

std::vector<Entry> take() {
    std::vector<Entry> out;
    out.reserve(g_slots.size());
    for (auto& s : g_slots) {
        out.push_back({s.name, double(s.ns) * 1e-9, s.calls});
        s.ns = 0;
        s.calls = 0;
    }
    return out;
}

}  // namespace quintet::profile
