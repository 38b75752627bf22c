// Byte-level BPE merging (bpe_merge.hpp). Short pieces (almost all) use tiktoken's linear scan
// over an array of pair priorities; long ones (a run of a megabyte of spaces is one piece) a
// heap over a linked list, O(n log n). Both merge the lowest priority first, the leftmost on a
// tie, so they give the same tokens.
#include "bpe_merge.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <queue>
#include <stdexcept>

#include "quintet/tokenizer/pretokenizer.hpp"

namespace quintet {
namespace {

constexpr uint64_t kNoPair = ~uint64_t(0);
constexpr size_t kLinearMax = 128;  // longer pieces take the heap

uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

uint64_t pow2_at_least(uint64_t n) {
    uint64_t p = 16;
    while (p < n) p <<= 1;
    return p;
}

}  // namespace

uint64_t BpeMerger::hash_bytes(std::string_view s) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
    size_t i = 0;
    for (; i + 8 <= s.size(); i += 8) {
        uint64_t w;
        std::memcpy(&w, s.data() + i, 8);
        h = mix(h ^ w);
    }
    uint64_t w = 0;
    std::memcpy(&w, s.data() + i, s.size() - i);
    return mix(h ^ w ^ (uint64_t(s.size() - i) << 56));
}

void BpeMerger::add_token(uint32_t id, std::string_view bytes) {
    pending_.emplace_back(id, std::string(bytes));
}

void BpeMerger::add_merge(uint32_t a, uint32_t b, uint32_t merged, uint32_t priority) {
    pending_merges_.push_back({a, b, merged, priority});
}

uint32_t BpeMerger::find(std::string_view s) const {
    if (by_bytes_.empty()) return kNone;
    const uint64_t h = hash_bytes(s);
    const uint32_t h32 = uint32_t(h >> 32);
    for (uint64_t i = h & by_bytes_mask_;; i = (i + 1) & by_bytes_mask_) {
        const BytesSlot& slot = by_bytes_[i];
        if (slot.id == kNone) return kNone;
        if (slot.hash == h32 && bytes(slot.id) == s) return slot.id;
    }
}

uint64_t BpeMerger::pair(uint32_t a, uint32_t b) const {
    const uint64_t key = (uint64_t(a) << 32) | b;
    for (uint64_t i = mix(key) & pair_mask_;; i = (i + 1) & pair_mask_) {
        const PairSlot& slot = pairs_[i];
        if (slot.key == key) return slot.value;
        if (slot.key == kNoPair) return kNoPair;
    }
}

void BpeMerger::finish(bool tiktoken_merges) {
    // Tokens laid out by id.
    max_id_ = 0;
    for (const auto& [id, b] : pending_) max_id_ = std::max(max_id_, id);
    std::sort(pending_.begin(), pending_.end());
    offset_.assign(size_t(max_id_) + 2, 0);
    present_.assign(size_t(max_id_) + 1, false);
    arena_.clear();
    size_t k = 0;
    for (uint32_t id = 0; id <= max_id_; ++id) {
        offset_[id] = arena_.size();
        if (k < pending_.size() && pending_[k].first == id) {
            arena_ += pending_[k].second;
            present_[id] = true;
            ++k;
            while (k < pending_.size() && pending_[k].first == id) ++k;  // a duplicate id: the first
        }
    }
    offset_[max_id_ + 1] = arena_.size();
    n_tokens_ = size_t(std::count(present_.begin(), present_.end(), true));
    pending_.clear();
    pending_.shrink_to_fit();

    // bytes -> id (the first id of equal bytes wins, as the lowest rank would).
    by_bytes_.assign(pow2_at_least(2 * n_tokens_ + 2), BytesSlot{});
    by_bytes_mask_ = by_bytes_.size() - 1;
    for (uint32_t id = 0; id <= max_id_; ++id) {
        if (!present_[id] || find(bytes(id)) != kNone) continue;
        const uint64_t h = hash_bytes(bytes(id));
        uint64_t i = h & by_bytes_mask_;
        while (by_bytes_[i].id != kNone) i = (i + 1) & by_bytes_mask_;
        by_bytes_[i] = {uint32_t(h >> 32), id};
    }
    byte_token_.fill(kNone);
    for (int b = 0; b < 256; ++b) {
        const char c = char(b);
        byte_token_[b] = find(std::string_view(&c, 1));
    }

    if (tiktoken_merges) {
        // Every split of every token into two tokens: millions of lookups, shared by the threads.
        std::vector<std::vector<Merge>> found(static_cast<size_t>(omp_get_max_threads()));
#pragma omp parallel for schedule(dynamic, 4096)
        for (int64_t i = 0; i <= int64_t(max_id_); ++i) {
            const uint32_t id = uint32_t(i);
            if (!present_[id]) continue;
            const std::string_view t = bytes(id);
            if (find(t) != id) continue;  // a duplicate of a lower rank never forms
            auto& mine = found[size_t(omp_get_thread_num())];
            for (size_t cut = 1; cut < t.size(); ++cut) {
                const uint32_t a = find(t.substr(0, cut));
                if (a == kNone) continue;
                const uint32_t b = find(t.substr(cut));
                if (b != kNone) mine.push_back({a, b, id, id});
            }
        }
        for (const auto& f : found) pending_merges_.insert(pending_merges_.end(), f.begin(), f.end());
    }
    pairs_.assign(pow2_at_least(2 * pending_merges_.size() + 2), PairSlot{});
    pair_mask_ = pairs_.size() - 1;
    for (const Merge& m : pending_merges_) {
        const uint64_t key = (uint64_t(m.a) << 32) | m.b;
        const uint64_t value = (uint64_t(m.priority) << 32) | m.merged;
        uint64_t i = mix(key) & pair_mask_;
        while (pairs_[i].key != kNoPair && pairs_[i].key != key) i = (i + 1) & pair_mask_;
        if (pairs_[i].key == key) {
            pairs_[i].value = std::min(pairs_[i].value, value);  // a pair given twice: the first merge
        } else {
            pairs_[i] = {key, value};
        }
    }
    pending_merges_.clear();
    pending_merges_.shrink_to_fit();
    finished_ = true;
}

int BpeMerger::missing_byte() const {
    for (int b = 0; b < 256; ++b)
        if (byte_token_[b] == kNone) return b;
    return -1;
}

void BpeMerger::encode_piece(std::string_view piece, std::vector<uint32_t>& out) const {
    const size_t n = piece.size();
    if (n == 0) return;
    if (n == 1) {
        out.push_back(byte_token_[uint8_t(piece[0])]);
        return;
    }
    if (whole_piece_) {
        if (const uint32_t id = find(piece); id != kNone) {
            out.push_back(id);
            return;
        }
    }
    if (n > kLinearMax) {
        encode_long(piece, out);
        return;
    }
    // ids[0, m) the tokens so far; pr[i] the merge of (ids[i], ids[i+1]): priority << 32 | merged.
    uint32_t ids[kLinearMax];
    uint64_t pr[kLinearMax];
    size_t m = n;
    for (size_t i = 0; i < n; ++i) ids[i] = byte_token_[uint8_t(piece[i])];
    for (size_t i = 0; i + 1 < m; ++i) pr[i] = pair(ids[i], ids[i + 1]);
    while (m > 1) {
        uint64_t best = kNoPair;
        size_t at = 0;
        for (size_t i = 0; i + 1 < m; ++i)
            if (pr[i] < best) {
                best = pr[i];
                at = i;
            }
        if (best == kNoPair) break;
        ids[at] = uint32_t(best);
        // Drop token at + 1 and the pair that started there.
        if (at + 2 < m) {
            std::memmove(ids + at + 1, ids + at + 2, (m - at - 2) * sizeof(uint32_t));
            std::memmove(pr + at + 1, pr + at + 2, (m - at - 3) * sizeof(uint64_t));
        }
        --m;
        pr[at] = at + 1 < m ? pair(ids[at], ids[at + 1]) : kNoPair;
        if (at > 0) pr[at - 1] = pair(ids[at - 1], ids[at]);
    }
    out.insert(out.end(), ids, ids + m);
}

void BpeMerger::encode_long(std::string_view piece, std::vector<uint32_t>& out) const {
    thread_local std::vector<uint32_t> symbols;
    symbols.resize(piece.size());
    for (size_t i = 0; i < piece.size(); ++i) symbols[i] = byte_token_[uint8_t(piece[i])];
    merge_symbols(symbols, out);
}

void BpeMerger::merge_symbols(const std::vector<uint32_t>& symbols, std::vector<uint32_t>& out) const {
    const size_t n = symbols.size();
    if (n == 0) return;
    if (n >= UINT32_MAX) throw std::length_error("BPE piece of 4 Gi symbols or more");
    constexpr uint32_t kEnd = UINT32_MAX;
    // One node per symbol; a merge absorbs the right node into the left one.
    thread_local std::vector<uint32_t> id, next, prev;
    thread_local std::vector<uint64_t> heap;  // priority << 32 | node, a min-heap
    id.assign(symbols.begin(), symbols.end());
    next.resize(n);
    prev.resize(n);
    heap.clear();
    for (size_t i = 0; i < n; ++i) {
        next[i] = i + 1 < n ? uint32_t(i + 1) : kEnd;
        prev[i] = i > 0 ? uint32_t(i - 1) : kEnd;
    }
    auto push = [&](uint32_t i) {
        const uint64_t v = pair(id[i], id[next[i]]);
        if (v == kNoPair) return;
        heap.push_back((v & 0xFFFFFFFF00000000ull) | i);
        std::push_heap(heap.begin(), heap.end(), std::greater<>());
    };
    for (size_t i = 0; i + 1 < n; ++i) push(uint32_t(i));
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), std::greater<>());
        const uint64_t top = heap.back();
        heap.pop_back();
        const uint32_t i = uint32_t(top & 0xFFFFFFFFu);
        // Entries go stale when a neighbour merges; the current pair at i must have this priority.
        if (id[i] == kEnd || next[i] == kEnd) continue;
        const uint64_t v = pair(id[i], id[next[i]]);
        if (v == kNoPair || (v >> 32) != (top >> 32)) continue;
        const uint32_t j = next[i];
        id[i] = uint32_t(v);
        id[j] = kEnd;  // absorbed
        next[i] = next[j];
        if (next[i] != kEnd) {
            prev[next[i]] = i;
            push(i);
        }
        if (prev[i] != kEnd) push(prev[i]);
    }
    for (uint32_t i = 0; i != kEnd; i = next[i]) out.push_back(id[i]);
}

void bpe_encode_text(const Pretokenizer& pre, const BpeMerger& merger, std::string_view text, size_t begin,
                     size_t end, std::vector<uint32_t>& out) {
    thread_local std::vector<size_t> ends;
    for (size_t pos = begin; pos < end;) {
        ends.clear();
        const size_t stop = pre.split(text, pos, end, ends, 4096);
        size_t s = pos;
        for (const size_t e : ends) {
            merger.encode_piece(text.substr(s, e - s), out);
            s = e;
        }
        pos = stop;
    }
}

}  // namespace quintet
