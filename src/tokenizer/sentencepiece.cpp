// SentencePiece through its library (sentencepiece.hpp): the processor is loaded from the model's
// bytes and called as is; quintet only adapts ids (int <-> uint32) and names the special pieces.
#include "quintet/tokenizer/sentencepiece.hpp"

#include <sentencepiece_processor.h>

#include <memory>

#include "quintet/core/error.hpp"

namespace quintet {
namespace {

class SpmModel final : public TokenizerModel {
public:
    sentencepiece::SentencePieceProcessor sp;

    void encode_ordinary(std::string_view text, size_t begin, size_t end, std::vector<uint32_t>& out) const override {
        thread_local std::vector<int> ids;
        ids.clear();
        const auto status = sp.Encode(text.substr(begin, end - begin), &ids);
        if (!status.ok()) throw ConfigError(std::string("SentencePiece could not encode the text: ") + status.ToString());
        out.insert(out.end(), ids.begin(), ids.end());
    }
    void decode(const uint32_t* ids, size_t n, std::string& out) const override {
        std::vector<int> v(ids, ids + n);
        std::string text;
        const auto status = sp.Decode(v, &text);
        if (!status.ok()) throw ConfigError(std::string("SentencePiece could not decode the ids: ") + status.ToString());
        out += text;
    }
    // A piece as text: "▁" is a space, a byte piece <0xNN> its byte, a control piece its name.
    bool token_bytes(uint32_t id, std::string& out) const override {
        if (id >= uint32_t(sp.GetPieceSize())) return false;
        const std::string& piece = sp.IdToPiece(int(id));
        if (sp.IsByte(int(id)) && piece.size() == 6) {
            out += char(std::stoi(piece.substr(3, 2), nullptr, 16));
            return true;
        }
        if (sp.IsControl(int(id))) {
            out += piece;
            return true;
        }
        static const std::string kSpace = "\xE2\x96\x81";  // U+2581
        for (size_t i = 0; i < piece.size();) {
            if (piece.compare(i, 3, kSpace) == 0) {
                out += ' ';
                i += 3;
            } else {
                out += piece[i++];
            }
        }
        return true;
    }
};

}  // namespace

Tokenizer tokenizer_sentencepiece(const std::string& model_bytes, const std::string& origin) {
    auto model = std::make_shared<SpmModel>();
    const auto status = model->sp.LoadFromSerializedProto(model_bytes);
    if (!status.ok() || model->sp.GetPieceSize() <= 0)
        throw ConfigError(origin + ": not a SentencePiece model (the library says: " +
                          (status.ok() ? std::string("no pieces") : status.ToString()) + ")");
    std::vector<SpecialToken> specials;
    const int n = model->sp.GetPieceSize();
    for (int id = 0; id < n; ++id)
        if (model->sp.IsControl(id)) specials.push_back({model->sp.IdToPiece(id), uint32_t(id)});
    TokenizerState state;
    state.kind = "spm";
    state.file = model_bytes;
    const std::string description = "spm (SentencePiece, " + std::to_string(n) + " pieces, " +
                                    std::to_string(specials.size()) + " control pieces, vocab " + std::to_string(n) + ")";
    return Tokenizer(model, state, n, specials, description);
}

}  // namespace quintet
