// Token file read/write with the serial HDF5 C API (layout in io/token_data.hpp).
// The reader trusts nothing: every header field is checked and each failure becomes a
// ConfigError that names the file, what is wrong and what was expected.
#include "quintet/io/token_data.hpp"

#include <hdf5.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <system_error>
#include <utility>

#include "quintet/core/checksum.hpp"
#include "quintet/core/error.hpp"
#include "quintet/io/h5.hpp"
#include "quintet/io/tokenizer_store.hpp"
#include "quintet/tokenizer/byte_bpe.hpp"
#include "quintet/tokenizer/tokenizer_spec.hpp"

namespace quintet {
namespace {

// Owns one HDF5 id; closes it with the matching H5?close.
class H5Id {
public:
    H5Id() = default;
    H5Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
    H5Id(const H5Id&) = delete;
    H5Id& operator=(const H5Id&) = delete;
    H5Id(H5Id&& o) noexcept : id_(std::exchange(o.id_, -1)), close_(o.close_) {}
    H5Id& operator=(H5Id&& o) noexcept {
        std::swap(id_, o.id_);
        std::swap(close_, o.close_);
        return *this;
    }
    ~H5Id() {
        if (id_ >= 0 && close_) close_(id_);
    }
    hid_t get() const { return id_; }
    bool ok() const { return id_ >= 0; }
    hid_t release() { return std::exchange(id_, -1); }

private:
    hid_t id_ = -1;
    herr_t (*close_)(hid_t) = nullptr;
};

void silence_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

[[noreturn]] void bad_file(const std::string& path, const std::string& what) {
    throw ConfigError("token file '" + path + "': " + what);
}

std::string describe_type(hid_t type) {
    switch (H5Tget_class(type)) {
    case H5T_INTEGER:
        return std::string(H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") +
               std::to_string(8 * H5Tget_size(type));
    case H5T_FLOAT: return "float" + std::to_string(8 * H5Tget_size(type));
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    default: return "a non-numeric type";
    }
}

// The object holding the header attributes: the root group, or /tokens if they were put there.
hid_t attr_holder(hid_t file, hid_t tokens, const char* name) {
    if (H5Aexists(file, name) > 0) return file;
    if (tokens >= 0 && H5Aexists(tokens, name) > 0) return tokens;
    return -1;
}

// Reads a scalar (or 1-element) integer attribute; nullopt-like `found = false` if absent.
int64_t read_int_attr(const std::string& path, hid_t file, hid_t tokens, const char* name,
                      bool& found) {
    hid_t holder = attr_holder(file, tokens, name);
    found = holder >= 0;
    if (!found) return 0;
    H5Id attr(H5Aopen(holder, name, H5P_DEFAULT), H5Aclose);
    H5Id type(attr.ok() ? H5Aget_type(attr.get()) : -1, H5Tclose);
    H5Id space(attr.ok() ? H5Aget_space(attr.get()) : -1, H5Sclose);
    if (!type.ok() || !space.ok())
        bad_file(path, std::string("attribute '") + name + "' cannot be opened (corrupt file?)");
    if (H5Tget_class(type.get()) != H5T_INTEGER || H5Sget_simple_extent_npoints(space.get()) != 1)
        bad_file(path, std::string("attribute '") + name + "' is " +
                           describe_type(type.get()) + " with " +
                           std::to_string(H5Sget_simple_extent_npoints(space.get())) +
                           " element(s); expected one integer");
    int64_t v = 0;
    if (H5Aread(attr.get(), H5T_NATIVE_INT64, &v) < 0)
        bad_file(path, std::string("attribute '") + name + "' cannot be read (corrupt file?)");
    return v;
}

// Reads a string attribute, fixed-length or variable-length (h5py writes the latter).
std::string read_string_attr(const std::string& path, hid_t file, hid_t tokens, const char* name,
                             bool& found) {
    hid_t holder = attr_holder(file, tokens, name);
    found = holder >= 0;
    if (!found) return {};
    H5Id attr(H5Aopen(holder, name, H5P_DEFAULT), H5Aclose);
    H5Id type(attr.ok() ? H5Aget_type(attr.get()) : -1, H5Tclose);
    if (!type.ok())
        bad_file(path, std::string("attribute '") + name + "' cannot be opened (corrupt file?)");
    if (H5Tget_class(type.get()) != H5T_STRING)
        bad_file(path, std::string("attribute '") + name + "' is " + describe_type(type.get()) +
                           "; expected a string");
    std::string out;
    herr_t rc;
    if (H5Tis_variable_str(type.get()) > 0) {
        H5Id mem(H5Tcopy(H5T_C_S1), H5Tclose);
        H5Tset_size(mem.get(), H5T_VARIABLE);
        char* buf = nullptr;
        rc = H5Aread(attr.get(), mem.get(), &buf);
        if (rc >= 0 && buf) out = buf;
        if (buf) H5free_memory(buf);
    } else {
        std::string buf(H5Tget_size(type.get()), '\0');
        rc = H5Aread(attr.get(), type.get(), buf.data());
        out = buf.substr(0, buf.find('\0'));
    }
    if (rc < 0)
        bad_file(path, std::string("attribute '") + name + "' cannot be read (corrupt file?)");
    while (!out.empty() && out.back() == ' ') out.pop_back();  // space-padded fixed strings
    return out;
}

// Opens the file after the checks that give the clearest messages for the common mistakes.
H5Id open_token_file(const std::string& path) {
    silence_hdf5();
    std::error_code ec;
    if (!std::filesystem::exists(path, ec))
        bad_file(path, "does not exist; make one with "
                       "`quintet prepare --input TEXT --tokenizer SPEC --output FILE`");
    if (std::filesystem::is_directory(path, ec))
        bad_file(path, "is a directory; expected an HDF5 token file");
    if (H5Fis_hdf5(path.c_str()) <= 0)
        bad_file(path, "is not an HDF5 file (or its header is corrupt); expected a token file "
                       "written by `quintet prepare`");
    H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (!file.ok()) bad_file(path, "cannot be opened as HDF5 (truncated or corrupt?)");
    return file;
}

H5Id open_tokens(const std::string& path, hid_t file) {
    if (H5Lexists(file, "tokens", H5P_DEFAULT) <= 0)
        bad_file(path, "has no /tokens dataset; expected a 1-D uint16 or uint32 token array");
    H5Id ds(H5Dopen2(file, "tokens", H5P_DEFAULT), H5Dclose);
    if (!ds.ok()) bad_file(path, "/tokens is not a dataset (or is corrupt)");
    return ds;
}

// Format 1 (before the tokenizer group): "byte" or "bpe" with /tokenizer/merges. Its bpe keeps
// the format-1 split it was made with.
Tokenizer read_tokenizer_v1(const std::string& path, hid_t file, hid_t tokens, const std::string& kind,
                            int64_t vocab, int& eos_id) {
    bool has_eos = false;
    const int64_t eos = read_int_attr(path, file, tokens, "eos_id", has_eos);
    if (kind == "byte") {
        if (vocab != 256)
            bad_file(path, "vocab_size = " + std::to_string(vocab) +
                               " with tokenizer \"byte\"; a byte tokenizer has vocab_size 256");
        if (has_eos && (eos < 0 || eos > 255))
            bad_file(path, "eos_id = " + std::to_string(eos) + " with tokenizer \"byte\"; valid: a byte 0 .. 255");
        eos_id = has_eos ? int(eos) : -1;
        return tokenizer_byte();
    }
    if (vocab <= 256 || vocab > INT32_MAX)
        bad_file(path, "vocab_size = " + std::to_string(vocab) + " with tokenizer \"bpe\"; valid: 257 .. 2147483647");
    const TokenizerState st = [&] {
        TokenizerState s;
        if (H5Lexists(file, "tokenizer", H5P_DEFAULT) <= 0 || H5Lexists(file, "tokenizer/merges", H5P_DEFAULT) <= 0)
            bad_file(path, "tokenizer is \"bpe\" but there is no /tokenizer/merges dataset");
        H5Id ds(H5Dopen2(file, "tokenizer/merges", H5P_DEFAULT), H5Dclose);
        H5Id type(ds.ok() ? H5Dget_type(ds.get()) : -1, H5Tclose);
        H5Id space(ds.ok() ? H5Dget_space(ds.get()) : -1, H5Sclose);
        if (!type.ok() || !space.ok()) bad_file(path, "/tokenizer/merges cannot be opened (corrupt file?)");
        hsize_t dims[2] = {0, 0};
        const int rank = H5Sget_simple_extent_ndims(space.get());
        if (H5Tget_class(type.get()) != H5T_INTEGER || rank != 2 ||
            (H5Sget_simple_extent_dims(space.get(), dims, nullptr), dims[1] != 2))
            bad_file(path, "/tokenizer/merges is " + describe_type(type.get()) + " of rank " + std::to_string(rank) +
                               "; expected uint32 [n_merges, 2]");
        // A BPE file with an end-of-document token has one id after the merges.
        const int64_t expected = vocab - 256 - (has_eos ? 1 : 0);
        if (has_eos && eos != vocab - 1)
            bad_file(path, "eos_id = " + std::to_string(eos) + " with tokenizer \"bpe\"; the end-of-document token "
                           "is the id after the merges, vocab_size - 1 = " + std::to_string(vocab - 1));
        if (int64_t(dims[0]) != expected)
            bad_file(path, "/tokenizer/merges has " + std::to_string(dims[0]) + " merges but vocab_size = " +
                               std::to_string(vocab) + " needs vocab_size - 256 = " + std::to_string(expected));
        std::vector<uint32_t> flat(2 * dims[0]);
        if (!flat.empty() &&
            H5Dread(ds.get(), H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, flat.data()) < 0)
            bad_file(path, "/tokenizer/merges cannot be read (corrupt file?)");
        for (size_t i = 0; i < dims[0]; ++i) s.merges.emplace_back(flat[2 * i], flat[2 * i + 1]);
        return s;
    }();
    eos_id = has_eos ? int(eos) : -1;
    return tokenizer_bpe(st.merges, has_eos, "", "token file '" + path + "': /tokenizer/merges");
}

// Header + tokenizer; `tokens` (may be -1) is only searched for attributes.
Tokenizer read_tokenizer(const std::string& path, hid_t file, hid_t tokens, int& vocab_size, int& eos_id,
                         int& bos_id, int64_t& format_version) {
    bool found = false;
    int64_t version = read_int_attr(path, file, tokens, "format_version", found);
    if (!found) version = 1;  // the first files had no version
    if (version != 1 && version != kTokenFileFormatVersion && version != kShardFormatVersion)
        bad_file(path, "format_version = " + std::to_string(version) + "; this build reads 1 to " +
                           std::to_string(kShardFormatVersion) + " (re-run quintet prepare)");
    format_version = version;
    const int64_t vocab = read_int_attr(path, file, tokens, "vocab_size", found);
    if (!found)
        bad_file(path, "has no 'vocab_size' attribute (on / or /tokens); expected an integer "
                       "> 0 written by `quintet prepare`");
    const std::string kind = read_string_attr(path, file, tokens, "tokenizer", found);
    if (!found)
        bad_file(path, "has no 'tokenizer' attribute (on / or /tokens); expected \"byte\", \"bpe\", \"tiktoken\", "
                       "\"hf\" or \"spm\"");
    bos_id = -1;
    if (version == 1) {
        if (kind != "byte" && kind != "bpe")
            bad_file(path, "attribute tokenizer = '" + kind + "'; valid in a format-1 file: \"byte\" or \"bpe\"");
        Tokenizer tok = read_tokenizer_v1(path, file, tokens, kind, vocab, eos_id);
        vocab_size = int(vocab);
        return tok;
    }
    Tokenizer tok;
    if (version == kShardFormatVersion) {
        // A corpus shard: the tokenizer is stored once beside it and named by its fingerprint.
        const std::string name = read_string_attr(path, file, tokens, "tokenizer_file", found);
        const std::string fp = found ? read_string_attr(path, file, tokens, "tokenizer_fingerprint", found) : "";
        if (!found || name.empty() || name.find('/') != std::string::npos)
            bad_file(path, "is a corpus shard (format_version 3) without valid 'tokenizer_file' and "
                           "'tokenizer_fingerprint' attributes");
        tok = corpus_tokenizer_read((std::filesystem::path(path).parent_path() / name).string(), fp);
    } else {
        const TokenizerState st = tokenizer_store_read(file, "tokenizer", "token file '" + path + "'");
        if (st.empty()) bad_file(path, "has no /tokenizer group; expected the tokenizer that made the tokens");
        tok = tokenizer_from_state(st, "token file '" + path + "': /tokenizer");
    }
    if (tok.kind() != kind)
        bad_file(path, "attribute tokenizer = '" + kind + "' but its tokenizer is a '" + tok.kind() + "' tokenizer");
    if (vocab != tok.vocab_size())
        bad_file(path, "vocab_size = " + std::to_string(vocab) + " but its tokenizer, " + tok.describe() +
                           ", has vocab_size " + std::to_string(tok.vocab_size()));
    for (const char* name : {"eos_id", "bos_id"}) {
        const int64_t v = read_int_attr(path, file, tokens, name, found);
        if (found && (v < 0 || v >= vocab))
            bad_file(path, std::string(name) + " = " + std::to_string(v) + "; valid: 0 .. " + std::to_string(vocab - 1));
        (name[0] == 'e' ? eos_id : bos_id) = found ? int(v) : -1;
    }
    vocab_size = int(vocab);
    return tok;
}

}  // namespace

struct TokenFileWriter::Impl {
    std::string path, tmp, tokenizer_file;
    Tokenizer tok;
    int64_t n = 0, written = 0, offset = -1, bytes = 0;
    int width = 2;
    H5Id file, ds;
    Checksum sum;
    bool committed = false;
    std::vector<uint16_t> narrow;
    [[noreturn]] void fail(const std::string& what) { throw IoError("token file '" + path + "': " + what); }
    void write_int(const char* name, int64_t v) {
        H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
        H5Id attr(H5Acreate2(file.get(), name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
        if (!attr.ok() || H5Awrite(attr.get(), H5T_NATIVE_INT64, &v) < 0) fail(std::string("cannot write attribute ") + name);
    }
    void write_string(const char* name, const std::string& value) {
        H5Id type(H5Tcopy(H5T_C_S1), H5Tclose);
        H5Tset_size(type.get(), std::max<size_t>(1, value.size()));
        H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
        H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
        H5Id attr(H5Acreate2(file.get(), name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
        if (!attr.ok() || H5Awrite(attr.get(), type.get(), value.empty() ? "" : value.data()) < 0)
            fail(std::string("cannot write attribute ") + name);
    }
};

TokenFileWriter::TokenFileWriter(const std::string& path, int64_t n_tokens, const Tokenizer& tok, int eos_id,
                                 int bos_id, const std::string& tokenizer_file)
    : impl_(std::make_unique<Impl>()) {
    Impl& m = *impl_;
    m.path = path;
    m.tmp = path + ".tmp";
    m.tokenizer_file = tokenizer_file;
    m.tok = tok;
    m.n = n_tokens;
    m.width = tok.vocab_size() <= 65536 ? 2 : 4;
    QUINTET_CHECK(eos_id < tok.vocab_size() && bos_id < tok.vocab_size(), "TokenFileWriter: eos_id or bos_id >= vocab_size");
    silence_hdf5();
    h5::Handle fcpl = h5::file_create_plist();
    m.file = H5Id(H5Fcreate(m.tmp.c_str(), H5F_ACC_TRUNC, fcpl, H5P_DEFAULT), H5Fclose);
    if (!m.file.ok()) m.fail("cannot create '" + m.tmp + "' (does the directory exist and is it writable?)");
    m.write_int("format_version", tokenizer_file.empty() ? kTokenFileFormatVersion : kShardFormatVersion);
    m.write_int("vocab_size", tok.vocab_size());
    if (eos_id >= 0) m.write_int("eos_id", eos_id);
    if (bos_id >= 0) m.write_int("bos_id", bos_id);
    m.write_string("tokenizer", tok.kind());
    if (!tokenizer_file.empty()) {
        m.write_string("tokenizer_file", tokenizer_file);
        m.write_string("tokenizer_fingerprint", Checksum::hex(tok.fingerprint()));
    }
    // Contiguous, uncompressed and allocated now: any reader (serial or MPI-IO) can take
    // hyperslabs of it, and pread at its offset.
    hsize_t n = hsize_t(n_tokens);
    H5Id space(H5Screate_simple(1, &n, nullptr), H5Sclose);
    const hid_t file_type = m.width == 2 ? H5T_STD_U16LE : H5T_STD_U32LE;
    h5::Handle dcpl = h5::dataset_create_plist();
    H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
    m.ds = H5Id(H5Dcreate2(m.file.get(), "tokens", file_type, space.get(), H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
    if (!m.ds.ok()) m.fail("cannot create /tokens (disk full?)");
    const haddr_t at = H5Dget_offset(m.ds.get());
    m.offset = at == HADDR_UNDEF ? -1 : int64_t(at);
}

void TokenFileWriter::write(int64_t at, const uint32_t* ids, int64_t n) {
    Impl& m = *impl_;
    if (n <= 0) return;
    QUINTET_CHECK(at == m.written && at + n <= m.n, "TokenFileWriter: writes must be in order and within the file");
    const uint32_t vocab = uint32_t(m.tok.vocab_size());
    for (int64_t i = 0; i < n; ++i)
        QUINTET_CHECK(ids[i] < vocab, "TokenFileWriter: token " + std::to_string(ids[i]) + " >= vocab_size");
    const void* stored = ids;
    if (m.width == 2) {
        m.narrow.assign(ids, ids + n);
        stored = m.narrow.data();
    }
    m.sum.update(stored, size_t(n) * size_t(m.width));  // little-endian hosts: the bytes as on disk
    const hsize_t start = hsize_t(at), count = hsize_t(n);
    H5Id fs(H5Dget_space(m.ds.get()), H5Sclose);
    H5Id ms(H5Screate_simple(1, &count, nullptr), H5Sclose);
    if (H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr) < 0 ||
        H5Dwrite(m.ds.get(), m.width == 2 ? H5T_NATIVE_UINT16 : H5T_NATIVE_UINT32, ms.get(), fs.get(), H5P_DEFAULT,
                 stored) < 0)
        m.fail("cannot write /tokens (disk full?)");
    m.written += n;
}

void TokenFileWriter::commit() {
    Impl& m = *impl_;
    QUINTET_CHECK(m.written == m.n, "TokenFileWriter: committed with " + std::to_string(m.written) + " of " +
                                        std::to_string(m.n) + " tokens written");
    try {
        if (m.tokenizer_file.empty()) tokenizer_store_write(m.file.get(), "tokenizer", m.tok.state());
    } catch (const RankError& e) {
        m.fail(std::string("cannot write the tokenizer (disk full?): ") + e.what());
    }
    if (H5Fflush(m.file.get(), H5F_SCOPE_GLOBAL) < 0) m.fail("cannot flush '" + m.tmp + "' (disk full?)");
    m.ds = H5Id();
    const herr_t closed = H5Fclose(m.file.release());
    if (closed < 0) m.fail("cannot close '" + m.tmp + "' (disk full?)");
    std::error_code ec;
    m.bytes = int64_t(std::filesystem::file_size(m.tmp, ec));
    std::filesystem::rename(m.tmp, m.path, ec);
    if (ec) m.fail("cannot rename '" + m.tmp + "' to it: " + ec.message());
    m.committed = true;
}

int64_t TokenFileWriter::offset() const { return impl_->offset; }
int64_t TokenFileWriter::bytes() const { return impl_->bytes; }
uint64_t TokenFileWriter::checksum() const { return impl_->sum.value(); }

TokenFileWriter::~TokenFileWriter() {
    if (!impl_ || impl_->committed) return;
    impl_->ds = H5Id();
    impl_->file = H5Id();
    std::error_code ec;
    std::filesystem::remove(impl_->tmp, ec);
}

void token_file_write(const std::string& path, const std::vector<uint32_t>& tokens, const Tokenizer& tok,
                      int eos_id, int bos_id) {
    TokenFileWriter w(path, int64_t(tokens.size()), tok, eos_id, bos_id);
    for (size_t at = 0; at < tokens.size(); at += size_t(1) << 20)
        w.write(int64_t(at), tokens.data() + at, int64_t(std::min(tokens.size() - at, size_t(1) << 20)));
    w.commit();
}

void corpus_tokenizer_write(const std::string& path, const Tokenizer& tok) {
    silence_hdf5();
    const std::string tmp = path + ".tmp";
    try {
        h5::Handle fcpl = h5::file_create_plist();
        H5Id file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, fcpl, H5P_DEFAULT), H5Fclose);
        if (!file.ok()) throw IoError("cannot create '" + tmp + "'");
        h5::write_attr_i64(file.get(), "format_version", kShardFormatVersion);
        h5::write_attr_i64(file.get(), "vocab_size", tok.vocab_size());
        h5::write_attr_string(file.get(), "tokenizer", tok.kind());
        h5::write_attr_string(file.get(), "tokenizer_fingerprint", Checksum::hex(tok.fingerprint()));
        tokenizer_store_write(file.get(), "tokenizer", tok.state());
        if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0) throw IoError("cannot flush '" + tmp + "' (disk full?)");
    } catch (const std::exception& e) {
        std::error_code ec;
        std::filesystem::remove(tmp, ec);
        throw IoError("corpus tokenizer '" + path + "': " + e.what() + " (disk full?)");
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) throw IoError("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
}

Tokenizer corpus_tokenizer_read(const std::string& path, const std::string& fingerprint) {
    // Shards of one corpus share it: read and parsed once per process.
    static std::mutex m;
    static std::map<std::string, Tokenizer> cache;
    std::error_code ec;
    const std::string key = std::filesystem::weakly_canonical(path, ec).string() + "#" + fingerprint;
    {
        std::lock_guard<std::mutex> lock(m);
        if (const auto it = cache.find(key); it != cache.end()) return it->second;
    }
    silence_hdf5();
    const std::string what = "corpus tokenizer '" + path + "'";
    if (!std::filesystem::exists(path, ec))
        throw ConfigError(what + " does not exist: a shard of the corpus names it (an incomplete corpus? re-run "
                                 "`quintet prepare`)");
    H5Id file(H5Fis_hdf5(path.c_str()) > 0 ? H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT) : -1, H5Fclose);
    if (!file.ok()) throw ConfigError(what + " is not a readable HDF5 file (corrupt?)");
    const TokenizerState st = tokenizer_store_read(file.get(), "tokenizer", what);
    if (st.empty()) throw ConfigError(what + " has no /tokenizer group");
    Tokenizer tok = tokenizer_from_state(st, what);
    if (!fingerprint.empty() && Checksum::hex(tok.fingerprint()) != fingerprint)
        throw ConfigError(what + " has fingerprint " + Checksum::hex(tok.fingerprint()) + " but the shard names " +
                          fingerprint + ": the shard belongs to another corpus's tokenizer");
    std::lock_guard<std::mutex> lock(m);
    cache.emplace(key, tok);
    return tok;
}

TokenFile token_file_read(const std::string& path) {
    H5Id file = open_token_file(path);
    H5Id ds = open_tokens(path, file.get());
    TokenFile out;
    out.tokenizer = read_tokenizer(path, file.get(), ds.get(), out.vocab_size, out.eos_id, out.bos_id,
                                   out.format_version);

    H5Id type(H5Dget_type(ds.get()), H5Tclose);
    H5Id space(H5Dget_space(ds.get()), H5Sclose);
    if (!type.ok() || !space.ok()) bad_file(path, "/tokens cannot be opened (corrupt file?)");
    size_t width = H5Tget_size(type.get());
    if (H5Tget_class(type.get()) != H5T_INTEGER || H5Tget_sign(type.get()) != H5T_SGN_NONE ||
        (width != 2 && width != 4))
        bad_file(path, "/tokens has type " + describe_type(type.get()) +
                           "; expected uint16 or uint32 token ids");
    int rank = H5Sget_simple_extent_ndims(space.get());
    if (rank != 1)
        bad_file(path, "/tokens has rank " + std::to_string(rank) +
                           "; expected a 1-D array of token ids");
    hsize_t n = 0;
    H5Sget_simple_extent_dims(space.get(), &n, nullptr);
    if (n < 2)
        bad_file(path, "/tokens holds " + std::to_string(n) +
                           " token(s); need at least 2 (an input and its next-token target)");
    out.tokens.resize(n);
    if (H5Dread(ds.get(), H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.tokens.data()) < 0)
        bad_file(path, "/tokens cannot be read (truncated or corrupt file?)");
    const uint32_t vocab = uint32_t(out.vocab_size);
    auto bad = std::find_if(out.tokens.begin(), out.tokens.end(),
                            [&](uint32_t t) { return t >= vocab; });
    if (bad != out.tokens.end())
        bad_file(path, "/tokens[" + std::to_string(bad - out.tokens.begin()) + "] = " +
                           std::to_string(*bad) + " is not a valid token id; valid: 0 .. " +
                           std::to_string(vocab - 1) + " (vocab_size = " +
                           std::to_string(vocab) + ")");
    return out;
}

Tokenizer token_file_read_tokenizer(const std::string& path, int& eos_id) {
    H5Id file = open_token_file(path);
    H5Id ds = open_tokens(path, file.get());
    int vocab = 0, bos = -1;
    int64_t version = 0;
    return read_tokenizer(path, file.get(), ds.get(), vocab, eos_id, bos, version);
}

Tokenizer token_file_read_tokenizer(const std::string& path) {
    int eos = -1;
    return token_file_read_tokenizer(path, eos);
}

TokenFileHeader token_file_header(const std::string& path) {
    H5Id file = open_token_file(path);
    H5Id ds = open_tokens(path, file.get());
    TokenFileHeader h;
    h.tokenizer = read_tokenizer(path, file.get(), ds.get(), h.vocab_size, h.eos_id, h.bos_id, h.format_version);
    H5Id type(H5Dget_type(ds.get()), H5Tclose);
    H5Id space(H5Dget_space(ds.get()), H5Sclose);
    if (!type.ok() || !space.ok()) bad_file(path, "/tokens cannot be opened (corrupt file?)");
    const size_t width = H5Tget_size(type.get());
    if (H5Tget_class(type.get()) != H5T_INTEGER || H5Tget_sign(type.get()) != H5T_SGN_NONE ||
        (width != 2 && width != 4))
        bad_file(path, "/tokens has type " + describe_type(type.get()) + "; expected uint16 or uint32 token ids");
    const int rank = H5Sget_simple_extent_ndims(space.get());
    if (rank != 1) bad_file(path, "/tokens has rank " + std::to_string(rank) + "; expected a 1-D array of token ids");
    hsize_t n = 0;
    H5Sget_simple_extent_dims(space.get(), &n, nullptr);
    if (n < 2)
        bad_file(path, "/tokens holds " + std::to_string(n) +
                           " token(s); need at least 2 (an input and its next-token target)");
    h.n_tokens = int64_t(n);
    h.width = int(width);
    // A contiguous, unfiltered, little-endian dataset is read with pread at its offset (from any
    // thread); anything else through HDF5.
    H5Id dcpl(H5Dget_create_plist(ds.get()), H5Pclose);
    const haddr_t at = H5Dget_offset(ds.get());
    if (dcpl.ok() && H5Pget_layout(dcpl.get()) == H5D_CONTIGUOUS && H5Pget_nfilters(dcpl.get()) == 0 &&
        H5Tget_order(type.get()) == H5T_ORDER_LE && at != HADDR_UNDEF) {
        std::error_code ec;
        const auto size = std::filesystem::file_size(path, ec);
        if (ec || uint64_t(at) + uint64_t(n) * width > size)
            bad_file(path, "is truncated: /tokens needs bytes up to " + std::to_string(uint64_t(at) + n * width) +
                               " but the file has " + std::to_string(ec ? 0 : size));
        h.file_offset = int64_t(at);
    }
    return h;
}

void token_file_read_range(const std::string& path, int64_t begin, int64_t n, uint32_t* out) {
    H5Id file = open_token_file(path);
    H5Id ds = open_tokens(path, file.get());
    H5Id space(H5Dget_space(ds.get()), H5Sclose);
    const hsize_t start = hsize_t(begin), count = hsize_t(n);
    H5Id mem(H5Screate_simple(1, &count, nullptr), H5Sclose);
    if (!space.ok() || H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr) < 0 ||
        H5Dread(ds.get(), H5T_NATIVE_UINT32, mem.get(), space.get(), H5P_DEFAULT, out) < 0)
        throw IoError("token file '" + path + "': /tokens[" + std::to_string(begin) + " .. " +
                      std::to_string(begin + n) + ") cannot be read (truncated or corrupt file?)");
}

TokenFileInfo token_file_info(const std::string& path) {
    H5Id file = open_token_file(path);
    H5Id ds = open_tokens(path, file.get());
    TokenFileInfo info;
    bool found = false;
    const int64_t vocab = read_int_attr(path, file.get(), ds.get(), "vocab_size", found);
    if (!found || vocab <= 0 || vocab > INT32_MAX)
        bad_file(path, "has no valid 'vocab_size' attribute (on / or /tokens); expected an integer > 0 written by "
                       "`quintet prepare`");
    info.vocab_size = int(vocab);
    hid_t sp = H5Dget_space(ds.get());
    hsize_t n = 0;
    H5Sget_simple_extent_dims(sp, &n, nullptr);
    H5Sclose(sp);
    info.n_tokens = int64_t(n);
    return info;
}

}  // namespace quintet
