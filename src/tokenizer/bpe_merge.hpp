// Byte-level BPE merging, shared by bpe, tiktoken and hf (private to src/tokenizer/). A piece
// starts as the tokens of its bytes; then, repeatedly, the adjacent pair with the lowest
// priority is merged, the leftmost one on a tie, until no adjacent pair has a merge. That is
// tiktoken's rule (priority = rank of the merged bytes) and Hugging Face's (priority = index
// of the merge in the merges list) alike; the formats differ only in the table they build.
// Optionally a piece that is itself a token is that token, merges or not (tiktoken always;
// tokenizer.json with "ignore_merges").
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace quintet {

// Token ids beyond this are refused when a file is read (the largest vocabularies in use are a
// few hundred thousand; an id of 4e9 would otherwise size the tables).
inline constexpr uint64_t kMaxTokenId = uint64_t(1) << 24;

class BpeMerger {
public:
    static constexpr uint32_t kNone = UINT32_MAX;

    // Token `id` stands for `bytes`; ids not given are gaps. A single byte must be given for
    // each of the 256 bytes before encoding (require_all_bytes checks).
    void add_token(uint32_t id, std::string_view bytes);
    // (a, b) -> merged with this priority; a pair given twice keeps the lower priority.
    void add_merge(uint32_t a, uint32_t b, uint32_t merged, uint32_t priority);
    void set_whole_piece_lookup(bool on) { whole_piece_ = on; }
    // Builds the lookup tables; call once after the add_* calls, before anything else.
    // tiktoken_merges: every pair of tokens whose concatenation is a token merges into it, with
    // priority = the merged token's id (in a .tiktoken file ids are ranks).
    void finish(bool tiktoken_merges);
    // -1 when each byte has a single-byte token, else the first byte that has none.
    int missing_byte() const;

    size_t n_tokens() const { return n_tokens_; }
    uint32_t max_id() const { return max_id_; }
    bool has(uint32_t id) const { return id < offset_.size() - 1 && present_[id]; }
    std::string_view bytes(uint32_t id) const {
        return std::string_view(arena_.data() + offset_[id], offset_[id + 1] - offset_[id]);
    }
    uint32_t find(std::string_view bytes) const;  // the token of exactly these bytes, or kNone

    // Appends the tokens of one piece. Thread-safe (per-thread scratch space).
    void encode_piece(std::string_view piece, std::vector<uint32_t>& out) const;
    // The same merging from given starting tokens (a character-level BPE's symbols): appends the
    // merged tokens. Thread-safe.
    void merge_symbols(const std::vector<uint32_t>& symbols, std::vector<uint32_t>& out) const;

private:
    struct PairSlot {
        uint64_t key = ~uint64_t(0);  // a << 32 | b; all ones = empty
        uint64_t value = 0;           // priority << 32 | merged
    };
    uint64_t pair(uint32_t a, uint32_t b) const;  // priority << 32 | merged, or ~0 when none
    void encode_long(std::string_view piece, std::vector<uint32_t>& out) const;

    static uint64_t hash_bytes(std::string_view s);
    // Tokens as added (id, bytes), then laid out by id in `arena_`/`offset_`.
    std::vector<std::pair<uint32_t, std::string>> pending_;
    std::string arena_;
    std::vector<uint64_t> offset_{0};  // [max_id + 2]
    std::vector<bool> present_;
    size_t n_tokens_ = 0;
    uint32_t max_id_ = 0;
    std::array<uint32_t, 256> byte_token_{};
    std::vector<PairSlot> pairs_;  // open addressing, power-of-two size
    uint64_t pair_mask_ = 0;
    struct Merge {
        uint32_t a, b, merged, priority;
    };
    std::vector<Merge> pending_merges_;
    // bytes -> id, open addressing on a hash of the bytes: the whole-piece lookup and find().
    struct BytesSlot {
        uint32_t hash = 0;
        uint32_t id = kNone;
    };
    std::vector<BytesSlot> by_bytes_;
    uint64_t by_bytes_mask_ = 0;
    bool whole_piece_ = false;
    bool finished_ = false;
};

class Pretokenizer;

// Appends the tokens of text[begin, end): pieces from `pre` (which sees all of `text`), each
// merged by `merger`. Allocates nothing per piece.
void bpe_encode_text(const Pretokenizer& pre, const BpeMerger& merger, std::string_view text, size_t begin,
                     size_t end, std::vector<uint32_t>& out);

}  // namespace quintet
