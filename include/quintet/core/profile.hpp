// The per-operation time profile (`train.profile = true`, docs/benchmarks.md "Where the time
// goes"): named scopes around GEMMs by role, attention, norms, RoPE, SwiGLU, the loss, the
// optimizer and each axis's communication. Times are exclusive (a scope's nested scopes are
// subtracted), wall clock on the calling thread, so the names of one step add up to the step.
// Off by default: a disabled scope costs one branch. While the timeline records
// (core/trace.hpp), every scope is also an event on its compute track, except communication
// ("comm.*"), which the communicators record on their axes' tracks themselves.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "quintet/core/trace.hpp"

namespace quintet::profile {

namespace detail {
inline bool g_on = false;
}
void enable(bool on);
inline bool enabled() { return detail::g_on; }
// A scope's name that is a role and a suffix ("gemm.qkv" + ".fwd"), kept once: a literal-like
// pointer for Scope, so naming a GEMM by its pass allocates nothing after the first time.
const char* joined_name(const char* role, const char* suffix);

struct Entry {
    std::string name;
    double seconds = 0;  // exclusive, since the last take()
    int64_t calls = 0;
};
// Every name seen so far with its time since the last call (then reset), in first-seen order.
std::vector<Entry> take();

// Times the enclosing block under `name` (a string literal: kept by pointer).
class Scope {
public:
    // traced = false: the profile only (a span of the same name already stands in the trace).
    explicit Scope(const char* name, bool traced = true) {
        if (detail::g_on || trace::recording()) begin(name, false, traced);
    }
    explicit Scope(const std::string& name) {  // a name built at run time (compared by text)
        if (detail::g_on || trace::recording()) begin(name.c_str(), true, true);
    }
    ~Scope() {
        if (active_) end();
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

private:
    void begin(const char* name, bool by_text, bool traced);
    void end();
    bool active_ = false, counted_ = false;
    int slot_ = 0;
    size_t event_ = ~size_t(0);
    int64_t start_ns_ = 0, child_ns_ = 0;
    Scope* parent_ = nullptr;
};

}  // namespace quintet::profile

#define QUINTET_PROFILE_CAT2(a, b) a##b
#define QUINTET_PROFILE_CAT(a, b) QUINTET_PROFILE_CAT2(a, b)
// QUINTET_PROFILE("gemm.qkv"); times the rest of the enclosing block.
#define QUINTET_PROFILE(name) ::quintet::profile::Scope QUINTET_PROFILE_CAT(quintet_profile_, __LINE__)(name)
