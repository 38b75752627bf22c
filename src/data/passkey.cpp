#include "quintet/data/passkey.hpp"

#include <algorithm>
#include <cstdio>

#include "quintet/core/error.hpp"
#include "quintet/core/rng.hpp"

namespace quintet {

namespace {

const char* kIntro = "Remember the pass key. ";
const char* kFiller[] = {"The grass is green. ", "The sky is blue. ", "The sun is yellow. ",
                         "Here we go. ", "There and back again. "};
// The key sits between '<' and '>' in the needle and the question ends with '<': one token
// marks where the key starts, so a small byte-level model can learn the copy (an induction
// head matching a single token) without first learning to match "pass key is " as a phrase.
const char* kQuestion = "What is the pass key? The pass key is <";

std::string needle(const std::string& key) {
    return "The pass key is <" + key + ">. ";
}

// `chars` characters of the filler cycle.
std::string filler(size_t chars) {
    std::string f;
    for (size_t i = 0; f.size() < chars; ++i) f += kFiller[i % 5];
    f.resize(chars);
    return f;
}

}  // namespace

PasskeyPrompt passkey_prompt(const Tokenizer& tok, int length, double depth, uint64_t seed,
                             uint64_t index) {
    Philox rng{stream_key(seed, "passkey")};
    char key[8];
    std::snprintf(key, sizeof key, "%05d", int(rng.uniform(index) * 100000) % 100000);
    PasskeyPrompt p;
    p.key = key;
    p.depth = depth;
    const std::string fixed = std::string(kIntro) + needle(p.key) + kQuestion;
    auto build = [&](size_t fill) {
        const std::string f = filler(fill);
        // The key sentence goes at the sentence boundary at or before `depth` of the filler.
        size_t at = std::min(f.size(), size_t(depth * double(f.size())));
        while (at > 0 && !(at >= 2 && f[at - 2] == '.' && f[at - 1] == ' ')) --at;
        return std::string(kIntro) + f.substr(0, at) + needle(p.key) + f.substr(at) + kQuestion;
    };
    auto count = [&](const std::string& text) { return int(tok.encode(text + p.key).size()); };
    // The most filler that keeps prompt + key within `length` tokens (bisection on characters).
    size_t lo = 0, hi = size_t(std::max(0, length)) * 8 + 64;
    if (count(fixed) > length)
        throw ConfigError("passkey: length " + std::to_string(length) + " tokens is too short for the prompt (" +
                          std::to_string(count(fixed)) + " tokens without filler)");
    while (lo < hi) {
        const size_t mid = (lo + hi + 1) / 2;
        if (count(build(mid)) <= length) lo = mid;
        else hi = mid - 1;
    }
    p.prompt = build(lo);
    p.tokens = count(p.prompt);
    return p;
}

std::string passkey_corpus(const Tokenizer& tok, int n, int length, uint64_t seed) {
    std::string out;
    for (int i = 0; i < n; ++i) {
        const double depth = n > 1 ? double(i % 11) / 10.0 : 0.5;
        PasskeyPrompt p = passkey_prompt(tok, length, depth, seed, uint64_t(i));
        out += p.prompt + p.key;
        // Byte-exact documents: pad with spaces to `length` (the bisection can fall short by a
        // character where a sentence boundary moved).
        if (tok.kind() == "byte")
            while (int(out.size()) % length != 0) out += ' ';
    }
    return out;
}

}  // namespace quintet
