// The repository's text cites only what the repository holds. Every tracked text file (docs,
// README, sources, headers, scripts, job templates, decks, tests) is scanned for citations a
// reader could not follow:
//   - the design and style notes the project was built from, which are not in the repository
//     ("<design-note> §3", "<style-note> principle 7", "<note>.md"), and "see issues";
//   - `docs/<name>.md` mentions, bare `<name>.md` mentions inside docs/ and upper-case `NAME.md`
//     mentions that name no tracked file;
//   - in Markdown files, links and images whose target is missing, and paths into the tree
//     (src/, include/, tests/, scripts/, jobs/, inputs/, docs/) that do not exist.
// The file list comes from `git ls-files` when the source folder is a git checkout, else from a
// walk of the tree (build folders, data/, runs/ and hidden folders left out). This file is left
// out of the scan: it has to spell the patterns it looks for.
// ctest: labels=unit
#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

const char* kSelf = "tests/docs/test_doc_references.cpp";

// The tracked files (paths relative to the source folder, '/'-separated) and every folder
// above them.
struct Tree {
    fs::path root;
    std::set<std::string> files, dirs;
    bool has(std::string p) const {
        while (p.size() > 1 && p.back() == '/') p.pop_back();
        return files.count(p) || dirs.count(p);
    }
    void add(const std::string& f) {
        files.insert(f);
        for (size_t i = f.find('/'); i != std::string::npos; i = f.find('/', i + 1)) dirs.insert(f.substr(0, i));
    }
};

std::vector<std::string> git_ls_files(const fs::path& root) {
    std::vector<std::string> out;
    const std::string cmd = "git -C '" + root.string() + "' ls-files -z 2>/dev/null";
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return out;
    std::string cur;
    for (int c; (c = std::fgetc(p)) != EOF;) {
        if (c == '\0') {
            if (!cur.empty()) out.push_back(cur);
            cur.clear();
        } else {
            cur += char(c);
        }
    }
    pclose(p);
    return out;
}

std::vector<std::string> walk(const fs::path& root) {
    std::vector<std::string> out;
    for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
        const std::string name = it->path().filename().string();
        if (it->is_directory()) {
            if (name[0] == '.' || name.rfind("build", 0) == 0 || name == "data" || name == "runs" ||
                name == "__pycache__")
                it.disable_recursion_pending();
            continue;
        }
        if (it->is_regular_file()) out.push_back(fs::relative(it->path(), root).generic_string());
    }
    return out;
}

const Tree& tree() {
    static const Tree t = [] {
        Tree t;
        t.root = QUINTET_SOURCE_DIR;
        std::vector<std::string> files = git_ls_files(t.root);
        if (files.empty()) files = walk(t.root);
        for (const auto& f : files) t.add(f);
        return t;
    }();
    return t;
}

// Text of a tracked file, or "" for binary files (a NUL byte) and files that are gone.
std::string text_of(const Tree& t, const std::string& f) {
    std::ifstream in(t.root / f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string s = ss.str();
    return s.find('\0') == std::string::npos ? s : std::string();
}

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string dir_of(const std::string& f) {
    const size_t i = f.rfind('/');
    return i == std::string::npos ? "" : f.substr(0, i + 1);
}

// a/b/../c -> a/c, ./x -> x; "" when it climbs above the root.
std::string normalise(const std::string& p) {
    std::vector<std::string> parts;
    std::stringstream ss(p);
    for (std::string seg; std::getline(ss, seg, '/');) {
        if (seg.empty() || seg == ".") continue;
        if (seg == "..") {
            if (parts.empty()) return "";
            parts.pop_back();
        } else {
            parts.push_back(seg);
        }
    }
    std::string out;
    for (const auto& s : parts) out += (out.empty() ? "" : "/") + s;
    return out;
}

// A match starts a token only if the character before it cannot be part of a path.
bool starts_token(const std::string& line, size_t pos, const char* also_not = "") {
    if (pos == 0) return true;
    const char c = line[pos - 1];
    return !(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-' ||
             std::string(also_not).find(c) != std::string::npos);
}

enum class Check { citations, md_mentions, md_links_and_paths };

// The problems of one line of file `f`, as "f:line: what".
std::vector<std::string> check_line(const Tree& t, const std::string& f, int n, const std::string& line, Check which) {
    static const std::regex design(R"(\bDESIGN\b)");
    static const std::regex style(R"(\bSTYLE(\.md| principles?\b| [0-9]))");
    static const std::regex issues(R"(\bsee `?issues?`?)", std::regex::icase);
    static const std::regex docs_md(R"(docs/([A-Za-z0-9_.-]+\.md)\b)");
    static const std::regex upper_md(R"(\b[A-Z][A-Z0-9_-]+\.md\b)");
    static const std::regex bare_md(R"(\b[a-z][A-Za-z0-9_-]*\.md\b)");
    static const std::regex link(R"(\]\(([^)\s]+)\))");
    static const std::regex scheme(R"(^[a-z][a-z0-9+.-]*:)");
    static const std::regex path(R"(\b(src|include|tests|scripts|jobs|inputs|docs)/[A-Za-z0-9_./-]*[A-Za-z0-9_/])");
    static const std::regex placeholder(R"((^|/)[A-Z][A-Z_]{2,}(\.|/|$))");
    std::vector<std::string> out;
    auto bad = [&](const std::string& what) { out.push_back(f + ":" + std::to_string(n) + ": " + what); };
    auto each = [&](const std::regex& re, auto fn) {
        for (std::sregex_iterator it(line.begin(), line.end(), re), end; it != end; ++it) fn(*it);
    };
    const bool md = ends_with(f, ".md");
    switch (which) {
    case Check::citations:
        if (line.find("DESIGN") == std::string::npos && line.find("STYLE") == std::string::npos &&
            line.find("ssue") == std::string::npos && line.find("SSUE") == std::string::npos)
            break;
        if (std::regex_search(line, design) || std::regex_search(line, style))
            bad("cites a design or style note the repository does not hold: \"" + line + "\"");
        if (std::regex_search(line, issues)) bad("sends the reader to the issue tracker: \"" + line + "\"");
        break;
    case Check::md_mentions:
        if (line.find(".md") == std::string::npos) break;
        each(docs_md, [&](const std::smatch& m) {
            if (starts_token(line, size_t(m.position(0))) && !t.has("docs/" + m.str(1)))
                bad("docs/" + m.str(1) + " does not exist");
        });
        each(upper_md, [&](const std::smatch& m) {
            if (starts_token(line, size_t(m.position(0)), "/") && !t.has(m.str(0)) && !t.has(dir_of(f) + m.str(0)))
                bad(m.str(0) + " is not in the repository");
        });
        if (md && f.rfind("docs/", 0) == 0)
            each(bare_md, [&](const std::smatch& m) {
                if (starts_token(line, size_t(m.position(0)), "/") && !t.has("docs/" + m.str(0)) && !t.has(m.str(0)))
                    bad(m.str(0) + " does not exist (in docs/ or at the top)");
            });
        break;
    case Check::md_links_and_paths:
        if (!md) break;
        if (line.find("](") != std::string::npos)
            each(link, [&](const std::smatch& m) {
                std::string target = m.str(1);
                if (std::regex_search(target, scheme) || target[0] == '#') return;
                target = target.substr(0, target.find('#'));
                const std::string p = normalise(dir_of(f) + target);
                if (p.empty() || !t.has(p)) bad("link to " + m.str(1) + ", which does not exist");
            });
        if (line.find('/') == std::string::npos) break;
        each(path, [&](const std::smatch& m) {
            if (!starts_token(line, size_t(m.position(0)), "/$~")) return;
            size_t end = size_t(m.position(0) + m.length(0));
            while (end < line.size() && line[end] == '.') ++end;
            if (end < line.size() && std::string("*{<").find(line[end]) != std::string::npos) return;  // a pattern
            std::string p = m.str(0);
            if (p.find('<') != std::string::npos || std::regex_search(p, placeholder)) return;
            while (!p.empty() && p.back() == '.') p.pop_back();
            if (!t.has(p)) bad("the path " + p + " does not exist");
        });
        break;
    }
    return out;
}

std::vector<std::string> scan(Check which) {
    const Tree& t = tree();
    std::vector<std::string> out;
    for (const auto& f : t.files) {
        if (f == kSelf) continue;
        const std::string text = text_of(t, f);
        std::stringstream ss(text);
        int n = 0;
        for (std::string line; std::getline(ss, line);) {
            ++n;
            for (auto& p : check_line(t, f, n, line, which)) out.push_back(std::move(p));
        }
    }
    return out;
}

std::string report(const std::vector<std::string>& problems) {
    std::string s;
    for (const auto& p : problems) s += "  " + p + "\n";
    return s;
}

}  // namespace

// The scan sees the repository (so that an empty file list cannot pass), and each detector
// fires on a line made to trip it and stays quiet on a good one.
TEST(DocReferences, TheCheckSeesTheTreeAndCanFail) {
    const Tree& t = tree();
    ASSERT_TRUE(t.has("README.md") && t.has("docs/math.md") && t.has("src/main.cpp") && t.has("src/kernels/cpu"))
        << "the file list of " << t.root << " is incomplete (" << t.files.size() << " files)";
    auto fails = [&](const char* file, const char* line, Check c) { return !check_line(t, file, 1, line, c).empty(); };
    const std::string design = std::string("DES") + "IGN";
    EXPECT_TRUE(fails("src/x.cpp", ("// as " + design + " §3 fixes").c_str(), Check::citations));
    EXPECT_TRUE(fails("scripts/x.py", ("written from " + design + ".md alone").c_str(), Check::citations));
    EXPECT_TRUE(fails("tests/x.cpp", ("// (ST" + std::string("YLE principle 7)")).c_str(), Check::citations));
    EXPECT_TRUE(fails("README.md", "Status (see `issues`): done", Check::citations));
    EXPECT_FALSE(fails("src/x.cpp", "// the design of docs/architecture.md", Check::citations));
    EXPECT_TRUE(fails("src/x.cpp", "// derivation in docs/nosuch.md", Check::md_mentions));
    EXPECT_TRUE(fails("docs/x.md", "as nosuch.md says", Check::md_mentions));
    EXPECT_TRUE(fails("src/x.cpp", "// see NOTES.md", Check::md_mentions));
    EXPECT_FALSE(fails("src/x.cpp", "// derivation in docs/math.md §5", Check::md_mentions));
    EXPECT_FALSE(fails("docs/x.md", "as math.md §5 and README.md say", Check::md_mentions));
    EXPECT_TRUE(fails("docs/x.md", "[the maths](nosuch.md#top)", Check::md_links_and_paths));
    EXPECT_TRUE(fails("README.md", "the kernels are in `src/kernels/cpu/nosuch.cpp`", Check::md_links_and_paths));
    EXPECT_FALSE(fails("docs/x.md", "[the maths](math.md#rope), ![plot](long_context_by_position.png)",
                       Check::md_links_and_paths));
    EXPECT_FALSE(fails("README.md", "`src/kernels/cpu/`, `scripts/plot_*.py`, `inputs/NAME.deck`, `tests/<concern>/`",
                       Check::md_links_and_paths));
    EXPECT_FALSE(fails("docs/x.md", "`src/model/layer_kinds.{hpp,cpp}`, see docs/math.md.", Check::md_links_and_paths));
}

TEST(DocReferences, NothingCitesTheDesignOrStyleNotesOrTheIssueTracker) {
    const auto problems = scan(Check::citations);
    EXPECT_TRUE(problems.empty())
        << "the repository's text must stand alone: cite the doc and section that holds the content "
           "(docs/math.md, formats.md, parallelism.md, reliability.md, ...) or say it in a sentence:\n"
        << report(problems);
}

TEST(DocReferences, EveryMentionedMarkdownFileExists) {
    const auto problems = scan(Check::md_mentions);
    EXPECT_TRUE(problems.empty()) << "mentions of Markdown files the repository does not hold:\n" << report(problems);
}

TEST(DocReferences, LinksAndPathsInTheDocsExist) {
    const auto problems = scan(Check::md_links_and_paths);
    EXPECT_TRUE(problems.empty()) << "links and paths in the Markdown files that lead nowhere:\n" << report(problems);
}

// A TeX escape written through a string literal loses its backslash to a control character
// ("\times" becomes a tab and "imes", "\frac" a form feed and "rac"): the Markdown must hold none.
TEST(DocReferences, MarkdownHoldsNoControlCharacters) {
    const Tree& t = tree();
    std::vector<std::string> problems;
    int markdown = 0;
    for (const auto& f : t.files) {
        if (f.size() < 3 || f.compare(f.size() - 3, 3, ".md") != 0) continue;
        ++markdown;
        const std::string text = text_of(t, f);
        int line = 1;
        for (unsigned char c : text) {
            if (c == '\n') { ++line; continue; }
            if (c < 0x20 || c == 0x7f) {
                char code[8];
                std::snprintf(code, sizeof code, "0x%02x", c);
                problems.push_back(f + ":" + std::to_string(line) + ": control character " + code);
            }
        }
    }
    EXPECT_GT(markdown, 10) << "the scan found too few Markdown files";
    EXPECT_TRUE(problems.empty()) << "control characters in the Markdown (a lost backslash?):\n" << report(problems);
}
