#include "quintet/interop/weights.hpp"

#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/core/bf16.hpp"
#include "quintet/core/error.hpp"
#include "quintet/io/checkpoint.hpp"
#include "quintet/model/params.hpp"

namespace fs = std::filesystem;

namespace quintet {

const NamedTensor* ExportModel::find(const std::string& name) const {
    for (const NamedTensor& t : tensors)
        if (t.name == name) return &t;
    return nullptr;
}

const NamedTensor& ExportModel::at(const std::string& name) const {
    if (const NamedTensor* t = find(name)) return *t;
    throw ConfigError("the checkpoint has no tensor " + name);
}

int ExportModel::rope_original_context() const {
    return deck.rope.original_max_position > 0 ? deck.rope.original_max_position : trained_context;
}

ExportModel export_model_read(const std::string& path, const Tokenizer& tok) {
    const CheckpointMeta meta = checkpoint_read_meta(path);
    if (const std::string why = checkpoint_verify(path, MpiCommunicator(MPI_COMM_SELF, "self")); !why.empty())
        throw ConfigError("--checkpoint '" + path + "' is unusable: " + why);
    ExportModel m;
    m.deck = deck_parse_text(meta.deck);
    m.deck.model.vocab_size = tok.vocab_size();
    m.trained_context = meta.trained_context > 0 ? int(meta.trained_context) : m.deck.data.seq_len;
    m.tokenizer = tok;
    if (const int64_t v = checkpoint_vocab_size(path); v >= 0 && v != tok.vocab_size())
        throw ConfigError("--checkpoint '" + path + "': its embedding has " + std::to_string(v) +
                          " rows but its tokenizer (" + tok.describe() + ") has vocabulary " +
                          std::to_string(tok.vocab_size()));
    const ParamTable table = make_param_table(m.deck.model);
    checkpoint_inspect(path, table, /*with_optimizer=*/false);
    std::vector<float> arena(table.total);
    checkpoint_load(path, table, arena.data());
    for (const LogicalTensor& lt : table.logical) {
        const ParamSpec* s = table.find(lt.name);
        QUINTET_CHECK(s != nullptr, "tensor " + lt.name + " is not in the one-rank table");
        NamedTensor t;
        t.name = lt.name;
        t.rows = lt.rows;
        t.cols = lt.cols;
        t.ndim = lt.ndim;
        t.data.assign(arena.begin() + long(s->offset), arena.begin() + long(s->offset + lt.numel()));
        m.tensors.push_back(std::move(t));
    }
    fold_forward_multipliers(m);
    return m;
}

void fold_forward_multipliers(ExportModel& m) {
    ModelConfig& c = m.deck.model;
    auto scale = [](NamedTensor& t, double f) {
        for (float& x : t.data) x = float(double(x) * f);
    };
    if (c.attn_mult != 1.0)  // q . k x scale x mult = (mult q) . k x scale: into every query projection
        for (NamedTensor& t : m.tensors)
            if (t.name.find(".self_attn.q_proj.weight") != std::string::npos ||
                t.name.find(".self_attn.q_b_proj.weight") != std::string::npos)
                scale(t, c.attn_mult);
    if (c.logit_mult != 1.0) {
        if (c.tie_embeddings) {  // the head as a tensor of its own (the embedding keeps its rows)
            NamedTensor head = m.at("model.embed_tokens.weight");
            head.name = "lm_head.weight";
            m.tensors.push_back(std::move(head));
            c.tie_embeddings = false;
        }
        for (NamedTensor& t : m.tensors)
            if (t.name == "lm_head.weight") scale(t, c.logit_mult);
    }
    // What is written is now a plain model: the standard scheme's forward.
    if (m.deck.init.scheme == "mup") {
        m.deck.init.scheme = "scaled";
        m.deck.init.base_width = m.deck.init.base_head_dim = 0;
    }
    c.logit_mult = c.attn_mult = 1.0;
}

void rope_rows_interleave(NamedTensor& t, int row0, int d, bool inverse) {
    QUINTET_CHECK(d % 2 == 0 && row0 >= 0 && row0 + d <= t.rows, "rope rows out of range in " + t.name);
    const size_t C = size_t(t.cols);
    std::vector<float> block(t.data.begin() + long(row0 * C), t.data.begin() + long((row0 + d) * C));
    const int half = d / 2;
    for (int i = 0; i < half; ++i)
        for (int j = 0; j < 2; ++j) {
            const int interleaved = 2 * i + j, rotate_half = j * half + i;
            const int to = inverse ? rotate_half : interleaved, from = inverse ? interleaved : rotate_half;
            std::memcpy(&t.data[(row0 + to) * C], &block[from * C], C * sizeof(float));
        }
}

uint16_t float_to_f16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
    if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65536: infinity
    if (abs < 0x38800000u) {                                  // below 2^-14: subnormal or zero
        // value = abs_float; in units of 2^-24 (the smallest subnormal), rounded to nearest even
        const int e = int(abs >> 23);
        if (e < 102) return uint16_t(sign);  // below half the smallest subnormal
        const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
        const int shift = 126 - e;  // mant * 2^(e-150) / 2^-24 = mant >> (126 - e)
        uint32_t q = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
        return uint16_t(sign | q);
    }
    // normal: rebias the exponent (127 -> 15) and round the 23-bit mantissa to 10 bits
    uint32_t h = ((abs >> 13) - ((127u - 15u) << 10));
    const uint32_t rem = abs & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: fine
    return uint16_t(sign | h);
}

float f16_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    float f;
    if (e == 0) {
        f = std::ldexp(float(m), -24);
        uint32_t u;
        std::memcpy(&u, &f, 4);
        u |= sign;
        std::memcpy(&f, &u, 4);
        return f;
    }
    uint32_t u = e == 31 ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e + 112u) << 23) | (m << 13));
    std::memcpy(&f, &u, 4);
    return f;
}

size_t dtype_bytes(const std::string& dtype) {
    if (dtype == "f32") return 4;
    if (dtype == "f16" || dtype == "bf16") return 2;
    throw ConfigError("dtype '" + dtype + "' is not one of f32, f16, bf16");
}

void dtype_append(std::string& out, const float* x, size_t n, const std::string& dtype) {
    const size_t at = out.size();
    out.resize(at + n * dtype_bytes(dtype));
    char* p = out.data() + at;
    if (dtype == "f32") {
        std::memcpy(p, x, n * 4);  // the hosts quintet builds on are little-endian
    } else if (dtype == "f16") {
        for (size_t i = 0; i < n; ++i) {
            const uint16_t h = float_to_f16(x[i]);
            std::memcpy(p + 2 * i, &h, 2);
        }
    } else {
        for (size_t i = 0; i < n; ++i) {
            const uint16_t b = float_to_bf16(x[i]);
            std::memcpy(p + 2 * i, &b, 2);
        }
    }
}

void write_atomically(const std::string& path, const std::function<void(const std::string& tmp)>& write) {
    // A fresh name beside it, never another file's: a failure removes only what it made.
    std::string tmpl = path + ".tmp-XXXXXX";
    std::vector<char> name(tmpl.begin(), tmpl.end());
    name.push_back('\0');
    const int fd = ::mkstemp(name.data());
    if (fd < 0) throw RankError("cannot create a temporary file beside '" + path + "': " + std::strerror(errno));
    const mode_t mask = ::umask(0);  // mkstemp makes it 0600; the output gets the usual 0666 & ~umask
    ::umask(mask);
    ::fchmod(fd, 0666 & ~mask);
    ::close(fd);
    const std::string tmp = name.data();
    try {
        write(tmp);
        std::error_code ec;
        fs::rename(tmp, path, ec);
        if (ec) throw RankError("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
    } catch (...) {
        std::error_code ec;
        fs::remove(tmp, ec);
        throw;
    }
}

}  // namespace quintet
