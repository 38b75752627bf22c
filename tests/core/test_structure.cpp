// The shape of the source tree (docs/architecture.md, "The folder stack"): the folders form one
// stack, and each may include only from the folders below it; raw MPI calls stay inside comm/
// (the two programs' entry points start and end MPI). A new include that points up the stack
// fails here, naming the file, the line and the two folders.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

// Lowest first. A folder may include its own headers and those of every folder before it.
const std::vector<std::string> kStack = {"core", "tokenizer", "kernels", "comm",  "parallel", "model",
                                         "io",   "data",      "deck",    "interop", "perf", "train", "study", "tools"};

int level(const std::string& folder) {
    const auto it = std::find(kStack.begin(), kStack.end(), folder);
    return it == kStack.end() ? -1 : int(it - kStack.begin());
}

struct Source {
    fs::path path;     // relative to the source root
    std::string folder;  // its concern: src/<folder>/... or include/quintet/<folder>/...
};

std::vector<Source> sources() {
    const fs::path root = QUINTET_SOURCE_DIR;
    std::vector<Source> out;
    for (const char* top : {"src", "include/quintet"})
        for (const auto& e : fs::recursive_directory_iterator(root / top)) {
            if (!e.is_regular_file()) continue;
            const std::string ext = e.path().extension().string();
            if (ext != ".cpp" && ext != ".hpp" && ext != ".cu" && ext != ".cuh") continue;
            const fs::path rel = fs::relative(e.path(), root);
            const fs::path inside = fs::relative(e.path(), root / top);
            const std::string folder = inside.has_parent_path() ? inside.begin()->string() : "";
            out.push_back({rel, folder});
        }
    return out;
}

// Code lines: comments (whole-line and trailing) left out.
std::vector<std::pair<int, std::string>> code_lines(const fs::path& p) {
    std::ifstream f(fs::path(QUINTET_SOURCE_DIR) / p);
    std::vector<std::pair<int, std::string>> out;
    std::string line;
    for (int n = 1; std::getline(f, line); ++n) {
        const size_t first = line.find_first_not_of(" \t");
        if (first == std::string::npos || line.compare(first, 2, "//") == 0 || line[first] == '*') continue;
        const size_t c = line.find("//");
        out.emplace_back(n, c == std::string::npos ? line : line.substr(0, c));
    }
    return out;
}

TEST(Structure, EveryFolderIsOnTheStack) {
    for (const auto& s : sources()) {
        if (s.folder.empty()) continue;  // src/main.cpp: the program, above everything
        EXPECT_GE(level(s.folder), 0) << s.path << ": folder '" << s.folder
                                      << "' is not on the stack (tests/core/test_structure.cpp, docs/architecture.md)";
    }
}

TEST(Structure, IncludesPointDownTheStack) {
    const std::regex inc("#\\s*include\\s+\"quintet/([a-z_]+)/");
    int checked = 0;
    for (const auto& s : sources()) {
        const int mine = s.folder.empty() ? int(kStack.size()) : level(s.folder);
        // Tests that live beside the code they test (the emulated CUDA kernels) may reach up.
        if (s.path.filename().string().rfind("test_", 0) == 0) continue;
        for (const auto& [n, line] : code_lines(s.path)) {
            std::smatch m;
            if (!std::regex_search(line, m, inc)) continue;
            ++checked;
            const int theirs = level(m[1]);
            EXPECT_GE(theirs, 0) << s.path << ":" << n << " includes from unknown folder '" << m[1] << "'";
            EXPECT_LE(theirs, mine) << s.path << ":" << n << ": " << (s.folder.empty() ? "main" : s.folder)
                                    << "/ includes " << m[1] << "/, which is above it on the stack";
        }
    }
    EXPECT_GT(checked, 100) << "the scan found too few includes: is QUINTET_SOURCE_DIR right?";
}

TEST(Structure, RawMpiOnlyInComm) {
    // A call of an MPI function (MPI_Xxx_yyy(...)); handles and constants (MPI_Comm,
    // MPI_COMM_WORLD) may be passed around.
    const std::regex call("\\bMPI_[A-Z][a-z_]+\\s*\\(");
    for (const auto& s : sources()) {
        if (s.folder == "comm") continue;
        const std::string name = s.path.generic_string();
        const bool entry = name == "src/main.cpp" || name == "src/tools/cuda_bench.cpp";
        for (const auto& [n, line] : code_lines(s.path)) {
            std::smatch m;
            if (!std::regex_search(line, m, call)) continue;
            const std::string fn = m.str();
            const bool lifetime = fn.rfind("MPI_Init", 0) == 0 || fn.rfind("MPI_Finalize", 0) == 0 ||
                                  fn.rfind("MPI_Abort", 0) == 0 || fn.rfind("MPI_Comm_rank", 0) == 0;
            EXPECT_TRUE(entry && lifetime) << s.path << ":" << n << ": " << fn
                                           << " -- MPI is called through comm/ (MpiCommunicator) only";
        }
    }
}

// The detectors themselves: a line that breaks a rule is caught, one that keeps it is not.
TEST(Structure, DetectorsFire) {
    EXPECT_GT(level("train"), level("model"));
    EXPECT_LT(level("comm"), level("parallel"));
    EXPECT_EQ(level("nonsense"), -1);
    const std::regex call("\\bMPI_[A-Z][a-z_]+\\s*\\(");
    EXPECT_TRUE(std::regex_search(std::string("    MPI_Allreduce(&a, &b, 1, MPI_INT, MPI_SUM, c);"), call));
    EXPECT_FALSE(std::regex_search(std::string("void f(MPI_Comm c, int x = MPI_COMM_NULL);"), call));
}

}  // namespace
