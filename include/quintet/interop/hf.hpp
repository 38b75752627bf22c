// Hugging Face directories: export (safetensors, config.json, generation_config.json, the
// tokenizer) and import (a Llama or DeepSeek-V2/V3 directory to a step-0 checkpoint that
// checkpoint.init_from accepts). Mappings and what is refused: docs/interop.md.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

#include "quintet/interop/output_path.hpp"
#include "quintet/interop/weights.hpp"

namespace quintet {

// "" when `m` can be written as a Hugging Face directory, else why not.
std::string hf_unsupported(const ExportModel& m);

// "" when the directory `dir` is a Hugging Face export of quintet's (only the files an export
// writes, and quintet's own tokenizer_config.json or generation_config.json), else why not: the
// only directories `export --force` replaces.
std::string hf_export_recognise(const std::filesystem::path& dir);

// Writes the directory `out` (checked by output_check with hf_export_recognise), built in a
// temporary sibling and put in its place when complete (interop/output_path.hpp). dtype f32 |
// bf16. Safetensors shards of at most max_shard_bytes.
void hf_export(const ExportModel& m, const OutputTarget& out, const std::string& dtype, uint64_t max_shard_bytes);

// "" when the file is an earlier output of import (a quintet checkpoint at step 0 outside a run's
// checkpoints folder), else why not: the only files `import --force` replaces.
std::string import_output_recognise(const std::filesystem::path& file);

// Reads the directory and writes `output` (a step-0 checkpoint with its deck and tokenizer,
// built in a temporary sibling folder and renamed into place; checked first by output_check with
// import_output_recognise). ConfigError (exit 2) naming the config key, tensor or file for what
// is unsupported or inconsistent, before anything is written. One process (MPI initialised).
void hf_import(const std::string& dir, const std::string& output);

}  // namespace quintet
