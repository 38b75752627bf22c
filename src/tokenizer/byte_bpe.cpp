// The byte tokenizer and quintet's own byte-level BPE (byte_bpe.hpp): encoding through the
// shared merger (bpe_merge.hpp), and incremental training. Training keeps pair counts over the
// distinct pre-split pieces and, per merge, recounts only the pieces that contain the merged
// pair (an inverted index pair -> pieces), with a lazy max-heap for "most frequent pair". That
// makes 8k merges on 1 MB of text take seconds.
#include "quintet/tokenizer/byte_bpe.hpp"

#include <omp.h>

#include <algorithm>
#include <memory>
#include <queue>
#include <unordered_map>

#include "bpe_merge.hpp"
#include "quintet/core/error.hpp"
#include "quintet/tokenizer/pretokenizer.hpp"

namespace quintet {
namespace {

constexpr uint32_t kByteVocab = 256;

uint64_t pair_key(uint32_t a, uint32_t b) { return (uint64_t(a) << 32) | b; }

// ---- the format-1 split (token files written before the GPT-2 pattern) --------------------
// Bytes are classed as letter (A-Z, a-z and every byte >= 0x80), digit, whitespace or other.
// A chunk is a single space followed by a run of one non-whitespace class, or a run of
// whitespace (whose last space is left to lead the next word), or a run of one non-whitespace
// class; runs are cut every 64 bytes. Kept only so that old files keep their meaning.
enum class ByteClass { letter, digit, space, other };

ByteClass byte_class(unsigned char c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return ByteClass::letter;
    if (c >= '0' && c <= '9') return ByteClass::digit;
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') return ByteClass::space;
    return ByteClass::other;
}

template <class Emit>
void format1_split(std::string_view text, size_t begin, size_t n, Emit&& emit) {
    auto cls = [&](size_t i) { return byte_class(static_cast<unsigned char>(text[i])); };
    auto run_end = [&](size_t i, ByteClass c, size_t start) {
        const size_t limit = std::min(n, start + kBpeMaxTokenBytes);
        while (i < limit && cls(i) == c) ++i;
        return i;
    };
    size_t i = begin;
    while (i < n) {
        size_t end;
        const ByteClass c = cls(i);
        if (text[i] == ' ' && i + 1 < n && cls(i + 1) != ByteClass::space) {
            end = run_end(i + 1, cls(i + 1), i);
        } else if (c == ByteClass::space) {
            end = run_end(i, c, i);
            if (end < n && end - i > 1 && text[end - 1] == ' ' && cls(end) != ByteClass::space) --end;
        } else {
            end = run_end(i, c, i);
        }
        emit(text.substr(i, end - i));
        i = end;
    }
}

// ---- models ------------------------------------------------------------------------------

class ByteModel final : public TokenizerModel {
public:
    void encode_ordinary(std::string_view text, size_t begin, size_t end, std::vector<uint32_t>& out) const override {
        for (size_t i = begin; i < end; ++i) out.push_back(uint8_t(text[i]));
    }
    bool token_bytes(uint32_t id, std::string& out) const override {
        if (id >= kByteVocab) return false;
        out += char(id);
        return true;
    }
    bool cuts_at_line_starts() const override { return true; }
};

class BpeModel final : public TokenizerModel {
public:
    BpeModel(const std::vector<std::pair<uint32_t, uint32_t>>& merges, int end_of_text, const std::string& pattern,
             const std::string& origin)
        : end_of_text_(end_of_text) {
        if (!pattern.empty()) pre_ = std::make_unique<Pretokenizer>(pattern, origin + " pre-tokenizer pattern");
        std::vector<std::string> tokens(kByteVocab);  // [vocab] the bytes of each token, to check lengths
        for (uint32_t b = 0; b < kByteVocab; ++b) {
            tokens[b] = std::string(1, char(b));
            merger_.add_token(b, tokens[b]);
        }
        for (size_t i = 0; i < merges.size(); ++i) {
            const auto [a, b] = merges[i];
            const uint32_t id = kByteVocab + uint32_t(i);
            if (a >= id || b >= id)
                throw ConfigError(origin + ": merge " + std::to_string(i) + " = (" + std::to_string(a) + ", " +
                                  std::to_string(b) + ") uses a token not made before it; merge i may only use "
                                  "tokens < 256 + i = " + std::to_string(id));
            if (tokens[a].size() + tokens[b].size() > kBpeMaxTokenBytes)
                throw ConfigError(origin + ": merge " + std::to_string(i) + " makes a token of " +
                                  std::to_string(tokens[a].size() + tokens[b].size()) + " bytes, longer than " +
                                  std::to_string(kBpeMaxTokenBytes) + ": not a merge quintet's bpe can have learned");
            tokens.push_back(tokens[a] + tokens[b]);
            merger_.add_token(id, tokens.back());
            merger_.add_merge(a, b, id, uint32_t(i));
        }
        merger_.finish(false);
    }

    void encode_ordinary(std::string_view text, size_t begin, size_t end, std::vector<uint32_t>& out) const override {
        if (pre_) {
            bpe_encode_text(*pre_, merger_, text, begin, end, out);
        } else {
            format1_split(text, begin, end, [&](std::string_view chunk) { merger_.encode_piece(chunk, out); });
        }
    }
    bool token_bytes(uint32_t id, std::string& out) const override {
        if (end_of_text_ >= 0 && id == uint32_t(end_of_text_)) {
            out += kEndOfText;
            return true;
        }
        if (!merger_.has(id)) return false;
        out += merger_.bytes(id);
        return true;
    }
    // The GPT-2 pattern cannot put "\n" and a following letter in one piece; neither can the
    // format-1 split (a letter run never starts with a newline).
    bool cuts_at_line_starts() const override { return true; }

private:
    BpeMerger merger_;
    std::unique_ptr<Pretokenizer> pre_;
    int end_of_text_;
};

}  // namespace

Tokenizer tokenizer_byte() {
    TokenizerState state;
    state.kind = "byte";
    return Tokenizer(std::make_shared<ByteModel>(), state, int(kByteVocab), {}, "byte (one token per byte, vocab 256)");
}

Tokenizer tokenizer_bpe(const std::vector<std::pair<uint32_t, uint32_t>>& merges, bool with_end_of_text,
                        const std::string& pattern, const std::string& origin) {
    const int eot = with_end_of_text ? int(kByteVocab + merges.size()) : -1;
    TokenizerState state;
    state.kind = "bpe";
    state.merges = merges;
    state.pattern = pattern.empty() ? "" : (pretokenizer_preset(pattern) ? pretokenizer_preset(pattern) : pattern);
    std::vector<SpecialToken> specials;
    if (with_end_of_text) specials.push_back({kEndOfText, uint32_t(eot)});
    state.specials = specials;
    auto model = std::make_shared<BpeModel>(merges, eot, state.pattern, origin);
    const int vocab = int(kByteVocab + merges.size()) + (with_end_of_text ? 1 : 0);
    std::string split = state.pattern.empty()                           ? "format-1 split"
                        : !pretokenizer_preset_of(state.pattern).empty() ? pretokenizer_preset_of(state.pattern) + " pattern"
                                                                        : "custom pattern";
    return Tokenizer(model, state, vocab, specials,
                     "bpe (" + std::to_string(merges.size()) + " merges, " + split +
                         (with_end_of_text ? ", <|endoftext|> = " + std::to_string(eot) : std::string()) +
                         ", vocab " + std::to_string(vocab) + ")");
}

Tokenizer tokenizer_bpe_with_end_of_text(const Tokenizer& bpe) {
    QUINTET_CHECK(bpe.kind() == "bpe", "tokenizer_bpe_with_end_of_text: not a bpe tokenizer");
    if (!bpe.specials().empty()) return bpe;
    return tokenizer_bpe(bpe.state().merges, true, bpe.state().pattern, "bpe");
}

namespace {

// Max-heap entry: most frequent first, ties to the smallest (a, b). Stale entries (count no
// longer current) are skipped when popped, which is cheaper than a decrease-key heap.
struct HeapEntry {
    int64_t count;
    uint64_t key;
    bool operator<(const HeapEntry& o) const { return count != o.count ? count < o.count : key > o.key; }
};

bool merge_pair(std::vector<uint32_t>& ids, uint32_t a, uint32_t b, uint32_t id) {
    size_t out = 0;
    bool found = false;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i + 1 < ids.size() && ids[i] == a && ids[i + 1] == b) {
            ids[out++] = id;
            ++i;
            found = true;
        } else {
            ids[out++] = ids[i];
        }
    }
    ids.resize(out);
    return found;
}

// The distinct training chunks of `text` with their counts: GPT-2 pieces, cut into chunks of at
// most kBpeMaxTokenBytes bytes. Counted on all threads over line-start parts.
std::vector<std::pair<std::string_view, int64_t>> count_chunks(std::string_view text) {
    const Pretokenizer pre("gpt2", "bpe training");
    std::vector<std::string_view> parts = tokenizer_cut(tokenizer_bpe({}, false, "gpt2", "bpe"), text, size_t(1) << 20);
    if (parts.empty()) parts.push_back(text);
    std::vector<std::unordered_map<std::string_view, int64_t>> counts(static_cast<size_t>(omp_get_max_threads()));
#pragma omp parallel for schedule(dynamic)
    for (size_t p = 0; p < parts.size(); ++p) {
        auto& mine = counts[size_t(omp_get_thread_num())];
        const size_t begin = size_t(parts[p].data() - text.data()), end = begin + parts[p].size();
        std::vector<size_t> ends;
        for (size_t pos = begin; pos < end;) {
            ends.clear();
            const size_t stop = pre.split(text, pos, end, ends, 4096);
            size_t s = pos;
            for (const size_t e : ends) {
                for (size_t c = s; c < e; c += kBpeMaxTokenBytes) {
                    const size_t len = std::min(kBpeMaxTokenBytes, e - c);
                    if (len >= 2) ++mine[text.substr(c, len)];  // 1-byte chunks have no pairs
                }
                s = e;
            }
            pos = stop;
        }
    }
    for (size_t t = 1; t < counts.size(); ++t)
        for (const auto& [k, v] : counts[t]) counts[0][k] += v;
    std::vector<std::pair<std::string_view, int64_t>> sorted(counts[0].begin(), counts[0].end());
    std::sort(sorted.begin(), sorted.end());
    return sorted;
}

}  // namespace

Tokenizer tokenizer_train_bpe(std::string_view text, int vocab_size, const std::function<void(int, int)>& progress,
                              bool with_end_of_text) {
    if (vocab_size <= int(kByteVocab))
        throw ConfigError("BPE vocab_size = " + std::to_string(vocab_size) +
                          ": must be > 256 (the 256 byte tokens come first)");
    const int total = vocab_size - int(kByteVocab);

    // Distinct chunks, sorted so that word indices (and so everything after) are reproducible.
    const std::vector<std::pair<std::string_view, int64_t>> sorted = count_chunks(text);
    std::vector<std::vector<uint32_t>> words(sorted.size());  // [n_words] current token ids
    std::vector<int64_t> freq(sorted.size());                 // [n_words] occurrences in text
    std::unordered_map<uint64_t, int64_t> pair_count;
    std::unordered_map<uint64_t, std::vector<uint32_t>> pair_words;  // superset of holders
    for (size_t w = 0; w < sorted.size(); ++w) {
        words[w].assign(sorted[w].first.begin(), sorted[w].first.end());
        for (auto& v : words[w]) v &= 0xFF;
        freq[w] = sorted[w].second;
        for (size_t i = 0; i + 1 < words[w].size(); ++i) {
            const uint64_t k = pair_key(words[w][i], words[w][i + 1]);
            pair_count[k] += freq[w];
            auto& holders = pair_words[k];
            if (holders.empty() || holders.back() != w) holders.push_back(uint32_t(w));
        }
    }
    std::priority_queue<HeapEntry> heap;
    for (auto [k, c] : pair_count) heap.push({c, k});

    std::vector<std::pair<uint32_t, uint32_t>> merges;
    merges.reserve(size_t(total));
    const int report_every = std::max(1, total / 200);
    std::unordered_map<uint64_t, int64_t> delta;
    std::vector<uint32_t> before;
    while (int(merges.size()) < total && !heap.empty()) {
        const HeapEntry top = heap.top();
        heap.pop();
        auto cur = pair_count.find(top.key);
        if (cur == pair_count.end() || cur->second != top.count) continue;  // stale

        const uint32_t a = uint32_t(top.key >> 32), b = uint32_t(top.key & 0xFFFFFFFFu);
        const uint32_t id = kByteVocab + uint32_t(merges.size());
        merges.emplace_back(a, b);

        std::vector<uint32_t> holders = std::move(pair_words[top.key]);
        pair_words.erase(top.key);
        std::sort(holders.begin(), holders.end());
        holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
        delta.clear();
        for (const uint32_t w : holders) {
            auto& ids = words[w];
            // Recount the whole (short) chunk: simpler than patching neighbours, same cost.
            before = ids;
            if (!merge_pair(ids, a, b, id)) continue;  // pair already merged away here
            for (size_t i = 0; i + 1 < before.size(); ++i) delta[pair_key(before[i], before[i + 1])] -= freq[w];
            for (size_t i = 0; i + 1 < ids.size(); ++i) {
                const uint64_t k = pair_key(ids[i], ids[i + 1]);
                delta[k] += freq[w];
                // Pairs without `id` were already in this chunk, so already indexed.
                if (ids[i] == id || ids[i + 1] == id) {
                    auto& h = pair_words[k];
                    if (h.empty() || h.back() != w) h.push_back(w);
                }
            }
        }
        for (auto [k, d] : delta) {
            if (d == 0) continue;
            int64_t& c = pair_count[k];
            c += d;
            if (c > 0) {
                heap.push({c, k});
            } else {
                pair_count.erase(k);
            }
        }
        pair_count.erase(top.key);

        const int done = int(merges.size());
        if (progress && (done % report_every == 0 || done == total)) progress(done, total);
    }
    if (progress && int(merges.size()) < total) progress(int(merges.size()), total);
    return tokenizer_bpe(merges, with_end_of_text, "gpt2", "bpe");
}

}  // namespace quintet
