// Small tokenizer files made in memory for the tests that run offline: a .tiktoken file (the 256
// bytes and 20 English merges) and a GPT-2-style tokenizer.json with the same tokens and merges,
// plus <|endoftext|> (id 276) as a special added token. Both encode "the and" as 258 264.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace quintet::testing::small {

inline std::string base64(const std::string& s) {
    static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    size_t i = 0;
    for (; i + 2 < s.size(); i += 3) {
        const uint32_t w = uint32_t(uint8_t(s[i])) << 16 | uint32_t(uint8_t(s[i + 1])) << 8 | uint8_t(s[i + 2]);
        for (int k = 18; k >= 0; k -= 6) out += a[(w >> k) & 63];
    }
    if (s.size() - i == 1) {
        const uint32_t w = uint32_t(uint8_t(s[i])) << 16;
        out += a[(w >> 18) & 63];
        out += a[(w >> 12) & 63];
        out += "==";
    } else if (s.size() - i == 2) {
        const uint32_t w = uint32_t(uint8_t(s[i])) << 16 | uint32_t(uint8_t(s[i + 1])) << 8;
        for (int k = 18; k >= 6; k -= 6) out += a[(w >> k) & 63];
        out += '=';
    }
    return out;
}

// The 256 bytes, then a few English merges: a small but real .tiktoken file.
inline const std::vector<std::string> kMerged = {"th", "he", "the", " t", " the", "in", "an", "and", " and", "er", "on",
                                          "re", "at", "en", "ing", " a", "is", " is", "it", "or"};
inline std::string small_tiktoken() {
    std::string out;
    uint32_t rank = 0;
    for (int b = 0; b < 256; ++b) out += base64(std::string(1, char(b))) + " " + std::to_string(rank++) + "\n";
    for (const auto& t : kMerged) out += base64(t) + " " + std::to_string(rank++) + "\n";
    return out;
}

// GPT-2's byte-to-unicode alphabet, as UTF-8.
inline std::string alphabet(uint8_t b) {
    const bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    uint32_t cp = b;
    if (!direct) {
        uint32_t n = 0;
        for (int x = 0; x < b; ++x) {
            const bool d = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
            n += !d;
        }
        cp = 256 + n;
    }
    std::string out;
    if (cp < 0x80) {
        out += char(cp);
    } else {
        out += char(0xC0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3F));
    }
    return out;
}
inline std::string json_escape(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
    }
    return out;
}
// A GPT-2-style tokenizer.json: the byte alphabet plus merges of kMerged (each as first char +
// rest), <|endoftext|> as a special added token.
inline std::string small_tokenizer_json() {
    std::string vocab, merges;
    uint32_t id = 0;
    for (int b = 0; b < 256; ++b) vocab += (b ? "," : "") + std::string("\"") + json_escape(alphabet(uint8_t(b))) + "\":" + std::to_string(id++);
    auto alpha = [](const std::string& s) {
        std::string out;
        for (char c : s) out += alphabet(uint8_t(c));
        return json_escape(out);
    };
    for (const auto& t : kMerged) {
        vocab += ",\"" + alpha(t) + "\":" + std::to_string(id++);
        // The merge that makes it: the longest left part such that both parts are tokens.
        auto known = [](const std::string& x) {
            return x.size() == 1 || std::find(kMerged.begin(), kMerged.end(), x) != kMerged.end();
        };
        std::string left;
        for (size_t k = t.size() - 1; k >= 1 && left.empty(); --k)
            if (known(t.substr(0, k)) && known(t.substr(k))) left = t.substr(0, k);
        merges += std::string(merges.empty() ? "" : ",") + "\"" + alpha(left) + " " + alpha(t.substr(left.size())) + "\"";
    }
    vocab += ",\"<|endoftext|>\":" + std::to_string(id);
    return R"({"version":"1.0","added_tokens":[{"id":)" + std::to_string(id) +
           R"(,"content":"<|endoftext|>","special":true}],"normalizer":null,)"
           R"("pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},)"
           R"("post_processor":null,"decoder":{"type":"ByteLevel"},"model":{"type":"BPE","vocab":{)" +
           vocab + "},\"merges\":[" + merges + "]}}";
}

}  // namespace quintet::testing::small
