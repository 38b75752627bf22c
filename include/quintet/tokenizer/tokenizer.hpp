// Tokenizers: text <-> token ids, and the stored form that travels with token files and
// checkpoints (docs/tokenizers.md). One file per format, each making a Tokenizer:
//   byte, bpe   byte_bpe.hpp       one token per byte; quintet's own byte-level BPE
//   tiktoken    tiktoken.hpp       a .tiktoken rank file and a pre-tokenizer pattern
//   hf          hf_json.hpp        a Hugging Face tokenizer.json with a byte-level BPE model
//   spm         sentencepiece.hpp  a SentencePiece model, through the SentencePiece library
// tokenizer_spec.hpp makes one from a SPEC ("tiktoken:FILE", ...) or from its stored form.
// Needs only core/ and its libraries (PCRE2, SentencePiece, nlohmann-json): no MPI, no HDF5.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace quintet {

// A token that stands for a control string (end of text, begin of text, chat markers) rather
// than for bytes of the text: `text` is what it decodes to and, when specials are asked for,
// what is matched in the input.
struct SpecialToken {
    std::string text;
    uint32_t id = 0;
    bool operator==(const SpecialToken&) const = default;
};

// Everything a tokenizer is made from, stored in token files and checkpoints
// (io/tokenizer_store.hpp) so that it can be rebuilt bit for bit without the original files.
struct TokenizerState {
    std::string kind;     // byte | bpe | tiktoken | hf | spm; "" = none (a checkpoint from before)
    std::string pattern;  // bpe, tiktoken: the pre-tokenizer regex; bpe "": the format-1 split
    std::vector<std::pair<uint32_t, uint32_t>> merges;  // bpe: merge i makes token 256 + i
    std::string file;     // tiktoken: the .tiktoken text; hf: tokenizer.json; spm: the .model
    std::vector<SpecialToken> specials;  // bpe, tiktoken (hf and spm keep theirs in `file`)
    bool empty() const { return kind.empty(); }
    bool operator==(const TokenizerState&) const = default;
};

// One format's encoder and decoder. encode_ordinary is called from several threads at once.
class TokenizerModel {
public:
    virtual ~TokenizerModel() = default;
    // Appends the ids of text[begin, end); special-token text is ordinary text here. The
    // pre-tokenizer sees all of `text` (a part cut by tokenizer_cut encodes as in the whole).
    virtual void encode_ordinary(std::string_view text, size_t begin, size_t end,
                                 std::vector<uint32_t>& out) const = 0;
    // Appends what `ids` decode to; ids are < vocab_size (checked by the caller). A format whose
    // decoding is not the concatenation of its tokens' bytes (spm) overrides it.
    virtual void decode(const uint32_t* ids, size_t n, std::string& out) const;
    // Appends the bytes that token `id` stands for; false when `id` is no token (a gap in the
    // ranks of a .tiktoken file).
    virtual bool token_bytes(uint32_t id, std::string& out) const = 0;
    // Whether a text may be cut where a line starts with an ASCII letter ("\nA") and the pieces
    // encoded apart with the same result (docs/tokenizers.md, "Threads and ranks").
    virtual bool cuts_at_line_starts() const { return false; }
};

class Tokenizer {
public:
    Tokenizer();  // the byte tokenizer
    // vocab_size: one past the largest id; description: for messages ("tiktoken ...").
    Tokenizer(std::shared_ptr<const TokenizerModel> model, TokenizerState state, int vocab_size,
              std::vector<SpecialToken> specials, std::string description);

    const std::string& kind() const;
    int vocab_size() const;
    const TokenizerState& state() const;
    const std::vector<SpecialToken>& specials() const;
    int special_id(std::string_view text) const;  // -1 when `text` is no special token
    const std::string& describe() const;
    uint64_t fingerprint() const;  // of state(): equal tokenizers, equal fingerprints

    // Ordinary text: special-token text ("<|endoftext|>") is encoded like any other text.
    std::vector<uint32_t> encode(std::string_view text) const;
    void encode(std::string_view text, std::vector<uint32_t>& out) const;  // appends
    // text[begin, end) as a part of `text` (the pattern sees all of it): for parts cut by
    // tokenizer_cut, the same ids as in the whole. Appends.
    void encode_range(std::string_view text, size_t begin, size_t end, std::vector<uint32_t>& out) const;
    // Special-token text becomes the special token's id; the text between as encode().
    void encode_with_specials(std::string_view text, std::vector<uint32_t>& out) const;
    // The same ids as encode / encode_with_specials, on all OpenMP threads: the text is cut at
    // line starts where the format allows (else encoded whole). progress(done, total bytes).
    std::vector<uint32_t> encode_parallel(std::string_view text, bool specials,
                                          const std::function<void(size_t, size_t)>& progress = {}) const;
    // Exact inverse of encode for byte-level formats; throws ConfigError on an id that is no token.
    std::string decode(const uint32_t* ids, size_t n) const;
    std::string token_bytes(uint32_t id) const;
    bool cuts_at_line_starts() const;  // TokenizerModel::cuts_at_line_starts

private:
    struct Impl;
    std::shared_ptr<const Impl> impl_;
};

// The parts of `text` that encode_parallel encodes apart: cut before each line that starts
// with an ASCII letter, about every `target` bytes. Empty when the format cannot be cut.
std::vector<std::string_view> tokenizer_cut(const Tokenizer& tok, std::string_view text, size_t target);

}  // namespace quintet
