// The inputs of `quintet prepare` (corpus_input.hpp). The decompressors are driven by hand (zlib's
// inflate, libzstd's streaming API, liblzma's stream decoder) rather than through convenience
// readers, so that a file that ends before its compressed stream does is always an error: zlib's
// gzread, for one, hands back what it could decode of a truncated file and reports the end of it
// only as a soft "buffer" condition.
#include "quintet/data/corpus_input.hpp"

#include <glob.h>
#include <lzma.h>
#include <sys/stat.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "quintet/core/error.hpp"

namespace quintet {
namespace fs = std::filesystem;

namespace {

[[noreturn]] void bad_input(const std::string& what) { throw ConfigError("prepare: " + what); }

bool ends_with(const std::string& s, const char* suffix) {
    const size_t n = std::strlen(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

constexpr size_t kRawBytes = size_t(1) << 20;  // compressed bytes read at a time

// The compressed file's bytes, read in blocks; at_end once the file is consumed.
class RawFile {
public:
    explicit RawFile(const std::string& path) : path_(path) {
        f_ = std::fopen(path.c_str(), "rb");
        if (!f_) bad_input("input '" + path + "' cannot be opened for reading: " + std::strerror(errno));
        buf_.resize(kRawBytes);
    }
    ~RawFile() {
        if (f_) std::fclose(f_);
    }
    RawFile(const RawFile&) = delete;
    RawFile& operator=(const RawFile&) = delete;
    // Refills when empty; returns false at the end of the file.
    bool fill() {
        if (at_ < len_) return true;
        len_ = std::fread(buf_.data(), 1, buf_.size(), f_);
        if (std::ferror(f_)) bad_input("input '" + path_ + "' cannot be read: " + std::strerror(errno));
        at_ = 0;
        consumed_ += int64_t(len_);
        return len_ > 0;
    }
    const unsigned char* data() const { return reinterpret_cast<const unsigned char*>(buf_.data()) + at_; }
    size_t left() const { return len_ - at_; }
    void take(size_t n) { at_ += n; }
    int64_t offset() const { return consumed_ - int64_t(len_ - at_); }
    const std::string& path() const { return path_; }

private:
    std::string path_;
    FILE* f_ = nullptr;
    std::string buf_;
    size_t at_ = 0, len_ = 0;
    int64_t consumed_ = 0;
};

class PlainStream final : public ByteStream {
public:
    explicit PlainStream(const std::string& path) : path_(path) {
        f_ = std::fopen(path.c_str(), "rb");
        if (!f_) bad_input("input '" + path + "' cannot be opened for reading: " + std::strerror(errno));
        std::setvbuf(f_, nullptr, _IOFBF, 1 << 20);
    }
    ~PlainStream() override {
        if (f_) std::fclose(f_);
    }
    size_t read(std::string& out, size_t n) override {
        const size_t at = out.size();
        out.resize(at + n);
        const size_t got = std::fread(out.data() + at, 1, n, f_);
        if (std::ferror(f_)) bad_input("input '" + path_ + "' cannot be read: " + std::strerror(errno));
        out.resize(at + got);
        pos_ += int64_t(got);
        return got;
    }
    int64_t tell() const override { return pos_; }
    int64_t raw_offset() const override { return pos_; }
    void seek(int64_t at) override {
        if (std::fseek(f_, long(at), SEEK_SET) != 0) bad_input("input '" + path_ + "' cannot seek to " + std::to_string(at));
        pos_ = at;
    }

private:
    std::string path_;
    FILE* f_ = nullptr;
    int64_t pos_ = 0;
};

[[noreturn]] void truncated(const RawFile& raw, const char* format) {
    bad_input("input '" + raw.path() + "' is a truncated " + format + " file: it ends at byte " +
              std::to_string(raw.offset()) + " inside a compressed stream (an interrupted download or copy?)");
}

// gzip, any number of members one after the other (as `cat a.gz b.gz` makes).
class GzipStream final : public ByteStream {
public:
    explicit GzipStream(const std::string& path) : raw_(path) {
        std::memset(&z_, 0, sizeof z_);
        if (inflateInit2(&z_, 15 + 16) != Z_OK) bad_input("input '" + path + "': zlib cannot start");
    }
    ~GzipStream() override { inflateEnd(&z_); }
    size_t read(std::string& out, size_t n) override {
        const size_t at = out.size();
        out.resize(at + n);
        size_t got = 0;
        while (got < n) {
            if (ended_) {  // between members: another one, or the end of the file
                if (!raw_.fill()) break;
                inflateReset(&z_);
                ended_ = false;
            }
            if (!raw_.fill()) truncated(raw_, "gzip");
            z_.next_in = const_cast<unsigned char*>(raw_.data());
            z_.avail_in = unsigned(std::min<size_t>(raw_.left(), 1u << 30));
            z_.next_out = reinterpret_cast<unsigned char*>(out.data() + at + got);
            z_.avail_out = unsigned(n - got);
            const unsigned before_in = z_.avail_in, before_out = z_.avail_out;
            const int rc = inflate(&z_, Z_NO_FLUSH);
            raw_.take(before_in - z_.avail_in);
            got += before_out - z_.avail_out;
            if (rc == Z_STREAM_END) {
                ended_ = true;
            } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
                bad_input("input '" + raw_.path() + "' is not a valid gzip file: " + (z_.msg ? z_.msg : "corrupt data") +
                          " near byte " + std::to_string(raw_.offset()));
            }
        }
        out.resize(at + got);
        pos_ += int64_t(got);
        return got;
    }
    int64_t tell() const override { return pos_; }
    int64_t raw_offset() const override { return raw_.offset(); }

private:
    RawFile raw_;
    z_stream z_;
    bool ended_ = false;
    int64_t pos_ = 0;
};

class ZstdStream final : public ByteStream {
public:
    explicit ZstdStream(const std::string& path) : raw_(path) {
        d_ = ZSTD_createDStream();
        if (!d_) bad_input("input '" + path + "': libzstd cannot start");
        ZSTD_initDStream(d_);
    }
    ~ZstdStream() override { ZSTD_freeDStream(d_); }
    size_t read(std::string& out, size_t n) override {
        const size_t at = out.size();
        out.resize(at + n);
        size_t got = 0;
        while (got < n) {
            if (!raw_.fill()) {
                if (in_frame_) truncated(raw_, "zstd");
                break;
            }
            ZSTD_inBuffer in{raw_.data(), raw_.left(), 0};
            ZSTD_outBuffer o{out.data() + at + got, n - got, 0};
            const size_t rc = ZSTD_decompressStream(d_, &o, &in);
            if (ZSTD_isError(rc))
                bad_input("input '" + raw_.path() + "' is not a valid zstd file: " + ZSTD_getErrorName(rc) +
                          " near byte " + std::to_string(raw_.offset()));
            raw_.take(in.pos);
            got += o.pos;
            in_frame_ = rc != 0;  // 0: a frame ended exactly here
        }
        out.resize(at + got);
        pos_ += int64_t(got);
        return got;
    }
    int64_t tell() const override { return pos_; }
    int64_t raw_offset() const override { return raw_.offset(); }

private:
    RawFile raw_;
    ZSTD_DStream* d_ = nullptr;
    bool in_frame_ = false;
    int64_t pos_ = 0;
};

class XzStream final : public ByteStream {
public:
    explicit XzStream(const std::string& path) : raw_(path) {
        if (lzma_stream_decoder(&s_, UINT64_MAX, LZMA_CONCATENATED) != LZMA_OK)
            bad_input("input '" + path + "': liblzma cannot start");
    }
    ~XzStream() override { lzma_end(&s_); }
    size_t read(std::string& out, size_t n) override {
        const size_t at = out.size();
        out.resize(at + n);
        size_t got = 0;
        while (got < n && !done_) {
            const bool more = raw_.fill();
            s_.next_in = raw_.data();
            s_.avail_in = more ? raw_.left() : 0;
            s_.next_out = reinterpret_cast<uint8_t*>(out.data() + at + got);
            s_.avail_out = n - got;
            const size_t before_in = s_.avail_in, before_out = s_.avail_out;
            const lzma_ret rc = lzma_code(&s_, more ? LZMA_RUN : LZMA_FINISH);
            raw_.take(before_in - s_.avail_in);
            got += before_out - s_.avail_out;
            if (rc == LZMA_STREAM_END) {
                done_ = true;
            } else if (rc == LZMA_BUF_ERROR && !more) {
                truncated(raw_, "xz");
            } else if (rc != LZMA_OK) {
                bad_input("input '" + raw_.path() + "' is not a valid xz file (liblzma error " + std::to_string(int(rc)) +
                          (rc == LZMA_DATA_ERROR ? ": corrupt data" : rc == LZMA_FORMAT_ERROR ? ": not xz" : "") +
                          ") near byte " + std::to_string(raw_.offset()));
            } else if (!more && before_out == s_.avail_out) {
                truncated(raw_, "xz");
            }
        }
        out.resize(at + got);
        pos_ += int64_t(got);
        return got;
    }
    int64_t tell() const override { return pos_; }
    int64_t raw_offset() const override { return raw_.offset(); }

private:
    RawFile raw_;
    lzma_stream s_ = LZMA_STREAM_INIT;
    bool done_ = false;
    int64_t pos_ = 0;
};

// Length of the UTF-8 sequence that starts with byte c (0: not a valid first byte).
int utf8_length(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

}  // namespace

void ByteStream::seek(int64_t) { QUINTET_CHECK(false, "ByteStream::seek on a compressed input"); }

Compression compression_of(const std::string& path) {
    if (ends_with(path, ".gz")) return Compression::gzip;
    if (ends_with(path, ".zst")) return Compression::zstd;
    if (ends_with(path, ".xz")) return Compression::xz;
    return Compression::none;
}

const char* compression_name(Compression c) {
    switch (c) {
    case Compression::gzip: return "gzip";
    case Compression::zstd: return "zstd";
    case Compression::xz: return "xz";
    default: return "none";
    }
}

InputFormat format_of(const std::string& path) {
    std::string s = path;
    for (const char* z : {".gz", ".zst", ".xz"})
        if (ends_with(s, z)) s.resize(s.size() - std::strlen(z));
    for (const char* j : {".jsonl", ".json", ".ndjson"})
        if (ends_with(s, j)) return InputFormat::jsonl;
    return InputFormat::text;
}

std::unique_ptr<ByteStream> ByteStream::open(const InputFile& f) {
    switch (f.compression) {
    case Compression::gzip: return std::make_unique<GzipStream>(f.path);
    case Compression::zstd: return std::make_unique<ZstdStream>(f.path);
    case Compression::xz: return std::make_unique<XzStream>(f.path);
    default: return std::make_unique<PlainStream>(f.path);
    }
}

std::vector<InputFile> corpus_inputs(const std::vector<std::string>& inputs) {
    std::vector<InputFile> files;
    std::error_code ec;
    for (const auto& in : inputs) {
        std::vector<std::string> found;
        if (in.find_first_of("*?[") != std::string::npos) {
            glob_t g{};
            if (::glob(in.c_str(), 0, nullptr, &g) == 0)
                for (size_t i = 0; i < g.gl_pathc; ++i)
                    if (fs::is_regular_file(g.gl_pathv[i], ec)) found.emplace_back(g.gl_pathv[i]);
            globfree(&g);
            if (found.empty()) bad_input("option --input = '" + in + "': the glob matches no files");
        } else if (fs::is_directory(in, ec)) {
            for (auto it = fs::recursive_directory_iterator(in, ec); it != fs::recursive_directory_iterator(); ++it) {
                const std::string name = it->path().filename().string();
                if (!name.empty() && name[0] == '.') {  // hidden files and folders
                    if (it->is_directory(ec)) it.disable_recursion_pending();
                    continue;
                }
                if (it->is_regular_file(ec)) found.push_back(it->path().string());
            }
            if (found.empty()) bad_input("option --input = '" + in + "': the directory holds no files");
        } else if (fs::exists(in, ec)) {
            if (!fs::is_regular_file(in, ec)) bad_input("option --input = '" + in + "': not a regular file");
            found.push_back(in);
        } else {
            bad_input("option --input = '" + in + "': no such file, directory or glob");
        }
        std::sort(found.begin(), found.end());
        for (const auto& path : found) {
            InputFile f;
            f.path = path;
            f.compression = compression_of(path);
            f.format = format_of(path);
            struct stat st {};
            if (::stat(path.c_str(), &st) != 0)
                bad_input("input '" + path + "' cannot be read: " + std::strerror(errno));
            f.bytes = int64_t(st.st_size);
            f.mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + int64_t(st.st_mtim.tv_nsec);
            files.push_back(std::move(f));
        }
    }
    return files;
}

bool looks_like_text(const std::string& head, bool at_end, std::string& why) {
    for (size_t i = 0; i < head.size();) {
        const auto c = static_cast<unsigned char>(head[i]);
        if (c == 0) {
            why = "a NUL byte at offset " + std::to_string(i);
            return false;
        }
        const int n = utf8_length(c);
        bool ok = n > 0;
        if (ok && i + size_t(n) > head.size()) {
            if (!at_end) return true;  // cut by the end of the head
            ok = false;
        }
        for (int k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(head[i + size_t(k)]) & 0xC0) == 0x80;
        // Overlong three- and four-byte forms, surrogates and code points past U+10FFFF.
        if (ok && n == 3) {
            const auto c1 = static_cast<unsigned char>(head[i + 1]);
            ok = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 >= 0xA0);
        }
        if (ok && n == 4) {
            const auto c1 = static_cast<unsigned char>(head[i + 1]);
            ok = !(c == 0xF0 && c1 < 0x90) && !(c == 0xF4 && c1 >= 0x90);
        }
        if (!ok) {
            char hex[8];
            std::snprintf(hex, sizeof hex, "0x%02X", unsigned(c));
            why = std::string("byte ") + hex + " at offset " + std::to_string(i) + " is not UTF-8";
            return false;
        }
        i += size_t(n);
    }
    return true;
}

JsonlKeys::JsonlKeys(const std::string& spec) : spec_(spec) {
    size_t at = 0;
    while (at <= spec.size()) {
        size_t comma = spec.find(',', at);
        if (comma == std::string::npos) comma = spec.size();
        std::string key = spec.substr(at, comma - at);
        at = comma + 1;
        if (key.empty())
            throw ConfigError("prepare option --jsonl-key = '" + spec +
                              "': an empty key; valid: a comma list of field names or dotted paths (text,meta.body)");
        std::vector<std::string> path{key};  // the whole name first: a field may contain dots
        keys_.push_back(path);
        if (key.find('.') != std::string::npos) {
            path.clear();
            for (size_t a = 0; a <= key.size();) {
                size_t dot = key.find('.', a);
                if (dot == std::string::npos) dot = key.size();
                path.push_back(key.substr(a, dot - a));
                a = dot + 1;
            }
            keys_.push_back(path);
        }
    }
}

bool JsonlKeys::text_of(const std::string& line, std::string& text, std::string& why) const {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
        why = std::string("not JSON (") + e.what() + ")";
        return false;
    }
    if (!j.is_object()) {
        why = std::string("the line is a JSON ") + j.type_name() + ", not an object with the field \"" + spec_ +
              "\" (--jsonl-key)";
        return false;
    }
    for (const auto& path : keys_) {
        const nlohmann::json* at = &j;
        for (const auto& k : path) {
            if (!at->is_object()) {
                at = nullptr;
                break;
            }
            const auto it = at->find(k);
            at = it == at->end() ? nullptr : &*it;
            if (!at) break;
        }
        if (at && at->is_string()) {
            text = at->get<std::string>();
            return true;
        }
    }
    why = "no string field \"" + spec_ + "\" (--jsonl-key)";
    return false;
}

}  // namespace quintet
