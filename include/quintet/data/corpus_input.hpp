// The inputs of `quintet prepare` (docs/data.md, "Formats read"): which files a list of --input
// values names, how each is read (plain, gzip, zstd or xz, always as a stream that notices a
// truncated or corrupt file), what it holds (JSON Lines or plain text, by its extension) and
// whether it is text at all. A ConfigError (exit status 2) names the file and what is wrong.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace quintet {

enum class Compression { none, gzip, zstd, xz };
enum class InputFormat { text, jsonl };

struct InputFile {
    std::string path;
    Compression compression = Compression::none;
    InputFormat format = InputFormat::text;
    int64_t bytes = 0;     // on disk
    int64_t mtime_ns = 0;  // modification time, for the manifest and --resume
};

// By the name: ".gz", ".zst", ".xz" the compression; ".jsonl", ".json", ".ndjson" (before it)
// JSON Lines, anything else plain text.
Compression compression_of(const std::string& path);
InputFormat format_of(const std::string& path);
const char* compression_name(Compression c);

// The files of --input values: a file, a directory's regular files (recursively, sorted, hidden
// ones left out) or a glob's matches (sorted), each value's files in order. ConfigError naming
// the value when nothing is found.
std::vector<InputFile> corpus_inputs(const std::vector<std::string>& inputs);

// A file's bytes, decompressed as they stream. Truncated or corrupt compressed data is a
// ConfigError naming the file and the offset. Plain files may seek; compressed ones may not.
class ByteStream {
public:
    static std::unique_ptr<ByteStream> open(const InputFile& f);
    virtual ~ByteStream() = default;
    // Up to n bytes into out (appended); 0 only at the end.
    virtual size_t read(std::string& out, size_t n) = 0;
    virtual int64_t tell() const = 0;        // decompressed bytes read so far (plain: the offset)
    virtual int64_t raw_offset() const = 0;  // bytes of the file consumed
    virtual void seek(int64_t at);           // plain files only
};

// Whether `head` (a file's first bytes, `at_end` when that is the whole file) is text: no NUL
// byte and valid UTF-8 (a sequence cut by the end of `head` is allowed unless at_end). On false,
// `why` says where it fails.
bool looks_like_text(const std::string& head, bool at_end, std::string& why);

// --jsonl-key: a comma list of keys, each a field name or a dotted path into nested objects
// ("meta.body"); a document's text is the first one a line has as a string.
class JsonlKeys {
public:
    JsonlKeys() = default;
    explicit JsonlKeys(const std::string& spec);
    bool empty() const { return keys_.empty(); }
    const std::string& spec() const { return spec_; }
    // The text of one JSON line; false with `why` set when it is not JSON or has none of the keys.
    bool text_of(const std::string& line, std::string& text, std::string& why) const;

private:
    std::string spec_;
    std::vector<std::vector<std::string>> keys_;  // each a path of field names
};

}  // namespace quintet
