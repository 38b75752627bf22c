// Hugging Face directories: export (safetensors, config.json, generation_config.json, the
// tokenizer) and import (a Llama or DeepSeek-V2/V3 directory to a step-0 checkpoint that
// checkpoint.init_from accepts). Mappings and what is refused: docs/interop.md.
#pragma once
#include <cstdint>
#include <string>

#include "quintet/interop/weights.hpp"

namespace quintet {

// "" when `m` can be written as a Hugging Face directory, else why not.
std::string hf_unsupported(const ExportModel& m);

// Writes the directory `dir` (built as dir.tmp and renamed when complete; an existing `dir` is
// replaced only when `force`). dtype f32 | bf16. Safetensors shards of at most max_shard_bytes.
void hf_export(const ExportModel& m, const std::string& dir, const std::string& dtype, uint64_t max_shard_bytes,
               bool force);

// Reads the directory and writes `output` (a step-0 checkpoint with its deck and tokenizer,
// through output.tmp). ConfigError (exit 2) naming the config key, tensor or file for what is
// unsupported or inconsistent, before anything is written. One process (MPI initialised).
void hf_import(const std::string& dir, const std::string& output);

}  // namespace quintet
