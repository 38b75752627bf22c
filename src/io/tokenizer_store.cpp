// The tokenizer group (tokenizer_store.hpp) with the HDF5 C API. The reader trusts nothing: a
// wrong type, shape or kind is a ConfigError naming the file and the dataset.
#include "quintet/io/tokenizer_store.hpp"

#include <charconv>

#include "quintet/core/error.hpp"
#include "quintet/io/h5.hpp"

namespace quintet {
namespace {

void write_bytes(hid_t group, const char* name, const std::string& bytes, bool write_data) {
    const hsize_t n = bytes.size();
    h5::Handle space = h5::space(h5::check(H5Screate_simple(1, &n, nullptr), std::string("dataspace of ") + name));
    h5::Handle ds = h5::dataset(h5::check(
        H5Dcreate2(group, name, H5T_STD_U8LE, space, H5P_DEFAULT, h5::dataset_create_plist(), H5P_DEFAULT),
        std::string("create tokenizer dataset ") + name));
    if (write_data && n > 0)
        h5::check(H5Dwrite(ds, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()),
                  std::string("write tokenizer dataset ") + name);
}

// A 1-D integer dataset of bytes, or "" with found = false.
std::string read_bytes(hid_t group, const char* name, const std::string& where, bool& found) {
    found = H5Lexists(group, name, H5P_DEFAULT) > 0;
    if (!found) return {};
    h5::Handle ds = h5::dataset(H5Dopen2(group, name, H5P_DEFAULT));
    h5::Handle type = h5::type(ds.valid() ? H5Dget_type(ds) : -1);
    if (!ds.valid() || !type.valid() || H5Tget_class(type) != H5T_INTEGER || H5Tget_size(type) != 1)
        throw ConfigError(where + "/" + name + " is not a uint8 dataset (corrupt file?)");
    const std::vector<hsize_t> shape = h5::dataset_shape(ds);
    if (shape.size() != 1) throw ConfigError(where + "/" + name + " is not 1-D (corrupt file?)");
    std::string out(shape[0], '\0');
    if (!out.empty() && H5Dread(ds, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0)
        throw ConfigError(where + "/" + name + " cannot be read (truncated or corrupt file?)");
    return out;
}

std::string read_string(hid_t obj, const char* name, const std::string& where) {
    if (!h5::has_attr(obj, name)) return {};
    h5::Handle a = h5::attr(H5Aopen(obj, name, H5P_DEFAULT));
    h5::Handle t = h5::type(a.valid() ? H5Aget_type(a) : -1);
    if (!t.valid() || H5Tget_class(t) != H5T_STRING)
        throw ConfigError(where + ": attribute " + name + " is not a string (corrupt file?)");
    try {
        return h5::read_attr_string(obj, name);
    } catch (const std::exception&) {
        throw ConfigError(where + ": attribute " + name + " cannot be read (corrupt file?)");
    }
}

}  // namespace

std::string tokenizer_specials_text(const std::vector<SpecialToken>& specials) {
    std::string out;
    for (const auto& s : specials) {
        out += std::to_string(s.id) + ' ';
        for (const char c : s.text) {
            if (c == '\\') out += "\\\\";
            else if (c == '\n') out += "\\n";
            else out += c;
        }
        out += '\n';
    }
    return out;
}

std::vector<SpecialToken> tokenizer_specials_parse(const std::string& text, const std::string& origin) {
    std::vector<SpecialToken> out;
    size_t line = 0;
    for (size_t at = 0; at < text.size();) {
        size_t nl = text.find('\n', at);
        if (nl == std::string::npos) nl = text.size();
        const std::string_view l(text.data() + at, nl - at);
        at = nl + 1;
        ++line;
        const size_t sp = l.find(' ');
        SpecialToken s;
        if (sp == std::string_view::npos || std::from_chars(l.data(), l.data() + sp, s.id).ptr != l.data() + sp)
            throw ConfigError(origin + ": special token line " + std::to_string(line) + " is not 'ID TEXT'");
        for (size_t i = sp + 1; i < l.size(); ++i) {
            if (l[i] == '\\' && i + 1 < l.size()) {
                s.text += l[i + 1] == 'n' ? '\n' : l[i + 1];
                ++i;
            } else {
                s.text += l[i];
            }
        }
        out.push_back(std::move(s));
    }
    return out;
}

void tokenizer_store_write(hid_t loc, const std::string& group, const TokenizerState& s, bool write_data) {
    h5::Handle g = h5::group(h5::check(H5Gcreate2(loc, group.c_str(), H5P_DEFAULT, h5::group_create_plist(), H5P_DEFAULT),
                                       "create group " + group));
    h5::write_attr_string(g, "kind", s.kind);
    if (s.kind == "bpe" || s.kind == "tiktoken") h5::write_attr_string(g, "pattern", s.pattern);
    if (s.kind == "bpe") {
        hsize_t dims[2] = {s.merges.size(), 2};
        h5::Handle space = h5::space(h5::check(H5Screate_simple(2, dims, nullptr), "dataspace of merges"));
        h5::Handle ds = h5::dataset(h5::check(
            H5Dcreate2(g, "merges", H5T_STD_U32LE, space, H5P_DEFAULT, h5::dataset_create_plist(), H5P_DEFAULT), "create merges"));
        std::vector<uint32_t> flat;
        flat.reserve(2 * s.merges.size());
        for (auto [a, b] : s.merges) flat.insert(flat.end(), {a, b});
        if (write_data && !flat.empty())
            h5::check(H5Dwrite(ds, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, flat.data()), "write merges");
    }
    if (s.kind == "tiktoken" || s.kind == "hf" || s.kind == "spm") write_bytes(g, "file", s.file, write_data);
    if (!s.specials.empty()) write_bytes(g, "special_tokens", tokenizer_specials_text(s.specials), write_data);
}

TokenizerState tokenizer_store_read(hid_t loc, const std::string& group, const std::string& origin) {
    TokenizerState s;
    if (H5Lexists(loc, group.c_str(), H5P_DEFAULT) <= 0) return s;
    const std::string where = origin + ": " + group;
    h5::Handle g = h5::group(H5Gopen2(loc, group.c_str(), H5P_DEFAULT));
    if (!g.valid()) throw ConfigError(where + " is not a group (corrupt file?)");
    s.kind = read_string(g, "kind", where);
    if (s.kind != "byte" && s.kind != "bpe" && s.kind != "tiktoken" && s.kind != "hf" && s.kind != "spm")
        throw ConfigError(where + ": attribute kind = '" + s.kind + "'; valid: byte, bpe, tiktoken, hf, spm");
    s.pattern = read_string(g, "pattern", where);
    bool found = false;
    if (s.kind == "bpe") {
        if (H5Lexists(g, "merges", H5P_DEFAULT) <= 0) throw ConfigError(where + " is bpe but has no merges dataset");
        h5::Handle ds = h5::dataset(H5Dopen2(g, "merges", H5P_DEFAULT));
        h5::Handle type = h5::type(ds.valid() ? H5Dget_type(ds) : -1);
        const std::vector<hsize_t> shape = ds.valid() ? h5::dataset_shape(ds) : std::vector<hsize_t>{};
        if (!type.valid() || H5Tget_class(type) != H5T_INTEGER || shape.size() != 2 || shape[1] != 2)
            throw ConfigError(where + "/merges is not uint32 [n_merges, 2] (corrupt file?)");
        std::vector<uint32_t> flat(2 * shape[0]);
        if (!flat.empty() && H5Dread(ds, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, flat.data()) < 0)
            throw ConfigError(where + "/merges cannot be read (truncated or corrupt file?)");
        for (size_t i = 0; i < shape[0]; ++i) s.merges.emplace_back(flat[2 * i], flat[2 * i + 1]);
    }
    if (s.kind == "tiktoken" || s.kind == "hf" || s.kind == "spm") {
        s.file = read_bytes(g, "file", where, found);
        if (!found) throw ConfigError(where + " is " + s.kind + " but has no file dataset");
    }
    const std::string specials = read_bytes(g, "special_tokens", where, found);
    if (found) s.specials = tokenizer_specials_parse(specials, where);
    return s;
}

}  // namespace quintet
