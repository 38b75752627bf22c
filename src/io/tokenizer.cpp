// Byte and byte-level BPE tokenizers: pre-split, incremental BPE training, rank-order encoding.
// Training keeps pair counts over the distinct pre-split chunks and, per merge, recounts only
// the chunks that contain the merged pair (an inverted index pair -> chunks), with a lazy
// max-heap for "most frequent pair". That makes 8k merges on 1 MB of text take seconds.
#include "quintet/io/tokenizer.hpp"

#include <algorithm>
#include <queue>
#include <unordered_map>

#include "quintet/core/error.hpp"

namespace quintet {

struct TokenizerTables {
    std::string kind;                                  // kind the tables were built for
    size_t n_merges = 0;                               // merges.size() they were built for
    std::vector<std::string> bytes;                    // [vocab] token id -> its bytes
    std::unordered_map<uint64_t, uint32_t> merge_ids;  // (a << 32 | b) -> merged token id
};

namespace {

constexpr uint32_t kByteVocab = 256;

uint64_t pair_key(uint32_t a, uint32_t b) { return (uint64_t(a) << 32) | b; }

enum class ByteClass { letter, digit, space, other };

ByteClass byte_class(unsigned char c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return ByteClass::letter;
    if (c >= '0' && c <= '9') return ByteClass::digit;
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f')
        return ByteClass::space;
    return ByteClass::other;
}

// Calls emit(chunk) for each pre-split chunk of `text`, in order; the chunks partition `text`.
// The rules are documented at kTokenizerMaxChunk in the header.
template <class Emit>
void tokenizer_split(std::string_view text, Emit&& emit) {
    const size_t n = text.size();
    auto cls = [&](size_t i) { return byte_class(static_cast<unsigned char>(text[i])); };
    // End of the run of class c starting at i, capped so the chunk [start, end) stays short.
    auto run_end = [&](size_t i, ByteClass c, size_t start) {
        size_t limit = std::min(n, start + kTokenizerMaxChunk);
        while (i < limit && cls(i) == c) ++i;
        return i;
    };
    size_t i = 0;
    while (i < n) {
        size_t end;
        ByteClass c = cls(i);
        if (text[i] == ' ' && i + 1 < n && cls(i + 1) != ByteClass::space) {
            end = run_end(i + 1, cls(i + 1), i);
        } else if (c == ByteClass::space) {
            end = run_end(i, c, i);
            // Leave a trailing space to lead the next word, as GPT-2 does.
            if (end < n && end - i > 1 && text[end - 1] == ' ' && cls(end) != ByteClass::space)
                --end;
        } else {
            end = run_end(i, c, i);
        }
        emit(text.substr(i, end - i));
        i = end;
    }
}

// Merges every non-overlapping (a, b), left to right, into `id`. Returns whether any was found.
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

// Applies the merges in rank order (lowest merge id first) to the bytes of one chunk.
void encode_chunk(const TokenizerTables& t, std::string_view chunk, std::vector<uint32_t>& ids) {
    ids.assign(chunk.begin(), chunk.end());
    for (auto& v : ids) v &= 0xFF;  // char may be signed
    while (ids.size() >= 2) {
        uint32_t best = UINT32_MAX;
        size_t at = 0;
        for (size_t i = 0; i + 1 < ids.size(); ++i) {
            auto it = t.merge_ids.find(pair_key(ids[i], ids[i + 1]));
            if (it != t.merge_ids.end() && it->second < best) {
                best = it->second;
                at = i;
            }
        }
        if (best == UINT32_MAX) break;
        merge_pair(ids, ids[at], ids[at + 1], best);
    }
}

const TokenizerTables& tables_of(const Tokenizer& tok) {
    const auto& t = tok.tables;
    if (!t || t->kind != tok.kind || t->n_merges != tok.merges.size()) tok.build_tables();
    return *tok.tables;
}

}  // namespace

int Tokenizer::vocab_size() const {
    const bool special = kind == "bpe" && eos_id >= 0;
    return int(kByteVocab + merges.size()) + (special ? 1 : 0);
}

void Tokenizer::build_tables() const {
    QUINTET_CHECK(kind == "byte" || kind == "bpe",
                  "tokenizer kind '" + kind + "': must be 'byte' or 'bpe'");
    QUINTET_CHECK(kind == "bpe" || merges.empty(), "byte tokenizer must have no merges");
    QUINTET_CHECK(eos_id < 0 || (kind == "byte" ? eos_id < int(kByteVocab)
                                                : eos_id == int(kByteVocab + merges.size())),
                  "end-of-document token " + std::to_string(eos_id) +
                      ": a byte (byte tokenizer) or the id after the merges (bpe)");
    auto t = std::make_shared<TokenizerTables>();
    t->kind = kind;
    t->n_merges = merges.size();
    t->bytes.reserve(kByteVocab + merges.size());
    for (uint32_t b = 0; b < kByteVocab; ++b) t->bytes.emplace_back(1, char(b));
    t->merge_ids.reserve(merges.size() * 2);
    for (size_t i = 0; i < merges.size(); ++i) {
        auto [a, b] = merges[i];
        uint32_t id = kByteVocab + uint32_t(i);
        QUINTET_CHECK(a < id && b < id, "BPE merge " + std::to_string(i) + " = (" +
                                            std::to_string(a) + ", " + std::to_string(b) +
                                            ") uses a token not made before it");
        QUINTET_CHECK(t->bytes[a].size() + t->bytes[b].size() <= kTokenizerMaxChunk,
                      "BPE merge " + std::to_string(i) + " makes a token longer than a pre-split chunk");
        t->bytes.push_back(t->bytes[a] + t->bytes[b]);
        // A duplicate pair would never fire in rank order; keep the first (lowest) id.
        t->merge_ids.emplace(pair_key(a, b), id);
    }
    if (kind == "bpe" && eos_id >= 0) t->bytes.push_back(kEndOfText);  // decodes as a marker
    tables = std::move(t);
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text) const { return encode(text, {}); }

std::vector<uint32_t> Tokenizer::encode(std::string_view text,
                                        const std::function<void(size_t, size_t)>& progress) const {
    const TokenizerTables& t = tables_of(*this);
    std::vector<uint32_t> out;
    if (t.merge_ids.empty()) {
        out.assign(text.begin(), text.end());
        for (auto& v : out) v &= 0xFF;
        if (progress) progress(text.size(), text.size());
        return out;
    }
    out.reserve(text.size() / 3 + 16);
    // Each distinct chunk is encoded once: {offset, length} into `store`.
    std::unordered_map<std::string_view, std::pair<size_t, size_t>> cache;
    std::vector<uint32_t> store, ids;
    constexpr size_t kProgressBytes = size_t(1) << 18;
    size_t done = 0, next_report = kProgressBytes;
    tokenizer_split(text, [&](std::string_view chunk) {
        auto [it, fresh] = cache.try_emplace(chunk);
        if (fresh) {
            encode_chunk(t, chunk, ids);
            it->second = {store.size(), ids.size()};
            store.insert(store.end(), ids.begin(), ids.end());
        }
        auto [off, len] = it->second;
        out.insert(out.end(), store.begin() + off, store.begin() + off + len);
        done += chunk.size();
        if (progress && done >= next_report) {
            progress(done, text.size());
            next_report = done + kProgressBytes;
        }
    });
    if (progress) progress(text.size(), text.size());
    return out;
}

std::string Tokenizer::decode(const uint32_t* ids, size_t n) const {
    const TokenizerTables& t = tables_of(*this);
    std::string out;
    for (size_t i = 0; i < n; ++i) {
        QUINTET_CHECK(ids[i] < t.bytes.size(),
                      "decode: token id " + std::to_string(ids[i]) + " >= vocab size " +
                          std::to_string(t.bytes.size()));
        out += t.bytes[ids[i]];
    }
    return out;
}

std::string Tokenizer::token_bytes(uint32_t id) const { return decode(&id, 1); }

namespace {

// Max-heap entry: most frequent first, ties to the smallest (a, b). Stale entries (count no
// longer current) are skipped when popped, which is cheaper than a decrease-key heap.
struct HeapEntry {
    int64_t count;
    uint64_t key;
    bool operator<(const HeapEntry& o) const {
        return count != o.count ? count < o.count : key > o.key;
    }
};

}  // namespace

Tokenizer tokenizer_train_bpe(std::string_view text, int vocab_size,
                              const std::function<void(int, int)>& progress) {
    if (vocab_size <= int(kByteVocab))
        throw ConfigError("BPE vocab_size = " + std::to_string(vocab_size) +
                          ": must be > 256 (the 256 byte tokens come first)");
    const int total = vocab_size - int(kByteVocab);

    // Distinct chunks, sorted so that word indices (and so everything after) are reproducible.
    std::unordered_map<std::string_view, int64_t> chunk_freq;
    tokenizer_split(text, [&](std::string_view c) {
        if (c.size() >= 2) ++chunk_freq[c];  // 1-byte chunks have no pairs
    });
    std::vector<std::pair<std::string_view, int64_t>> sorted(chunk_freq.begin(), chunk_freq.end());
    chunk_freq.clear();
    std::sort(sorted.begin(), sorted.end());

    std::vector<std::vector<uint32_t>> words(sorted.size());  // [n_words] current token ids
    std::vector<int64_t> freq(sorted.size());                 // [n_words] occurrences in text
    std::unordered_map<uint64_t, int64_t> pair_count;
    std::unordered_map<uint64_t, std::vector<uint32_t>> pair_words;  // superset of holders
    for (size_t w = 0; w < sorted.size(); ++w) {
        words[w].assign(sorted[w].first.begin(), sorted[w].first.end());
        for (auto& v : words[w]) v &= 0xFF;
        freq[w] = sorted[w].second;
        for (size_t i = 0; i + 1 < words[w].size(); ++i) {
            uint64_t k = pair_key(words[w][i], words[w][i + 1]);
            pair_count[k] += freq[w];
            auto& holders = pair_words[k];
            if (holders.empty() || holders.back() != w) holders.push_back(uint32_t(w));
        }
    }
    std::priority_queue<HeapEntry> heap;
    for (auto [k, c] : pair_count) heap.push({c, k});

    Tokenizer tok;
    tok.kind = "bpe";
    tok.merges.reserve(size_t(total));
    const int report_every = std::max(1, total / 200);
    std::unordered_map<uint64_t, int64_t> delta;
    while (int(tok.merges.size()) < total && !heap.empty()) {
        HeapEntry top = heap.top();
        heap.pop();
        auto cur = pair_count.find(top.key);
        if (cur == pair_count.end() || cur->second != top.count) continue;  // stale

        const uint32_t a = uint32_t(top.key >> 32), b = uint32_t(top.key & 0xFFFFFFFFu);
        const uint32_t id = kByteVocab + uint32_t(tok.merges.size());
        tok.merges.emplace_back(a, b);

        std::vector<uint32_t> holders = std::move(pair_words[top.key]);
        pair_words.erase(top.key);
        std::sort(holders.begin(), holders.end());
        holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
        delta.clear();
        for (uint32_t w : holders) {
            auto& ids = words[w];
            // Recount the whole (short) chunk: simpler than patching neighbours, same cost.
            std::vector<uint32_t> before = ids;
            if (!merge_pair(ids, a, b, id)) continue;  // pair already merged away here
            for (size_t i = 0; i + 1 < before.size(); ++i)
                delta[pair_key(before[i], before[i + 1])] -= freq[w];
            for (size_t i = 0; i + 1 < ids.size(); ++i) {
                uint64_t k = pair_key(ids[i], ids[i + 1]);
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

        int done = int(tok.merges.size());
        if (progress && (done % report_every == 0 || done == total)) progress(done, total);
    }
    if (progress && int(tok.merges.size()) < total) progress(int(tok.merges.size()), total);
    tok.build_tables();
    return tok;
}

}  // namespace quintet
