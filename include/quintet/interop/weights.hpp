// A checkpoint's model as the export formats see it: its configuration, RoPE, trained context,
// tokenizer and every parameter whole (Hugging Face name, [out, in], float32), plus the pieces
// the formats share: the RoPE row permutation, float16/bfloat16 conversion and outputs written
// to a temporary name and renamed only when complete. The mappings: docs/interop.md.
// Not a loader for training (io/checkpoint.hpp is): one process, the whole model in memory.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "quintet/deck/deck.hpp"
#include "quintet/model/config.hpp"
#include "quintet/tokenizer/byte_alphabet.hpp"  // byte_level_text, for the exporters
#include "quintet/tokenizer/tokenizer.hpp"

namespace quintet {

struct NamedTensor {
    std::string name;        // Hugging Face name, e.g. model.layers.0.self_attn.q_proj.weight
    int rows = 0, cols = 1;  // [out, in]; vectors: [n, 1]
    int ndim = 2;            // 1 for vectors (norm weights, the MoE correction bias)
    std::vector<float> data;  // rows * cols, row-major
};

struct ExportModel {
    Deck deck;               // the checkpoint's resolved deck (model, rope; vocab_size set)
    int trained_context = 0; // the longest sequence the weights were trained at
    Tokenizer tokenizer;
    std::vector<NamedTensor> tensors;  // in checkpoint order
    const NamedTensor* find(const std::string& name) const;  // nullptr when absent
    const NamedTensor& at(const std::string& name) const;    // ConfigError naming it when absent
    // YaRN's original context: rope.original_max_position, else the trained context.
    int rope_original_context() const;
};

// Reads every parameter of the checkpoint at `path` (verified against its checksums first) with
// `tok` as its tokenizer. ConfigError (exit 2) when the file is not a usable checkpoint.
ExportModel export_model_read(const std::string& path, const Tokenizer& tok);

// µP's forward multipliers (ModelConfig::logit_mult, attn_mult) folded into the weights -- the LM
// head scaled (a tied one untied first), every query projection scaled -- so that the exported
// model is a plain one that computes the same function (export_model_read does it).
void fold_forward_multipliers(ExportModel& m);

// Rows [row0, row0 + d) of a [rows, cols] matrix hold one head's rotary part in quintet's
// rotate-half order (pair i = rows i and i + d/2). Reorders them in place to the interleaved
// order (pair i = rows 2i and 2i + 1) that llama.cpp's rotation and Hugging Face DeepSeek use;
// `inverse` undoes it.
void rope_rows_interleave(NamedTensor& t, int row0, int d, bool inverse = false);



// IEEE half precision, round to nearest even (overflow to infinity); and back.
uint16_t float_to_f16(float f);
float f16_to_float(uint16_t h);

// The element type of an exported tensor: "f32", "f16" or "bf16".
size_t dtype_bytes(const std::string& dtype);
// Appends `n` floats converted to `dtype`, little-endian.
void dtype_append(std::string& out, const float* x, size_t n, const std::string& dtype);

// Writes `path` through `write(tmp)` into a fresh "<path>.tmp-XXXXXX" and renames it when write
// returns; on an exception that temporary is removed and the exception passes on, so `path` is
// never half-written. Where `path` may go: interop/output_path.hpp.
void write_atomically(const std::string& path, const std::function<void(const std::string& tmp)>& write);

}  // namespace quintet
