// Where `quintet export` and `quintet import` write (docs/interop.md, "Where the output goes"):
// checked before any work, and replaced only when it is an earlier output of the same kind that
// quintet wrote itself, recognised by its files. A new output is built beside the old one (a
// temporary sibling) and put in its place with one rename, so nothing that quintet did not write
// is ever deleted and a failure leaves the old output as it was.
#pragma once
#include <filesystem>
#include <functional>
#include <string>

namespace quintet {

enum class OutputKind { file, directory };

// "" when the existing `path` is an earlier output of this command (so --force may replace it),
// else why not, e.g. "it holds 'notes.txt', which no export writes".
using OutputRecogniser = std::function<std::string(const std::filesystem::path& path)>;

struct OutputTarget {
    std::filesystem::path path;  // as given, without trailing slashes
    bool exists = false;         // an earlier output (or an empty directory) is there to replace
};

// Checks `given` for an output of `kind` and returns where to write; ConfigError (exit 2) with
// one line naming `what` (e.g. "export: --output") otherwise:
// - empty; the root, the home directory, the current directory or a folder holding it (never
//   replaced, whatever the flags); a symbolic link;
// - a file where a directory is written or the other way round (a trailing slash names a
//   directory): the message says what is expected, e.g. `example` = "a file such as model.gguf";
// - an existing output without `force`; an existing one that `recognise` does not accept, with or
//   without `force` (an empty directory needs no --force: nothing is lost);
// - a missing or read-only parent folder (a directory output creates its missing parents).
// "." and "dir/" mean the same path as "dir" would.
OutputTarget output_check(const std::string& given, OutputKind kind, bool force, const std::string& what,
                          const std::string& example, const OutputRecogniser& recognise);

// Writes a directory output: `write(tmp)` fills a fresh temporary sibling directory, which then
// takes the target's place (one atomic exchange where the file system has it); the earlier output
// is removed only after that, and only when `recognise` still accepts it. On an exception the
// temporary directory is removed and the target is left as it was.
void output_write_directory(const OutputTarget& target, const OutputRecogniser& recognise,
                            const std::function<void(const std::filesystem::path& tmp)>& write);

// A fresh, empty temporary directory beside `target` (".<name>.tmp-XXXXXX"), for outputs built
// from several files; the caller removes it.
std::filesystem::path output_temp_dir(const std::filesystem::path& target);

}  // namespace quintet
