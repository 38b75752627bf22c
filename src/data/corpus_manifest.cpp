#include "quintet/data/corpus_manifest.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "quintet/core/error.hpp"

namespace quintet {
namespace fs = std::filesystem;

void manifest_write(const std::string& dir, const CorpusManifest& m) {
    nlohmann::ordered_json j;
    j["format"] = "quintet corpus";
    j["version"] = kManifestVersion;
    j["complete"] = true;
    j["tokens"] = m.tokens;
    j["documents"] = m.documents;
    j["tokenizer"] = {{"file", m.tokenizer_file},
                      {"fingerprint", m.tokenizer_fingerprint},
                      {"describe", m.tokenizer_describe},
                      {"vocab_size", m.vocab_size}};
    j["width"] = m.width;
    j["eos_id"] = m.eos_id;
    j["bos_id"] = m.bos_id;
    j["skipped_files"] = m.skipped_files;
    j["bad_lines"] = m.bad_lines;
    j["shards"] = nlohmann::ordered_json::array();
    for (const auto& s : m.shards)
        j["shards"].push_back({{"file", s.file}, {"tokens", s.tokens}, {"bytes", s.bytes}, {"offset", s.offset},
                               {"checksum", s.checksum}});
    j["inputs"] = nlohmann::ordered_json::array();
    for (const auto& in : m.inputs)
        j["inputs"].push_back({{"path", in.path}, {"bytes", in.bytes}, {"mtime_ns", in.mtime_ns}});
    j["command"] = m.command;
    const std::string text = j.dump(1) + "\n";
    const std::string path = (fs::path(dir) / kManifestName).string(), tmp = path + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) rank_fail("cannot create '" + tmp + "': " + std::strerror(errno));
    size_t done = 0;
    while (done < text.size()) {
        const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            const std::string why = std::strerror(errno);
            ::close(fd);
            ::unlink(tmp.c_str());
            throw IoError("cannot write '" + tmp + "': " + why);
        }
        done += size_t(w);
    }
    if (::fsync(fd) != 0 || ::close(fd) != 0) {
        const std::string why = std::strerror(errno);
        ::unlink(tmp.c_str());
        throw IoError("cannot write '" + tmp + "': " + why);
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        const std::string why = std::strerror(errno);
        ::unlink(tmp.c_str());
        throw IoError("cannot rename '" + tmp + "' to '" + path + "': " + why);
    }
    // The rename itself reaches the disk with the directory.
    if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
}

CorpusManifest manifest_read(const std::string& dir, bool& found) {
    CorpusManifest m;
    const std::string path = (fs::path(dir) / kManifestName).string();
    std::error_code ec;
    found = fs::exists(path, ec);
    if (!found) return m;
    std::ifstream in(path, std::ios::binary);
    std::stringstream buf;
    buf << in.rdbuf();
    auto bad = [&](const std::string& why) -> void {
        throw ConfigError("corpus manifest '" + path + "': " + why + " (re-run `quintet prepare`, or check the file with "
                          "`quintet data verify " + dir + "`)");
    };
    try {
        const nlohmann::json j = nlohmann::json::parse(buf.str());
        if (j.value("format", "") != "quintet corpus") bad("not a quintet corpus manifest");
        if (j.value("version", 0) != kManifestVersion)
            bad("version " + std::to_string(j.value("version", 0)) + "; this build reads version " +
                std::to_string(kManifestVersion));
        if (!j.value("complete", false)) bad("not marked complete");
        m.tokens = j.at("tokens").get<int64_t>();
        m.documents = j.at("documents").get<int64_t>();
        const auto& t = j.at("tokenizer");
        m.tokenizer_file = t.at("file").get<std::string>();
        m.tokenizer_fingerprint = t.at("fingerprint").get<std::string>();
        m.tokenizer_describe = t.value("describe", "");
        m.vocab_size = t.at("vocab_size").get<int>();
        m.width = j.at("width").get<int>();
        m.eos_id = j.value("eos_id", -1);
        m.bos_id = j.value("bos_id", -1);
        m.skipped_files = j.value("skipped_files", int64_t(0));
        m.bad_lines = j.value("bad_lines", int64_t(0));
        int64_t sum = 0;
        for (const auto& s : j.at("shards")) {
            ManifestShard sh;
            sh.file = s.at("file").get<std::string>();
            sh.tokens = s.at("tokens").get<int64_t>();
            sh.bytes = s.at("bytes").get<int64_t>();
            sh.offset = s.at("offset").get<int64_t>();
            sh.checksum = s.at("checksum").get<std::string>();
            if (sh.file.empty() || sh.file.find('/') != std::string::npos || sh.tokens < 1 || sh.offset < 0)
                bad("shard entry '" + sh.file + "' is malformed");
            sum += sh.tokens;
            m.shards.push_back(std::move(sh));
        }
        if (m.shards.empty()) bad("lists no shards");
        if (sum != m.tokens) bad("its shards hold " + std::to_string(sum) + " tokens but it says " + std::to_string(m.tokens));
        if (m.width != 2 && m.width != 4) bad("width " + std::to_string(m.width) + "; valid: 2 or 4");
        for (const auto& i : j.value("inputs", nlohmann::json::array()))
            m.inputs.push_back({i.at("path").get<std::string>(), i.at("bytes").get<int64_t>(), i.at("mtime_ns").get<int64_t>()});
        m.command = j.value("command", "");
    } catch (const nlohmann::json::exception& e) {
        bad(std::string("malformed: ") + e.what());
    }
    return m;
}

std::string manifest_disagreement(const std::string& dir, const CorpusManifest& m) {
    std::error_code ec;
    std::set<std::string> listed;
    for (const auto& s : m.shards) {
        listed.insert(s.file);
        const fs::path p = fs::path(dir) / s.file;
        const auto size = fs::file_size(p, ec);
        if (ec) return "shard '" + p.string() + "' listed in its manifest is missing";
        if (int64_t(size) != s.bytes)
            return "shard '" + p.string() + "' has " + std::to_string(size) + " bytes but its manifest says " +
                   std::to_string(s.bytes) + " (altered or truncated after prepare?)";
    }
    if (!fs::exists(fs::path(dir) / m.tokenizer_file, ec))
        return "the corpus tokenizer '" + (fs::path(dir) / m.tokenizer_file).string() + "' is missing";
    for (const auto& e : fs::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (e.path().extension() == ".h5" && name != m.tokenizer_file && !listed.count(name))
            return "'" + e.path().string() + "' is not one of the shards its manifest lists (added after prepare?)";
    }
    return "";
}

}  // namespace quintet
