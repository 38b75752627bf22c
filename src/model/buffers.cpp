#include "quintet/model/buffers.hpp"

#include "quintet/core/error.hpp"

namespace quintet {

namespace {
size_t align_up(size_t b) { return (b + kBufferAlign - 1) / kBufferAlign * kBufferAlign; }
}  // namespace

size_t elem_bytes(Elem e, bool bf16) {
    switch (e) {
    case Elem::f32: return sizeof(float);
    case Elem::bf16: return sizeof(bf16_bits);
    case Elem::i32: return sizeof(int32_t);
    case Elem::act: return bf16 ? sizeof(bf16_bits) : sizeof(float);
    }
    return sizeof(float);
}

size_t layout_bytes(const std::vector<BufferSpec>& list, bool bf16) {
    size_t at = 0;
    for (const auto& s : list) at += align_up(s.n * elem_bytes(s.elem, bf16));
    return at;
}

void merge_shared(std::vector<BufferSpec>& into, const std::vector<BufferSpec>& add, bool bf16) {
    for (const auto& s : add) {
        bool found = false;
        for (auto& t : into)
            if (t.name == s.name) {
                QUINTET_CHECK(elem_bytes(t.elem, bf16) == elem_bytes(s.elem, bf16),
                              "shared buffer '" + s.name + "' declared with two element types");
                if (s.n > t.n) t.n = s.n;
                found = true;
                break;
            }
        if (!found) into.push_back(s);
    }
}

void place_deferred(const std::vector<BufferSpec>& saved, const std::vector<BufferSpec>& deferred, bool bf16,
                    std::vector<PlacedBuffer>& placed, std::vector<BufferSpec>& rest) {
    // Consecutive b_only buffers are one region (they are laid out back to back): a deferred
    // buffer naming any of them may use the whole run, from its first buffer on.
    std::vector<size_t> first(saved.size()), bytes(saved.size(), 0), used(saved.size(), 0);
    for (size_t t = 0; t < saved.size(); ++t) {
        first[t] = t > 0 && saved[t].b_only && saved[t - 1].b_only ? first[t - 1] : t;
        if (saved[t].b_only) bytes[first[t]] = (t > first[t] ? align_up(bytes[first[t]]) : 0) +
                                               saved[t].n * elem_bytes(saved[t].elem, bf16);
    }
    for (const auto& d : deferred) {
        const size_t need = d.n * elem_bytes(d.elem, bf16);
        bool done = false;
        for (const auto& target : d.over) {
            for (size_t t = 0; t < saved.size() && !done; ++t) {
                if (saved[t].name != target || !saved[t].b_only) continue;
                const size_t r = first[t];
                if (used[r] + need > bytes[r]) continue;
                placed.push_back({d, saved[r].name, used[r]});
                used[r] += align_up(need);
                done = true;
            }
            if (done) break;
        }
        if (!done) rest.push_back(d);
    }
}

BufferViews::BufferViews(const std::vector<BufferSpec>& list, void* base, bool bf16) : bf16_(bf16) {
    char* at = static_cast<char*>(base);
    for (const auto& s : list) {
        views_.push_back({s.name, at, s.elem});
        at += align_up(s.n * elem_bytes(s.elem, bf16));
    }
}

const BufferViews::View& BufferViews::find(std::string_view name, Elem elem) const {
    for (const auto& v : views_)
        if (v.name == name) {
            QUINTET_CHECK(v.elem == elem, "buffer '" + std::string(name) + "' used with another element type than declared");
            return v;
        }
    rank_fail("buffer '" + std::string(name) + "' was not declared");
}

void* BufferViews::address(std::string_view name) const {
    for (const auto& v : views_)
        if (v.name == name) return v.p;
    rank_fail("buffer '" + std::string(name) + "' was not declared");
}

bool BufferViews::has(std::string_view name) const {
    for (const auto& v : views_)
        if (v.name == name) return true;
    return false;
}

}  // namespace quintet
