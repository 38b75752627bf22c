// What every format shares (tokenizer.hpp): special-token matching, decoding with checked ids,
// the fingerprint of the stored form, and encoding on all threads. A text is cut only where the
// format says no piece can cross (a line that starts with an ASCII letter, for the standard
// patterns), so the parts encode to exactly the ids of the whole.
#include "quintet/tokenizer/tokenizer.hpp"

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>

#include "quintet/core/error.hpp"
#include "quintet/tokenizer/byte_bpe.hpp"

namespace quintet {

struct Tokenizer::Impl {
    std::shared_ptr<const TokenizerModel> model;
    TokenizerState state;
    int vocab = 0;
    std::vector<SpecialToken> specials;
    std::string description;
    uint64_t fingerprint = 0;
    // Specials by their first byte, longest first: the candidates at a position.
    std::array<std::vector<const SpecialToken*>, 256> by_first;
};

namespace {

uint64_t hash_into(uint64_t h, std::string_view s) {
    for (const char c : s) h = (h ^ uint8_t(c)) * 0x100000001b3ull;  // FNV-1a
    return (h ^ s.size()) * 0x100000001b3ull;
}

uint64_t state_fingerprint(const TokenizerState& s) {
    uint64_t h = 0xcbf29ce484222325ull;
    h = hash_into(h, s.kind);
    h = hash_into(h, s.pattern);
    for (auto [a, b] : s.merges) {
        char buf[8];
        std::memcpy(buf, &a, 4);
        std::memcpy(buf + 4, &b, 4);
        h = hash_into(h, std::string_view(buf, 8));
    }
    h = hash_into(h, s.file);
    for (const auto& t : s.specials) h = hash_into(hash_into(h, t.text), std::to_string(t.id));
    return h;
}

// The special token whose text starts text[i] (the longest), or nullptr.
const SpecialToken* special_at(const std::array<std::vector<const SpecialToken*>, 256>& by_first,
                               std::string_view text, size_t i) {
    for (const SpecialToken* s : by_first[uint8_t(text[i])])
        if (s->text.size() <= text.size() - i && text.compare(i, s->text.size(), s->text) == 0) return s;
    return nullptr;
}

bool ascii_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

}  // namespace

void TokenizerModel::decode(const uint32_t* ids, size_t n, std::string& out) const {
    for (size_t i = 0; i < n; ++i) token_bytes(ids[i], out);
}

Tokenizer::Tokenizer() {
    static const Tokenizer byte = tokenizer_byte();
    impl_ = byte.impl_;
}

Tokenizer::Tokenizer(std::shared_ptr<const TokenizerModel> model, TokenizerState state, int vocab_size,
                     std::vector<SpecialToken> specials, std::string description) {
    auto impl = std::make_shared<Impl>();
    impl->model = std::move(model);
    impl->state = std::move(state);
    impl->vocab = vocab_size;
    impl->specials = std::move(specials);
    impl->description = std::move(description);
    impl->fingerprint = state_fingerprint(impl->state);
    for (const SpecialToken& s : impl->specials)
        if (!s.text.empty()) impl->by_first[uint8_t(s.text[0])].push_back(&s);
    for (auto& v : impl->by_first)
        std::stable_sort(v.begin(), v.end(), [](auto* a, auto* b) { return a->text.size() > b->text.size(); });
    impl_ = std::move(impl);
}

const std::string& Tokenizer::kind() const { return impl_->state.kind; }
int Tokenizer::vocab_size() const { return impl_->vocab; }
const TokenizerState& Tokenizer::state() const { return impl_->state; }
const std::vector<SpecialToken>& Tokenizer::specials() const { return impl_->specials; }
const std::string& Tokenizer::describe() const { return impl_->description; }
uint64_t Tokenizer::fingerprint() const { return impl_->fingerprint; }
bool Tokenizer::cuts_at_line_starts() const { return impl_->model->cuts_at_line_starts(); }

int Tokenizer::special_id(std::string_view text) const {
    for (const auto& s : impl_->specials)
        if (s.text == text) return int(s.id);
    return -1;
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text) const {
    std::vector<uint32_t> out;
    out.reserve(text.size() / 3 + 8);
    encode(text, out);
    return out;
}

void Tokenizer::encode(std::string_view text, std::vector<uint32_t>& out) const {
    impl_->model->encode_ordinary(text, 0, text.size(), out);
}

void Tokenizer::encode_range(std::string_view text, size_t begin, size_t end, std::vector<uint32_t>& out) const {
    impl_->model->encode_ordinary(text, begin, end, out);
}

void Tokenizer::encode_with_specials(std::string_view text, std::vector<uint32_t>& out) const {
    size_t seg = 0;
    for (size_t i = 0; i < text.size();) {
        const SpecialToken* s = impl_->by_first[uint8_t(text[i])].empty() ? nullptr : special_at(impl_->by_first, text, i);
        if (!s) {
            ++i;
            continue;
        }
        // The text between special tokens is encoded on its own, as tiktoken and the
        // tokenizers library do: its pattern does not see past the special token.
        encode(text.substr(seg, i - seg), out);
        out.push_back(s->id);
        i += s->text.size();
        seg = i;
    }
    encode(text.substr(seg), out);
}

std::vector<std::string_view> tokenizer_cut(const Tokenizer& tok, std::string_view text, size_t target) {
    std::vector<std::string_view> parts;
    if (!tok.cuts_at_line_starts()) return parts;
    size_t begin = 0;
    while (text.size() - begin > 2 * target) {
        // The first line start after begin + target that begins with an ASCII letter.
        size_t at = begin + target, cut = std::string_view::npos;
        while (at < text.size()) {
            const void* nl = std::memchr(text.data() + at, '\n', text.size() - at);
            if (!nl) break;
            const size_t p = size_t(static_cast<const char*>(nl) - text.data()) + 1;
            if (p < text.size() && ascii_letter(text[p])) {
                cut = p;
                break;
            }
            at = p;
        }
        if (cut == std::string_view::npos) break;
        parts.push_back(text.substr(begin, cut - begin));
        begin = cut;
    }
    parts.push_back(text.substr(begin));
    return parts;
}

std::vector<uint32_t> Tokenizer::encode_parallel(std::string_view text, bool specials,
                                                 const std::function<void(size_t, size_t)>& progress) const {
    // Work items: a range of a segment (the pattern sees the whole segment), or a special token.
    struct Item {
        std::string_view segment;
        size_t begin = 0, end = 0;
        int special = -1;
    };
    std::vector<Item> items;
    // About four parts per thread (load balance), of 64 KiB to 1 MiB.
    const size_t part = std::clamp(text.size() / (4 * size_t(omp_get_max_threads())), size_t(1) << 16, size_t(1) << 20);
    auto add_segment = [&](std::string_view seg) {
        if (seg.empty()) return;
        const std::vector<std::string_view> parts = tokenizer_cut(*this, seg, part);
        if (parts.empty()) {
            items.push_back({seg, 0, seg.size(), -1});
            return;
        }
        for (const auto& p : parts) {
            const size_t b = size_t(p.data() - seg.data());
            items.push_back({seg, b, b + p.size(), -1});
        }
    };
    if (specials) {
        size_t seg = 0;
        for (size_t i = 0; i < text.size();) {
            const SpecialToken* s =
                impl_->by_first[uint8_t(text[i])].empty() ? nullptr : special_at(impl_->by_first, text, i);
            if (!s) {
                ++i;
                continue;
            }
            add_segment(text.substr(seg, i - seg));
            items.push_back({{}, 0, 0, int(s->id)});
            i += s->text.size();
            seg = i;
        }
        add_segment(text.substr(seg));
    } else {
        add_segment(text);
    }

    std::vector<std::vector<uint32_t>> ids(items.size());
    std::atomic<size_t> done{0};
    const TokenizerModel& model = *impl_->model;
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t k = 0; k < items.size(); ++k) {
        const Item& it = items[k];
        if (it.special >= 0) {
            ids[k].push_back(uint32_t(it.special));
            continue;
        }
        ids[k].reserve((it.end - it.begin) / 3 + 8);
        model.encode_ordinary(it.segment, it.begin, it.end, ids[k]);
        const size_t d = done.fetch_add(it.end - it.begin) + (it.end - it.begin);
        if (progress && omp_get_thread_num() == 0) progress(d, text.size());
    }
    size_t total = 0;
    for (const auto& v : ids) total += v.size();
    std::vector<uint32_t> out;
    out.reserve(total);
    for (auto& v : ids) {
        out.insert(out.end(), v.begin(), v.end());
        std::vector<uint32_t>().swap(v);
    }
    if (progress) progress(text.size(), text.size());
    return out;
}

std::string Tokenizer::decode(const uint32_t* ids, size_t n) const {
    for (size_t i = 0; i < n; ++i)
        if (ids[i] >= uint32_t(impl_->vocab))
            throw ConfigError("decode: token id " + std::to_string(ids[i]) + " is not in the vocabulary of " +
                              impl_->description + "; valid: 0 .. " + std::to_string(impl_->vocab - 1));
    std::string out, probe;
    for (size_t i = 0; i < n; ++i) {
        probe.clear();
        if (!impl_->model->token_bytes(ids[i], probe))
            throw ConfigError("decode: token id " + std::to_string(ids[i]) + " is no token of " + impl_->description +
                              " (a gap between its ranks)");
    }
    impl_->model->decode(ids, n, out);
    return out;
}

std::string Tokenizer::token_bytes(uint32_t id) const {
    std::string out;
    if (id >= uint32_t(impl_->vocab) || !impl_->model->token_bytes(id, out))
        throw ConfigError("token id " + std::to_string(id) + " is no token of " + impl_->description);
    return out;
}

}  // namespace quintet
