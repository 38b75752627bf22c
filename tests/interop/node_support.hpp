// What the tests that run llama.cpp through Node share: Node's version, an npm install into the
// build tree, JSON strings for the job files, lines of a text.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "support/run_support.hpp"

namespace quintet::testing::node {

// The major version of `node` on PATH; 0 where there is none.
inline int major_version() {
    const auto r = run_shell("node --version 2>/dev/null");
    if (r.status != 0 || r.output.size() < 2 || r.output[0] != 'v') return 0;
    return std::atoi(r.output.c_str() + 1);
}

// "" when Node >= 20 runs here and `packages` (npm specs) are installed under `prefix` (installed
// now unless every one of `present`, paths below prefix/node_modules, exists); else why not.
inline std::string ensure_packages(const std::filesystem::path& prefix, const std::string& packages,
                                   const std::vector<std::string>& present) {
    if (const int v = major_version(); v < 20)
        return v == 0 ? "no `node` on PATH" : "node v" + std::to_string(v) + " is older than 20";
    std::filesystem::create_directories(prefix);
    bool all = true;
    for (const std::string& p : present) all = all && std::filesystem::exists(prefix / "node_modules" / p);
    if (all) return "";
    const auto r = run_shell("npm install --prefix '" + prefix.string() + "' --no-audit --no-fund --loglevel=error " +
                             packages + " 2>&1");
    return r.status == 0 ? "" : "npm install " + packages + " failed (no registry?): " + r.output;
}

inline std::vector<std::string> lines_of(const std::string& s) {
    std::vector<std::string> out;
    std::istringstream in(s);
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
}

// s as a JSON string literal.
inline std::string json_string(const std::string& s) {
    std::string o = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            o += '\\';
            o += char(c);
        } else if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            o += buf;
        } else {
            o += char(c);
        }
    }
    return o + "\"";
}

}  // namespace quintet::testing::node
