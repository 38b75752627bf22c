// GGUF export: one file that llama.cpp (and the tools built on it) loads and runs, tokenizer
// included. model.attention = mha -> architecture `llama`; mla -> `deepseek2` (with or without
// MoE). Written from the GGUF specification (version 3: a key/value header, tensor infos, data
// aligned to 32 bytes, little-endian). Names, permutations and metadata keys: docs/interop.md.
#pragma once
#include <filesystem>
#include <string>

#include "quintet/interop/weights.hpp"

namespace quintet {

// "" when `m` can be written as GGUF, else what stands in the way (a ConfigError's text: the
// deck key or tokenizer, its value and what GGUF export accepts).
std::string gguf_unsupported(const ExportModel& m);

// "" when `file` is a GGUF file quintet wrote (general.name = quintet), else why not: the only
// files `export --format gguf --force` replaces.
std::string gguf_export_recognise(const std::filesystem::path& file);

// Writes `m` to `path` (through a fresh path.tmp-XXXXXX, renamed when complete); dtype f32 | f16 | bf16 for
// matrices (vectors stay f32). ConfigError before anything is written when gguf_unsupported.
void gguf_export(const ExportModel& m, const std::string& path, const std::string& dtype);

}  // namespace quintet
