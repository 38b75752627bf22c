// `quintet prepare`: text file -> HDF5 token file (io/token_data.hpp), training a byte-level BPE
// on the input first when asked. Runs on one process (rank 0) and makes no MPI calls; user
// mistakes (options, input file) are ConfigErrors naming the option, the value and what is valid.
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "quintet/core/error.hpp"
#include "quintet/io/token_data.hpp"
#include "quintet/io/tokenizer.hpp"
#include "quintet/tools/commands.hpp"

namespace quintet {
namespace {

namespace po = boost::program_options;
using Clock = std::chrono::steady_clock;

constexpr int kMaxVocab = 1 << 20;  // beyond this BPE training memory, not usefulness, dominates

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

[[noreturn]] void bad_option(const std::string& option, const std::string& value,
                             const std::string& valid) {
    throw ConfigError("prepare option --" + option + " = '" + value + "': " + valid);
}

std::string read_input(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::exists(path, ec)) bad_option("input", path, "file does not exist");
    if (fs::is_directory(path, ec))
        bad_option("input", path, "is a directory; expected a text file");
    std::ifstream in(path, std::ios::binary);
    if (!in) bad_option("input", path, "file cannot be opened for reading");
    std::ostringstream buf;
    buf << in.rdbuf();
    if (in.bad()) bad_option("input", path, "read failed");
    std::string text = std::move(buf).str();
    if (text.size() < 2)
        bad_option("input", path, "holds " + std::to_string(text.size()) +
                                      " byte(s); need at least 2 to make one training pair");
    return text;
}

// Throttles progress lines to one every couple of seconds, so short inputs print none.
struct ProgressPrinter {
    Clock::time_point start = Clock::now(), last = start;
    bool due() {
        if (std::chrono::duration<double>(Clock::now() - last).count() < 2.0) return false;
        last = Clock::now();
        return true;
    }
};

const char* kUsage =
    "quintet prepare: turn a text file into an HDF5 token file for `quintet train`.\n"
    "\n"
    "Usage: quintet prepare --input FILE.txt --tokenizer byte|bpe [--vocab-size N] --output "
    "data.h5\n"
    "\n"
    "The input is read as raw bytes (any encoding; invalid UTF-8 is fine) and tokenized by\n"
    "  byte  one token per byte, vocab_size 256;\n"
    "  bpe   byte-level BPE trained on the input itself: GPT-2-like pre-split (a leading space\n"
    "        joins the following word, digit run or punctuation run), then the most frequent\n"
    "        adjacent pair is merged until the vocabulary has --vocab-size tokens.\n"
    "The output holds /tokens (uint16 if vocab_size <= 65536, else uint32), the attributes\n"
    "vocab_size, tokenizer and format_version, and for bpe the merges (/tokenizer/merges), so\n"
    "the tokenizer travels with the data. It is written to OUTPUT.tmp and renamed when complete.\n"
    "\n"
    "Options";

}  // namespace

int prepare_main(int argc, char** argv) {
    std::string input, tokenizer, output;
    int vocab_size = 4096;
    po::options_description opts(kUsage);
    opts.add_options()
        ("help,h", "print this help and exit")
        ("input", po::value(&input)->value_name("FILE"), "text file to tokenize (required)")
        ("tokenizer", po::value(&tokenizer)->value_name("byte|bpe"),
         "tokenizer to use (required): byte or bpe")
        ("vocab-size", po::value(&vocab_size)->default_value(4096)->value_name("N"),
         "bpe only: vocabulary size including the 256 byte tokens; 257 .. 1048576. "
         "Fewer tokens result if the input runs out of pairs to merge")
        ("output", po::value(&output)->value_name("FILE"),
         "HDF5 token file to write (required); its directory must exist");
    po::variables_map vm;
    try {
        po::store(po::command_line_parser(argc, argv)
                      .options(opts)
                      .positional(po::positional_options_description())  // none allowed
                      .run(), vm);
        po::notify(vm);
    } catch (const po::error& e) {
        throw ConfigError(std::string("quintet prepare: ") + e.what() +
                          " (see `quintet prepare --help`)");
    }
    if (vm.count("help")) {
        std::cout << opts << "\nExample:\n  quintet prepare --input data/tinyshakespeare.txt "
                             "--tokenizer bpe --vocab-size 4096 --output data/shakespeare.h5\n";
        return 0;
    }
    for (const char* required : {"input", "tokenizer", "output"})
        if (!vm.count(required))
            throw ConfigError(std::string("quintet prepare: option --") + required +
                              " is required (see `quintet prepare --help`)");
    if (tokenizer != "byte" && tokenizer != "bpe")
        bad_option("tokenizer", tokenizer, "valid values are byte, bpe");
    if (tokenizer == "bpe" && (vocab_size <= 256 || vocab_size > kMaxVocab))
        bad_option("vocab-size", std::to_string(vocab_size),
                   "must be in 257 .. " + std::to_string(kMaxVocab) +
                       " (the 256 byte tokens plus at least one merge)");
    if (tokenizer == "byte" && !vm["vocab-size"].defaulted() && vocab_size != 256)
        bad_option("vocab-size", std::to_string(vocab_size),
                   "applies to --tokenizer bpe only; the byte tokenizer's vocab is always 256");
    {
        namespace fs = std::filesystem;
        std::error_code ec;
        fs::path dir = fs::absolute(output, ec).parent_path();
        if (!fs::is_directory(dir, ec))
            bad_option("output", output, "directory '" + dir.string() + "' does not exist");
        if (fs::exists(output, ec) && fs::equivalent(input, output, ec))
            bad_option("output", output, "is the input file; choose another path");
    }

    const auto t0 = Clock::now();
    const std::string text = read_input(input);
    std::cout << "prepare: read '" << input << "' (" << text.size() << " bytes)" << std::endl;

    Tokenizer tok;  // byte by default
    if (tokenizer == "bpe") {
        ProgressPrinter pp;
        const auto t_train = Clock::now();
        tok = tokenizer_train_bpe(text, vocab_size, [&](int done, int total) {
            if (done < total && !pp.due()) return;
            double s = seconds_since(t_train);
            std::printf("prepare: bpe merges %d / %d (%.1f%%), %.0f merges/s\n", done, total,
                        100.0 * done / total, s > 0 ? done / s : 0.0);
            std::fflush(stdout);
        });
        if (tok.vocab_size() < vocab_size)
            std::cout << "prepare: note: the input only supports " << tok.merges.size()
                      << " merges, so vocab_size = " << tok.vocab_size() << " instead of "
                      << vocab_size << std::endl;
        std::printf("prepare: trained bpe, vocab %d, in %.2f s\n", tok.vocab_size(),
                    seconds_since(t_train));
    }

    ProgressPrinter pp;
    bool printed = false;  // a short encode prints no progress at all, not even 100%
    const auto t_enc = Clock::now();
    std::vector<uint32_t> tokens = tok.encode(text, [&](size_t done, size_t total) {
        if (done < total ? !pp.due() : !printed) return;
        printed = true;
        double s = seconds_since(t_enc);
        std::printf("prepare: encoded %.1f / %.1f MB (%.1f%%), %.1f MB/s\n", done / 1e6,
                    total / 1e6, 100.0 * done / total, s > 0 ? done / 1e6 / s : 0.0);
        std::fflush(stdout);
    });
    if (tokens.size() < 2)
        bad_option("input", input, "encodes to " + std::to_string(tokens.size()) +
                                       " token(s); need at least 2");

    token_file_write(output, tokens, tok);
    std::printf("prepare: %zu bytes -> %zu tokens (%.2f bytes/token), tokenizer %s, vocab %d, "
                "stored as %s in '%s' (%.2f s)\n",
                text.size(), tokens.size(), double(text.size()) / double(tokens.size()),
                tok.kind.c_str(), tok.vocab_size(), tok.vocab_size() <= 65536 ? "uint16" : "uint32",
                output.c_str(), seconds_since(t0));
    return 0;
}

}  // namespace quintet
