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

// Every tensor of a Hugging Face directory (model.safetensors, or the shards its index names) as
// its header describes it, the data not read: name, dtype (F32, BF16, F16), shape and where its
// bytes lie. ConfigError naming the file and the tensor for a missing shard, a malformed header,
// another dtype, offsets that do not fit the shape or the file, two tensors whose bytes overlap,
// or a tensor in two files.
struct SafetensorsEntry {
    std::string name, dtype, file;
    int rows = 0, cols = 1, ndim = 2;  // [out, in]; vectors: [n, 1], ndim 1
    uint64_t begin = 0, end = 0;       // byte range in `file`
};
std::vector<SafetensorsEntry> safetensors_index(const std::string& dir);
// One tensor's values as float32; ConfigError naming the tensor and the element when one is NaN
// or infinite.
NamedTensor safetensors_load(const SafetensorsEntry& e);

}  // namespace quintet
