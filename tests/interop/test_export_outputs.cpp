// Where export and import write (docs/interop.md, "Where the output goes"): `--force` replaces
// only an earlier output of quintet's own, by building the new one beside it and swapping; the
// root, the home folder, the current folder (or one holding it), a directory or file quintet did
// not write are refused with exit 2 and one line, whatever the flags; "dir/" is "dir". Every case
// runs the real binary and compares a snapshot of the whole scratch tree (every path, its kind
// and its bytes) before and after, so nothing else on disk may change.
// ctest: labels=interop timeout=600 launches_mpirun
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "quintet/core/error.hpp"
#include "quintet/interop/output_path.hpp"
#include "support/run_support.hpp"

namespace fs = std::filesystem;
using quintet::testing::read_file;
using quintet::testing::run_quintet;
using quintet::testing::run_shell;
using quintet::testing::write_file;

namespace {

const char* kDeck = R"([model]
d_model = 16
n_layers = 1
n_heads = 2
ffn_dim = 32
[data]
seq_len = 16
micro_batch_size = 1
[train]
steps = 1
warmup = 0
[eval]
every = 0
[output]
log_every = 1
)";

// Every path under `root` (relative), "d" for a directory, "l:<target>" for a link, else the
// file's bytes.
std::map<std::string, std::string> snapshot(const fs::path& root) {
    std::map<std::string, std::string> s;
    for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
        const fs::path rel = fs::relative(it->path(), root);
        if (it->is_symlink()) s[rel.string()] = "l:" + fs::read_symlink(it->path()).string();
        else if (it->is_directory()) s[rel.string()] = "d";
        else s[rel.string()] = read_file(it->path());
    }
    return s;
}

// The paths whose entry differs between two snapshots (added, removed or changed).
std::string differences(const std::map<std::string, std::string>& a, const std::map<std::string, std::string>& b) {
    std::string out;
    for (const auto& [k, v] : a)
        if (!b.count(k)) out += " removed:" + k;
        else if (b.at(k) != v) out += " changed:" + k;
    for (const auto& [k, v] : b)
        if (!a.count(k)) out += " added:" + k;
    return out;
}

// The entries of a snapshot outside `prefix`.
std::map<std::string, std::string> without(const std::string& prefix, const std::map<std::string, std::string>& s) {
    std::map<std::string, std::string> rest;
    for (const auto& [k, v] : s)
        if (k.rfind(prefix, 0) != 0) rest[k] = v;
    return rest;
}

// One line of output: the error, no MPI or rank noise.
void expect_one_clean_line(const quintet::testing::RunResult& r, const std::string& needle) {
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_EQ(r.output.rfind("quintet: error: ", 0), 0u) << r.output;
    EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << "more than one line:\n" << r.output;
    EXPECT_EQ(r.output.find("MPI"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
}

class ExportOutputs : public ::testing::Test {
protected:
    static fs::path base;  // the checkpoint and the token file, made once
    static std::string ckpt;
    fs::path dir;          // this test's own tree, snapshotted

    static void SetUpTestSuite() {
        base = quintet::testing::scratch_dir("export_outputs");
        write_file(base / "model.deck", kDeck);
        quintet::testing::make_token_file(base / "tokens.h5", 4000, 256, 3);
        const auto r = run_quintet(0, "train " + (base / "model.deck").string() + " --data.path=" +
                                          (base / "tokens.h5").string() + " --output.run_dir=" + (base / "run").string());
        ASSERT_EQ(r.status, 0) << r.output;
        ckpt = (base / "run/checkpoints/step_00000001.h5").string();
    }
    void SetUp() override {
        dir = quintet::testing::scratch_dir(std::string("export_outputs_") +
                                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
        // Things a user keeps beside their exports.
        fs::create_directories(dir / "work/src");
        fs::create_directories(dir / "home");
        write_file(dir / "work/notes.txt", "my notes\n");
        write_file(dir / "work/src/main.c", "int main(void) { return 0; }\n");
        write_file(dir / "work/hf.tmp", "an unrelated file named like the old temporary\n");
    }
    // `quintet ARGS` run with `cwd` as the current folder (and HOME = dir/home).
    quintet::testing::RunResult in(const fs::path& cwd, const std::string& args) {
        fs::create_directories(dir / "home");
        return run_shell("cd '" + cwd.string() + "' && HOME='" + (dir / "home").string() + "' '" + QUINTET_BINARY + "' " +
                         args);
    }
    std::string export_hf(const std::string& output, const std::string& extra = "") {
        return "export --checkpoint " + ckpt + " --format hf --output " + output + " " + extra;
    }
};

fs::path ExportOutputs::base;
std::string ExportOutputs::ckpt;

// `--output . --force` deleted every file of the current folder, then failed.
TEST_F(ExportOutputs, TheCurrentFolderIsNeverReplaced) {
    const auto before = snapshot(dir);
    expect_one_clean_line(in(dir / "work", export_hf(".", "--force")), "the current folder");
    expect_one_clean_line(in(dir / "work", export_hf("./", "--force")), "the current folder");
    expect_one_clean_line(in(dir / "work/src", export_hf("..", "--force")), "holds the current folder");
    expect_one_clean_line(in(dir / "work", export_hf(".")), "the current folder");
    EXPECT_EQ(differences(before, snapshot(dir)), "");
}

// The home folder, with or without a trailing slash, and a folder that holds it.
TEST_F(ExportOutputs, TheHomeFolderIsNeverReplaced) {
    fs::create_directories(dir / "home/models");
    write_file(dir / "home/.bashrc", "export PATH=$PATH\n");
    const auto before = snapshot(dir);
    const std::string home = (dir / "home").string();
    expect_one_clean_line(in(dir / "work", export_hf(home, "--force")), "the home folder");
    expect_one_clean_line(in(dir / "work", export_hf(home + "/", "--force")), "the home folder");
    expect_one_clean_line(in(dir / "work", export_hf(dir.string(), "--force")), "holds the home folder");
    expect_one_clean_line(in(dir / "work", "import --format hf --input " + home + " --output " + home + "/ --force"),
                          "the home folder");
    EXPECT_EQ(differences(before, snapshot(dir)), "");
}

// The root folder, checked by the function the commands call (a command is not run on "/": a
// mistake here would be unbounded), in the spellings a shell produces.
TEST_F(ExportOutputs, TheRootFolderIsNeverReplaced) {
    for (const std::string root : {"/", "//", "/.", "/../"})
        for (const auto kind : {quintet::OutputKind::directory, quintet::OutputKind::file}) {
            try {
                quintet::output_check(root, kind, /*force=*/true, "export: --output", "a directory such as hf/",
                                      [](const fs::path&) { return std::string(); });
                ADD_FAILURE() << root << " was accepted";
            } catch (const quintet::ConfigError& e) {
                EXPECT_NE(std::string(e.what()).find("the root folder"), std::string::npos) << e.what();
            }
        }
}

// `--output mydir --force` on an unrelated directory silently deleted its files.
TEST_F(ExportOutputs, AnUnrelatedDirectoryIsRefusedWhateverTheFlags) {
    const auto before = snapshot(dir);
    for (const std::string flags : {"", "--force"}) {
        const auto r = in(dir, export_hf("work", flags));
        EXPECT_EQ(r.status, 2) << r.output;
        if (flags.empty()) EXPECT_NE(r.output.find("give --force"), std::string::npos) << r.output;
        else expect_one_clean_line(r, "is not an earlier output of this command (it holds 'hf.tmp'");
        expect_one_clean_line(in(dir, export_hf("work/src/", "--force")), "it holds 'main.c'");
    }
    // A downloaded model directory (Transformers' own generation_config.json) is not quintet's.
    fs::create_directories(dir / "downloaded");
    write_file(dir / "downloaded/config.json", "{}\n");
    write_file(dir / "downloaded/model.safetensors", "weights");
    write_file(dir / "downloaded/generation_config.json", "{\"do_sample\": false, \"transformers_version\": \"4.44\"}\n");
    const auto before2 = snapshot(dir);
    expect_one_clean_line(in(dir, export_hf("downloaded", "--force")), "not the ones quintet writes");
    // A file where a directory is written.
    expect_one_clean_line(in(dir, export_hf("work/notes.txt", "--force")), "is a file, but this command writes a directory");
    EXPECT_EQ(differences(before2, snapshot(dir)), "");
    fs::remove_all(dir / "downloaded");
    EXPECT_EQ(differences(before, snapshot(dir)), "");
}

// `--output prev_export/ --force` deleted the earlier export and wrote nothing. Now the new export
// takes its place (its config says bf16) and nothing else changes: no temporary left behind, the
// file named like the old temporary untouched.
TEST_F(ExportOutputs, AnEarlierExportIsReplacedInPlace) {
    auto r = in(dir / "work", export_hf("hf"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(read_file(dir / "work/hf/config.json").find("\"float32\""), std::string::npos);
    const auto before = snapshot(dir);
    r = in(dir / "work", export_hf("hf/", "--force --dtype bf16"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(read_file(dir / "work/hf/config.json").find("\"bfloat16\""), std::string::npos);
    const auto after = snapshot(dir);
    EXPECT_EQ(differences(without("work/hf/", before), without("work/hf/", after)), "");
    // The same files as before, the weights rewritten (bf16).
    for (const auto& [k, v] : before)
        if (k.rfind("work/hf/", 0) == 0) EXPECT_TRUE(after.count(k)) << k;
    EXPECT_NE(after.at("work/hf/model.safetensors"), before.at("work/hf/model.safetensors"));
    // Without --force an earlier export stays as it is.
    expect_one_clean_line(in(dir / "work", export_hf("hf")), "give --force");
    EXPECT_EQ(differences(after, snapshot(dir)), "");
    // An earlier export with a file of the user's added is no longer quintet's alone.
    write_file(dir / "work/hf/README.md", "my model card\n");
    const auto with_readme = snapshot(dir);
    expect_one_clean_line(in(dir / "work", export_hf("hf", "--force")), "it holds 'README.md'");
    EXPECT_EQ(differences(with_readme, snapshot(dir)), "");
}

// An empty directory (made by hand, or by `mkdir`) is filled without --force: nothing is lost. A
// missing parent folder is created for a directory output.
TEST_F(ExportOutputs, AnEmptyOrNewDirectoryIsWritten) {
    fs::create_directories(dir / "work/empty");
    auto r = in(dir / "work", export_hf("empty/"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_TRUE(fs::exists(dir / "work/empty/config.json"));
    r = in(dir / "work", export_hf("new/sub/hf/"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_TRUE(fs::exists(dir / "work/new/sub/hf/model.safetensors"));
    // Readable by others as a directory made with mkdir is (the temporary it was built in was 0700).
    const auto perms = fs::status(dir / "work/new/sub/hf").permissions();
    EXPECT_NE(perms & fs::perms::others_read, fs::perms::none);
    EXPECT_NE(perms & fs::perms::owner_write, fs::perms::none);
    for (const auto& e : fs::directory_iterator(dir / "work"))
        EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

// `import --output . --force` gave raw file system errors and MPI noise (exit 1). A file that is
// not an earlier import (a trained checkpoint, a text file) is refused; an earlier import is
// replaced.
TEST_F(ExportOutputs, ImportReplacesOnlyAnEarlierImport) {
    ASSERT_EQ(in(dir, export_hf("hf")).status, 0);
    const std::string hf = (dir / "hf").string();
    auto import = [&](const std::string& out, const std::string& flags) {
        return in(dir / "work", "import --format hf --input " + hf + " --output " + out + " " + flags);
    };
    const auto before = snapshot(dir);
    expect_one_clean_line(import(".", "--force"), "the current folder");
    expect_one_clean_line(import("src", "--force"), "is a folder, but this command writes one file");
    expect_one_clean_line(import("newdir/", "--force"), "names a folder, but this command writes one file");
    expect_one_clean_line(import("notes.txt", "--force"), "it is not a quintet checkpoint");
    expect_one_clean_line(import("notes.txt", ""), "give --force");
    fs::copy(ckpt, dir / "work/trained.h5");
    const auto before2 = snapshot(dir);
    expect_one_clean_line(import("trained.h5", "--force"), "step 1, not an import");
    EXPECT_EQ(differences(before2, snapshot(dir)), "");
    fs::remove(dir / "work/trained.h5");
    EXPECT_EQ(differences(before, snapshot(dir)), "");
    ASSERT_EQ(import("model.h5", "").status, 0);
    const auto imported = snapshot(dir);
    const auto r = import("model.h5", "--force");
    ASSERT_EQ(r.status, 0) << r.output;
    const std::string changed = differences(imported, snapshot(dir));
    EXPECT_TRUE(changed.empty() || changed == " changed:work/model.h5") << changed;
}

// `export --format gguf --output EXISTING_DIR --force` failed with exit 1 and MPI noise after
// writing the whole file. Every output path is checked before any work: a folder, a path ending
// in '/', a missing folder, a file that is not quintet's GGUF; an earlier GGUF is replaced.
TEST_F(ExportOutputs, GgufOutputPathsAreCheckedBeforeAnyWork) {
    auto gguf = [&](const std::string& out, const std::string& flags) {
        return in(dir / "work", "export --checkpoint " + ckpt + " --format gguf --output " + out + " " + flags);
    };
    const auto before = snapshot(dir);
    expect_one_clean_line(gguf("src", "--force"), "is a folder, but this command writes one file: give a file such as model.gguf");
    expect_one_clean_line(gguf("model.gguf/", "--force"), "names a folder");
    expect_one_clean_line(gguf("missing/model.gguf", ""), "the folder 'missing' does not exist");
    expect_one_clean_line(gguf("notes.txt", "--force"), "it is not a GGUF file");
    expect_one_clean_line(gguf(".", "--force"), "the current folder");
    EXPECT_EQ(differences(before, snapshot(dir)), "");
    ASSERT_EQ(gguf("model.gguf", "").status, 0);
    const auto first = snapshot(dir);
    expect_one_clean_line(gguf("model.gguf", ""), "give --force");
    const auto r = gguf("model.gguf", "--force --dtype f16");
    ASSERT_EQ(r.status, 0) << r.output;
    const auto second = snapshot(dir);
    EXPECT_EQ(differences(first, second), " changed:work/model.gguf");
    // A GGUF file of someone else's (general.name another model's) is not replaced.
    std::string other = second.at("work/model.gguf");
    const size_t at = other.find("quintet");
    ASSERT_NE(at, std::string::npos);
    other.replace(at, 7, "llama-3");
    write_file(dir / "work/other.gguf", other);
    const auto third = snapshot(dir);
    expect_one_clean_line(gguf("other.gguf", "--force"), "a GGUF file that quintet did not write");
    EXPECT_EQ(differences(third, snapshot(dir)), "");
}

}  // namespace
