#include "quintet/interop/safetensors.hpp"

#include <cerrno>
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

void read_file(const std::string& path, std::vector<LoadedTensor>& out) {
    const std::string b = read_all(path, "safetensors file");
    if (b.size() < 8) throw ConfigError("import: '" + path + "' is too short for a safetensors file");
    uint64_t n;
    std::memcpy(&n, b.data(), 8);
    if (n > b.size() - 8) throw ConfigError("import: '" + path + "': the header length " + std::to_string(n) +
                                            " runs past the end of the file (truncated?)");
    json header;
    try {
        header = json::parse(b.substr(8, n));
    } catch (const std::exception& e) {
        throw ConfigError("import: '" + path + "': the header is not JSON: " + e.what());
    }
    const size_t data0 = 8 + n, data_size = b.size() - data0;
    for (auto& [name, info] : header.items()) {
        if (name == "__metadata__") continue;
        const std::string dt = info.value("dtype", "");
        const size_t el = dt == "F32" ? 4 : (dt == "BF16" || dt == "F16") ? 2 : 0;
        if (el == 0) throw ConfigError("import: '" + path + "': tensor " + name + " has dtype " + dt +
                                       " (F32, BF16 and F16 are read)");
        const auto shape = info.at("shape").get<std::vector<int64_t>>();
        const auto off = info.at("data_offsets").get<std::vector<uint64_t>>();
        if (shape.empty() || shape.size() > 2)
            throw ConfigError("import: '" + path + "': tensor " + name + " has " + std::to_string(shape.size()) +
                              " dimensions (1 or 2 are read)");
        LoadedTensor lt;
        lt.dtype = dt;
        lt.t.name = name;
        lt.t.ndim = int(shape.size());
        lt.t.rows = int(shape[0]);
        lt.t.cols = shape.size() == 2 ? int(shape[1]) : 1;
        const size_t count = size_t(lt.t.rows) * size_t(lt.t.cols);
        if (off.size() != 2 || off[1] < off[0] || off[1] > data_size || off[1] - off[0] != count * el)
            throw ConfigError("import: '" + path + "': tensor " + name + ": data_offsets do not fit its shape or the file");
        lt.t.data.resize(count);
        const char* p = b.data() + data0 + off[0];
        for (size_t i = 0; i < count; ++i) {
            uint16_t h;
            if (el == 4) {
                std::memcpy(&lt.t.data[i], p + 4 * i, 4);
                continue;
            }
            std::memcpy(&h, p + 2 * i, 2);
            lt.t.data[i] = dt == "BF16" ? bf16_to_float(h) : f16_to_float(h);
        }
        out.push_back(std::move(lt));
    }
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

std::vector<LoadedTensor> safetensors_read_dir(const std::string& dir) {
    std::vector<LoadedTensor> out;
    const fs::path index = fs::path(dir) / "model.safetensors.index.json";
    if (fs::exists(index)) {
        json j;
        try {
            j = json::parse(read_all(index.string(), "index"));
        } catch (const json::exception& e) {
            throw ConfigError("import: '" + index.string() + "' is not JSON: " + e.what());
        }
        std::map<std::string, int> files;  // sorted, each once
        for (auto& [name, file] : j.at("weight_map").items()) files[file.get<std::string>()] = 0;
        for (const auto& [file, unused] : files) {
            const fs::path p = fs::path(dir) / file;
            if (!fs::exists(p))
                throw ConfigError("import: shard '" + p.string() + "', named by " + index.string() + ", is missing");
            read_file(p.string(), out);
        }
        return out;
    }
    const fs::path single = fs::path(dir) / "model.safetensors";
    if (!fs::exists(single))
        throw ConfigError("import: --input '" + dir + "' has neither model.safetensors nor model.safetensors.index.json");
    read_file(single.string(), out);
    return out;
}

}  // namespace quintet
