#include "quintet/interop/safetensors.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "quintet/core/bf16.hpp"
#include "quintet/core/error.hpp"

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace quintet {

namespace {

std::string st_dtype(const std::string& dtype) { return dtype == "f32" ? "F32" : dtype == "bf16" ? "BF16" : "F16"; }

void write_bytes(const std::string& path, const std::string& a, const std::string& b = "") {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) throw ConfigError("export: cannot create '" + path + "': " + std::strerror(errno));
    bool ok = std::fwrite(a.data(), 1, a.size(), f) == a.size() && std::fwrite(b.data(), 1, b.size(), f) == b.size();
    ok = std::fclose(f) == 0 && ok;
    if (!ok) throw RankError("export: writing '" + path + "' failed: " + std::strerror(errno));
}

// One safetensors file of `tensors` [first, last).
void write_file(const std::string& path, const std::vector<NamedTensor>& tensors, size_t first, size_t last,
                const std::string& dtype) {
    json header = json::object();
    header["__metadata__"] = {{"format", "pt"}};
    std::string data;
    for (size_t i = first; i < last; ++i) {
        const NamedTensor& t = tensors[i];
        const size_t begin = data.size();
        dtype_append(data, t.data.data(), t.data.size(), dtype);
        json shape = t.ndim == 1 ? json::array({t.rows}) : json::array({t.rows, t.cols});
        header[t.name] = {{"dtype", st_dtype(dtype)}, {"shape", shape}, {"data_offsets", {begin, data.size()}}};
    }
    std::string h = header.dump();
    h.resize((h.size() + 7) / 8 * 8, ' ');
    std::string head(8, '\0');
    const uint64_t n = h.size();
    std::memcpy(head.data(), &n, 8);
    write_atomically(path, [&](const std::string& tmp) { write_bytes(tmp, head + h, data); });
}

std::string read_all(const std::string& path, const std::string& what) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw ConfigError("import: " + what + " '" + path + "' is missing or unreadable");
    return std::string(std::istreambuf_iterator<char>(in), {});
}

// The header of one safetensors file: every tensor's name, dtype, shape and where its bytes lie,
// checked against the file's size and against each other. The data is not read.
void index_file(const std::string& path, std::vector<SafetensorsEntry>& out) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw ConfigError("import: safetensors file '" + path + "' is missing or unreadable");
    std::error_code ec;
    const uint64_t size = fs::file_size(path, ec);
    uint64_t n = 0;
    if (ec || size < 8 || !in.read(reinterpret_cast<char*>(&n), 8))
        throw ConfigError("import: '" + path + "' is too short for a safetensors file");
    if (n > size - 8) throw ConfigError("import: '" + path + "': the header length " + std::to_string(n) +
                                        " runs past the end of the file (truncated?)");
    std::string text(size_t(n), '\0');
    in.read(text.data(), std::streamsize(n));
    json header;
    try {
        header = json::parse(text);
    } catch (const std::exception& e) {
        throw ConfigError("import: '" + path + "': the header is not JSON: " + e.what());
    }
    if (!header.is_object()) throw ConfigError("import: '" + path + "': the header is not a JSON object");
    const uint64_t data0 = 8 + n, data_size = size - data0;
    const size_t first = out.size();
    for (auto& [name, info] : header.items()) {
        if (name == "__metadata__") continue;
        const std::string where = "import: '" + path + "': tensor " + name;
        if (!info.is_object() || !info.contains("dtype") || !info["dtype"].is_string() || !info.contains("shape") ||
            !info["shape"].is_array() || !info.contains("data_offsets") || !info["data_offsets"].is_array())
            throw ConfigError(where + ": needs a dtype string, a shape list and data_offsets");
        const std::string dt = info["dtype"].get<std::string>();
        const uint64_t el = dt == "F32" ? 4 : (dt == "BF16" || dt == "F16") ? 2 : 0;
        if (el == 0) throw ConfigError(where + " has dtype " + dt + " (F32, BF16 and F16 are read)");
        const json& shape = info["shape"];
        const json& off = info["data_offsets"];
        if (shape.empty() || shape.size() > 2)
            throw ConfigError(where + " has " + std::to_string(shape.size()) + " dimensions (1 or 2 are read)");
        uint64_t count = 1;
        std::vector<int> dims;
        for (const json& d : shape) {
            if (!d.is_number_unsigned() || d.get<uint64_t>() < 1 || d.get<uint64_t>() > uint64_t(INT32_MAX))
                throw ConfigError(where + ": shape " + shape.dump() + " is not a list of integers in [1, 2^31 - 1]");
            dims.push_back(int(d.get<uint64_t>()));
            count *= d.get<uint64_t>();  // at most 2^62: no overflow
        }
        if (off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
            throw ConfigError(where + ": data_offsets " + off.dump() + " is not [begin, end]");
        const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
        if (e < b || e > data_size || count > data_size / el || e - b != count * el)
            throw ConfigError(where + ": data_offsets " + off.dump() + " do not fit its shape " + shape.dump() + " (" +
                              dt + ") or the file's " + std::to_string(data_size) + " bytes of data");
        SafetensorsEntry t;
        t.name = name, t.dtype = dt, t.file = path;
        t.ndim = int(dims.size()), t.rows = dims[0], t.cols = dims.size() == 2 ? dims[1] : 1;
        t.begin = data0 + b, t.end = data0 + e;
        out.push_back(std::move(t));
    }
    // Each tensor's bytes its own: overlapping ranges would make two tensors share values.
    std::vector<const SafetensorsEntry*> by_offset;
    for (size_t i = first; i < out.size(); ++i) by_offset.push_back(&out[i]);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const SafetensorsEntry* a, const SafetensorsEntry* b) { return a->begin < b->begin; });
    for (size_t i = 1; i < by_offset.size(); ++i)
        if (by_offset[i]->begin < by_offset[i - 1]->end)
            throw ConfigError("import: '" + path + "': tensor " + by_offset[i]->name + " overlaps tensor " +
                              by_offset[i - 1]->name + " (data_offsets [" + std::to_string(by_offset[i]->begin - data0) +
                              ", " + std::to_string(by_offset[i]->end - data0) + ") and [" +
                              std::to_string(by_offset[i - 1]->begin - data0) + ", " +
                              std::to_string(by_offset[i - 1]->end - data0) + "))");
}

}  // namespace

std::vector<std::string> safetensors_write(const std::string& dir, const std::vector<NamedTensor>& tensors,
                                           const std::string& dtype, uint64_t max_shard_bytes) {
    const size_t el = dtype_bytes(dtype);
    std::vector<size_t> cuts = {0};  // shard k holds tensors [cuts[k], cuts[k+1])
    uint64_t in_shard = 0, total = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
        const uint64_t bytes = tensors[i].data.size() * el;
        if (in_shard > 0 && in_shard + bytes > max_shard_bytes) {
            cuts.push_back(i);
            in_shard = 0;
        }
        in_shard += bytes;
        total += bytes;
    }
    cuts.push_back(tensors.size());
    const size_t shards = cuts.size() - 1;
    std::vector<std::string> files;
    if (shards == 1) {
        write_file(dir + "/model.safetensors", tensors, 0, tensors.size(), dtype);
        return {"model.safetensors"};
    }
    json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = json::object();
    for (size_t k = 0; k < shards; ++k) {
        char name[64];
        std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, shards);
        write_file(dir + "/" + name, tensors, cuts[k], cuts[k + 1], dtype);
        for (size_t i = cuts[k]; i < cuts[k + 1]; ++i) index["weight_map"][tensors[i].name] = name;
        files.push_back(name);
    }
    const std::string text = index.dump(2) + "\n";
    write_atomically(dir + "/model.safetensors.index.json", [&](const std::string& tmp) { write_bytes(tmp, text); });
    files.push_back("model.safetensors.index.json");
    return files;
}

std::vector<SafetensorsEntry> safetensors_index(const std::string& dir) {
    std::vector<SafetensorsEntry> out;
    const fs::path index = fs::path(dir) / "model.safetensors.index.json";
    if (fs::exists(index)) {
        json j;
        try {
            j = json::parse(read_all(index.string(), "index"));
        } catch (const json::exception& e) {
            throw ConfigError("import: '" + index.string() + "' is not JSON: " + e.what());
        }
        if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
            throw ConfigError("import: '" + index.string() + "' has no weight_map object");
        std::map<std::string, int> files;  // sorted, each once
        for (auto& [name, file] : j["weight_map"].items()) {
            if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
                throw ConfigError("import: '" + index.string() + "': tensor " + name + " maps to " + file.dump() +
                                  ", not a file name in the directory");
            files[file.get<std::string>()] = 0;
        }
        for (const auto& [file, unused] : files) {
            const fs::path p = fs::path(dir) / file;
            if (!fs::exists(p))
                throw ConfigError("import: shard '" + p.string() + "', named by " + index.string() + ", is missing");
            index_file(p.string(), out);
        }
    } else {
        const fs::path single = fs::path(dir) / "model.safetensors";
        if (!fs::exists(single))
            throw ConfigError("import: --input '" + dir + "' has neither model.safetensors nor model.safetensors.index.json");
        index_file(single.string(), out);
    }
    std::map<std::string, const SafetensorsEntry*> seen;
    for (const SafetensorsEntry& e : out)
        if (const auto [it, fresh] = seen.emplace(e.name, &e); !fresh)
            throw ConfigError("import: tensor " + e.name + " is in both '" + it->second->file + "' and '" + e.file + "'");
    return out;
}

NamedTensor safetensors_load(const SafetensorsEntry& e) {
    std::ifstream in(e.file, std::ios::binary);
    std::string bytes(size_t(e.end - e.begin), '\0');
    if (!in || !in.seekg(std::streamoff(e.begin)) || !in.read(bytes.data(), std::streamsize(bytes.size())))
        throw ConfigError("import: '" + e.file + "': tensor " + e.name + " cannot be read (truncated?)");
    NamedTensor t;
    t.name = e.name, t.rows = e.rows, t.cols = e.cols, t.ndim = e.ndim;
    const size_t count = size_t(e.rows) * size_t(e.cols);
    t.data.resize(count);
    const char* p = bytes.data();
    for (size_t i = 0; i < count; ++i) {
        if (e.dtype == "F32") {
            std::memcpy(&t.data[i], p + 4 * i, 4);
        } else {
            uint16_t h;
            std::memcpy(&h, p + 2 * i, 2);
            t.data[i] = e.dtype == "BF16" ? bf16_to_float(h) : f16_to_float(h);
        }
        if (!std::isfinite(t.data[i])) {
            const size_t row = i / size_t(e.cols), col = i % size_t(e.cols);
            throw ConfigError("import: '" + e.file + "': tensor " + e.name + " holds " +
                              (std::isnan(t.data[i]) ? "NaN" : "an infinity") + " (element [" + std::to_string(row) +
                              (e.ndim == 2 ? ", " + std::to_string(col) : std::string()) +
                              "]): a model with non-finite weights cannot be trained or evaluated");
        }
    }
    return t;
}

}  // namespace quintet
