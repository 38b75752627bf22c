// safetensors, written and read from its specification: an 8-byte little-endian header length
// N, N bytes of JSON ({"__metadata__": {...}, "<name>": {"dtype", "shape", "data_offsets":
// [begin, end]}} with offsets into the data that follows, padded with spaces to 8 bytes), then
// the tensors' bytes, little-endian, row-major. Sharded models: model-0000i-of-0000n.safetensors
// with model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map": {name: file}}).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "quintet/interop/weights.hpp"

namespace quintet {

// Writes `tensors` into `dir` as model.safetensors, or as shards of at most `max_shard_bytes`
// each (a tensor is never split) plus the index. dtype: f32 | bf16 | f16. Each file through a
// .tmp and renamed. Returns the names of the files written.
std::vector<std::string> safetensors_write(const std::string& dir, const std::vector<NamedTensor>& tensors,
                                           const std::string& dtype, uint64_t max_shard_bytes);

// Every tensor of a Hugging Face directory (model.safetensors, or the shards its index names),
// converted to float32 (F32, BF16 and F16 are read), with the dtype it had. ConfigError naming
// the file and the problem (missing shard, malformed header, offsets outside the file).
struct LoadedTensor {
    NamedTensor t;
    std::string dtype;  // as stored: F32, BF16, F16
};
std::vector<LoadedTensor> safetensors_read_dir(const std::string& dir);

}  // namespace quintet
