// SPEC parsing and the stored-form round trip (tokenizer_spec.hpp): the one place that knows
// every format, so the formats' own files stay independent of each other.
#include "quintet/tokenizer/tokenizer_spec.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "quintet/core/error.hpp"
#include "quintet/tokenizer/byte_bpe.hpp"
#include "quintet/tokenizer/hf_json.hpp"
#include "quintet/tokenizer/pretokenizer.hpp"
#include "quintet/tokenizer/sentencepiece.hpp"
#include "quintet/tokenizer/tiktoken.hpp"

namespace quintet {
namespace {

std::string read_file(const std::string& what, const std::string& spec, const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (path.empty()) throw ConfigError(what + " = '" + spec + "': no FILE after the ':'");
    if (!fs::exists(path, ec)) throw ConfigError(what + " = '" + spec + "': file '" + path + "' does not exist");
    if (fs::is_directory(path, ec)) throw ConfigError(what + " = '" + spec + "': '" + path + "' is a directory");
    std::ifstream in(path, std::ios::binary);
    std::ostringstream buf;
    buf << in.rdbuf();
    if (!in) throw ConfigError(what + " = '" + spec + "': file '" + path + "' cannot be read");
    return std::move(buf).str();
}

}  // namespace

const char* tokenizer_spec_help() {
    return "byte, bpe, tiktoken:FILE.tiktoken, hf:tokenizer.json, spm:FILE.model";
}

Tokenizer tokenizer_load(const TokenizerSpec& s, const std::string& what) {
    const std::string& spec = s.spec;
    const size_t colon = spec.find(':');
    const std::string kind = spec.substr(0, colon);
    const std::string path = colon == std::string::npos ? "" : spec.substr(colon + 1);
    const bool tiktoken = kind == "tiktoken" && colon != std::string::npos;
    if (!tiktoken && !s.pattern.empty())
        throw ConfigError("--tokenizer-pattern = '" + s.pattern + "' applies to tiktoken:FILE only; " + what + " = '" +
                          spec + "' has its own");
    if (!tiktoken && !s.specials.empty())
        throw ConfigError("--tokenizer-specials = '" + s.specials + "' applies to tiktoken:FILE only; " + what + " = '" +
                          spec + "' has its own");
    if (spec == "byte") return tokenizer_byte();
    if (spec == "bpe")
        throw ConfigError(what + " = 'bpe': quintet's bpe is trained by `quintet prepare --tokenizer bpe` and "
                                 "read from its token file (--data FILE)");
    if (tiktoken) {
        std::string pattern = s.pattern, specials = s.specials;
        if (pattern.empty()) {  // the preset named by the file, as the standard files are named
            const std::string stem = std::filesystem::path(path).stem().string();
            if (!pretokenizer_preset(stem))
                throw ConfigError(what + " = '" + spec + "': which pre-tokenizer pattern? Give --tokenizer-pattern: " +
                                  pretokenizer_preset_names() + ", or a regular expression");
            pattern = stem;
        }
        if (specials.empty()) specials = pretokenizer_preset(pattern) ? pattern : "none";
        const std::vector<SpecialToken> list = tiktoken_specials(specials, "--tokenizer-specials");
        return tokenizer_tiktoken(read_file(what, spec, path), pattern, list, "tiktoken file '" + path + "'");
    }
    if (kind == "hf" && colon != std::string::npos)
        return tokenizer_hf_json(read_file(what, spec, path), "tokenizer.json '" + path + "'");
    if (kind == "spm" && colon != std::string::npos)
        return tokenizer_sentencepiece(read_file(what, spec, path), "SentencePiece file '" + path + "'");
    throw ConfigError(what + " = '" + spec + "': not a tokenizer; valid: " + tokenizer_spec_help());
}

Tokenizer tokenizer_from_state(const TokenizerState& st, const std::string& origin) {
    if (st.kind == "byte") return tokenizer_byte();
    if (st.kind == "bpe") return tokenizer_bpe(st.merges, !st.specials.empty(), st.pattern, origin);
    if (st.kind == "tiktoken") return tokenizer_tiktoken(st.file, st.pattern, st.specials, origin);
    if (st.kind == "hf") return tokenizer_hf_json(st.file, origin);
    if (st.kind == "spm") return tokenizer_sentencepiece(st.file, origin);
    throw ConfigError(origin + ": tokenizer kind '" + st.kind + "'; valid: byte, bpe, tiktoken, hf, spm");
}

}  // namespace quintet
