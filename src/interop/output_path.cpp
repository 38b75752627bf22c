#include "quintet/interop/output_path.hpp"

#include <fcntl.h>  // AT_FDCWD
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc)
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "quintet/core/error.hpp"

namespace fs = std::filesystem;

namespace quintet {

namespace {

// `given` without trailing slashes ("/" stays "/").
std::string strip_slashes(const std::string& given) {
    std::string s = given;
    while (s.size() > 1 && s.back() == '/') s.pop_back();
    return s;
}

// The absolute, normalised form of an existing or future path (symbolic links in its folders
// resolved), for comparing it with the folders that are never replaced.
fs::path resolved(const fs::path& p) {
    std::error_code ec;
    fs::path r = fs::weakly_canonical(fs::absolute(p, ec), ec);
    if (ec) r = fs::absolute(p).lexically_normal();
    if (!r.has_filename() && r.has_parent_path() && r != r.root_path()) r = r.parent_path();
    return r;
}

// true when `inner` is `outer` or lies inside it.
bool within(const fs::path& inner, const fs::path& outer) {
    auto i = inner.begin();
    for (auto o = outer.begin(); o != outer.end(); ++o, ++i) {
        if (o->empty()) continue;  // a trailing separator
        if (i == inner.end() || *i != *o) return false;
    }
    return true;
}

}  // namespace

OutputTarget output_check(const std::string& given, OutputKind kind, bool force, const std::string& what,
                          const std::string& example, const OutputRecogniser& recognise) {
    const bool dir = kind == OutputKind::directory;
    const std::string expected = dir ? "a directory" : "one file";
    if (given.empty()) throw ConfigError(what + " is required (" + example + ")");
    const std::string name = strip_slashes(given);
    const bool slash = name.size() < given.size();
    const fs::path abs = resolved(name);
    std::error_code ec;
    // Folders that are never replaced, whatever the flags.
    const fs::path cwd = resolved(fs::current_path(ec));
    std::string never;
    if (abs == abs.root_path()) never = "the root folder";
    else if (const char* h = std::getenv("HOME"); h && *h && within(resolved(h), abs))
        never = resolved(h) == abs ? "the home folder" : "a folder that holds the home folder";
    else if (!ec && within(cwd, abs)) never = cwd == abs ? "the current folder" : "a folder that holds the current folder";
    if (!never.empty())
        throw ConfigError(what + " '" + given + "' is " + never + ", which quintet never writes over; give the path of " +
                          (dir ? "the directory to write" : "the file to write") + ", e.g. " + example);
    const fs::path path(name);
    const fs::file_status st = fs::symlink_status(path, ec);
    if (fs::is_symlink(st))
        throw ConfigError(what + " '" + given + "' is a symbolic link; give the path it stands for (" +
                          fs::read_symlink(path, ec).string() + ") or another one");
    OutputTarget t;
    t.path = path;
    if (!dir && (slash || fs::is_directory(st)))
        throw ConfigError(what + " '" + given + "' " + (fs::is_directory(st) ? "is a folder" : "names a folder") +
                          ", but this command writes " + expected + ": give " + example);
    if (fs::exists(st)) {
        if (dir && !fs::is_directory(st))
            throw ConfigError(what + " '" + given + "' is a file, but this command writes a directory: give " + example);
        const bool empty_dir = dir && fs::is_empty(path, ec) && !ec;
        if (!empty_dir) {
            if (!force) throw ConfigError(what + " '" + given + "' exists; give --force to replace it");
            if (const std::string why = recognise(path); !why.empty())
                throw ConfigError(what + " '" + given + "' is not an earlier output of this command (" + why +
                                  "); --force replaces only those. Give another path, or move it away yourself");
        }
        t.exists = true;
    }
    // The folder it goes into: there and writable (a directory output creates missing parents,
    // so the nearest existing ancestor must be writable).
    fs::path parent = abs.parent_path();
    if (dir)
        while (!parent.empty() && !fs::exists(parent, ec) && parent != parent.root_path()) parent = parent.parent_path();
    if (!fs::is_directory(parent, ec))
        throw ConfigError(what + " '" + given + "': the folder '" + fs::path(name).parent_path().string() +
                          "' does not exist (create it first)");
    if (::access(parent.c_str(), W_OK | X_OK) != 0)
        throw ConfigError(what + " '" + given + "': cannot write into the folder '" + parent.string() +
                          "': " + std::strerror(errno));
    return t;
}

fs::path output_temp_dir(const fs::path& target) {
    const fs::path abs = fs::absolute(target).lexically_normal();
    std::error_code ec;
    fs::create_directories(abs.parent_path(), ec);
    std::string leaf = ".";  // hidden, named after the output
    leaf += abs.filename().string();
    leaf += ".tmp-XXXXXX";
    const std::string tmpl = (abs.parent_path() / leaf).string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!::mkdtemp(buf.data()))
        throw RankError("cannot create a temporary folder beside '" + target.string() + "': " + std::strerror(errno));
    // mkdtemp makes it 0700; an output directory gets the usual 0777 & ~umask.
    const mode_t mask = ::umask(0);
    ::umask(mask);
    ::chmod(buf.data(), 0777 & ~mask);
    return fs::path(buf.data());
}

void output_write_directory(const OutputTarget& target, const OutputRecogniser& recognise,
                            const std::function<void(const fs::path& tmp)>& write) {
    // Missing parents are created here, and removed again on failure (only the ones made here).
    const fs::path abs = fs::absolute(target.path).lexically_normal();
    fs::path first_made;
    std::error_code ec;
    for (fs::path p = abs.parent_path(); !p.empty() && !fs::exists(p, ec) && p != p.root_path(); p = p.parent_path())
        first_made = p;
    const fs::path tmp = output_temp_dir(target.path);
    auto undo = [&] {
        std::error_code e;
        fs::remove_all(tmp, e);
        if (!first_made.empty()) fs::remove_all(first_made, e);
    };
    try {
        write(tmp);
        if (!fs::exists(fs::symlink_status(abs, ec))) {
            if (::rename(tmp.c_str(), abs.c_str()) != 0)
                throw RankError("cannot rename '" + tmp.string() + "' to '" + abs.string() + "': " + std::strerror(errno));
            return;
        }
        // Still an earlier output (or empty) now that the new one is complete?
        const bool empty = fs::is_directory(abs, ec) && fs::is_empty(abs, ec);
        if (const std::string why = empty ? "" : recognise(abs); !why.empty())
            throw ConfigError("'" + target.path.string() + "' changed while the export was written (" + why +
                              "); nothing was replaced");
        // One atomic exchange; the old output is then in `tmp` and removed with it.
        if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, abs.c_str(), RENAME_EXCHANGE) != 0) {
            if (errno != EINVAL && errno != ENOSYS)
                throw RankError("cannot exchange '" + tmp.string() + "' and '" + abs.string() + "': " + std::strerror(errno));
            // A file system without the exchange: the old output aside first, then the new in place.
            const fs::path old = output_temp_dir(target.path);
            if (::rename(abs.c_str(), old.c_str()) != 0) {
                const int e = errno;
                fs::remove(old, ec);
                throw RankError("cannot move '" + abs.string() + "' aside: " + std::strerror(e));
            }
            if (::rename(tmp.c_str(), abs.c_str()) != 0) {
                const int e = errno;
                ::rename(old.c_str(), abs.c_str());  // the old output back
                throw RankError("cannot rename '" + tmp.string() + "' to '" + abs.string() + "': " + std::strerror(e));
            }
            fs::remove_all(old, ec);
            return;
        }
    } catch (...) {
        undo();
        throw;
    }
    fs::remove_all(tmp, ec);  // the earlier output
}

}  // namespace quintet
