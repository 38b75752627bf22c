// SentencePiece through its library (sentencepiece.hpp): the processor is loaded from the model's
// bytes and called as is; quintet only adapts ids (int <-> uint32) and names the special pieces.
#include "quintet/tokenizer/sentencepiece.hpp"

#include <sentencepiece_processor.h>

#include <cstring>
#include <memory>
#include <string_view>

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

namespace quintet {
namespace {

// A protobuf message's wire format: a sequence of (field number << 3 | wire type, value), with
// wire types 0 varint, 1 fixed 64 bits, 2 length-delimited, 5 fixed 32 bits.
class ProtoReader {
public:
    ProtoReader(std::string_view bytes, const std::string& origin) : b_(bytes), origin_(origin) {}
    bool done() const { return at_ >= b_.size(); }
    // The next field: its number and wire type; value() / bytes() / fixed32() then read it.
    std::pair<uint32_t, uint32_t> next() {
        const uint64_t key = varint();
        return {uint32_t(key >> 3), uint32_t(key & 7)};
    }
    uint64_t varint() {
        uint64_t v = 0;
        for (int shift = 0; shift < 64; shift += 7) {
            if (at_ >= b_.size()) bad();
            const uint8_t c = uint8_t(b_[at_++]);
            v |= uint64_t(c & 0x7f) << shift;
            if (!(c & 0x80)) return v;
        }
        bad();
    }
    std::string_view bytes() {
        const uint64_t n = varint();
        if (n > b_.size() - at_) bad();
        const std::string_view s = b_.substr(at_, n);
        at_ += n;
        return s;
    }
    float fixed32() {
        if (b_.size() - at_ < 4) bad();
        uint32_t u = 0;
        for (int i = 0; i < 4; ++i) u |= uint32_t(uint8_t(b_[at_ + i])) << (8 * i);
        at_ += 4;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
    void skip(uint32_t wire) {
        if (wire == 0) varint();
        else if (wire == 1) skip_n(8);
        else if (wire == 2) bytes();
        else if (wire == 5) skip_n(4);
        else bad();
    }

private:
    void skip_n(size_t n) {
        if (b_.size() - at_ < n) bad();
        at_ += n;
    }
    [[noreturn]] void bad() const {
        throw ConfigError(origin_ + ": not a SentencePiece model (its protobuf message is cut or malformed at byte " +
                          std::to_string(at_) + ")");
    }
    std::string_view b_;
    size_t at_ = 0;
    const std::string& origin_;
};

}  // namespace

SentencePieceModelInfo sentencepiece_model_info(const std::string& model_bytes, const std::string& origin) {
    SentencePieceModelInfo info;
    ProtoReader top(model_bytes, origin);
    while (!top.done()) {
        const auto [field, wire] = top.next();
        if (wire != 2 || (field != 1 && field != 2 && field != 3)) {
            top.skip(wire);
            continue;
        }
        ProtoReader msg(top.bytes(), origin);
        if (field == 1) {  // SentencePiece: 1 piece, 2 score, 3 type
            SentencePieceModelInfo::Piece p;
            while (!msg.done()) {
                const auto [f, w] = msg.next();
                if (f == 1 && w == 2) p.text = std::string(msg.bytes());
                else if (f == 2 && w == 5) p.score = msg.fixed32();
                else if (f == 3 && w == 0) p.type = int(msg.varint());
                else msg.skip(w);
            }
            info.pieces.push_back(std::move(p));
        } else if (field == 2) {  // TrainerSpec: 3 model_type, 35 byte_fallback, 40-43 special ids
            while (!msg.done()) {
                const auto [f, w] = msg.next();
                if (w != 0) {
                    msg.skip(w);
                    continue;
                }
                const uint64_t v = msg.varint();
                if (f == 3) info.model_type = int(v);
                else if (f == 35) info.byte_fallback = v != 0;
                else if (f == 40) info.unk_id = int32_t(uint32_t(v));
                else if (f == 41) info.bos_id = int32_t(uint32_t(v));
                else if (f == 42) info.eos_id = int32_t(uint32_t(v));
                else if (f == 43) info.pad_id = int32_t(uint32_t(v));
            }
        } else {  // NormalizerSpec: 1 name, 2 precompiled_charsmap, 3 add_dummy_prefix,
                  // 4 remove_extra_whitespaces, 5 escape_whitespaces
            while (!msg.done()) {
                const auto [f, w] = msg.next();
                if (f == 1 && w == 2) info.normalizer = std::string(msg.bytes());
                else if (f == 2 && w == 2) info.precompiled_charsmap = std::string(msg.bytes());
                else if (f == 3 && w == 0) info.add_dummy_prefix = msg.varint() != 0;
                else if (f == 4 && w == 0) info.remove_extra_whitespaces = msg.varint() != 0;
                else if (f == 5 && w == 0) info.escape_whitespaces = msg.varint() != 0;
                else msg.skip(w);
            }
        }
    }
    if (info.pieces.empty()) throw ConfigError(origin + ": not a SentencePiece model (no pieces)");
    return info;
}

}  // namespace quintet
