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

// C-style escapes in --split-on: \n \t \r \\ (so a blank line is "\n\n").
std::string unescape(const std::string& s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] != '\\' || i + 1 == s.size()) {
            out += s[i];
            continue;
        }
        const char c = s[++i];
        out += c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
    }
    return out;
}

const char* kUsage =
    "quintet prepare: turn text files into an HDF5 token file for `quintet train`.\n"
    "\n"
    "Usage: quintet prepare --input FILE.txt [--input MORE.txt ...] [--split-on SEP]\n"
    "                       --tokenizer byte|bpe [--vocab-size N] [--eos-byte B] --output data.h5\n"
    "\n"
    "Documents: with several --input files, or --split-on SEP (cuts each input at every SEP;\n"
    "escapes \\n \\t \\r), the data is a sequence of documents, each ended by an end-of-document\n"
    "token whose id is stored in the file (attribute eos_id): for bpe a reserved id after the\n"
    "merges (vocab_size = 256 + merges + 1), for byte the byte --eos-byte (default 0). Training\n"
    "with data.document_mask = true then keeps attention inside each document.\n"
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
    std::vector<std::string> inputs;
    std::string tokenizer, output, split_on;
    int vocab_size = 4096, eos_byte = 0;
    po::options_description opts(kUsage);
    opts.add_options()
        ("help,h", "print this help and exit")
        ("input", po::value(&inputs)->composing()->value_name("FILE"),
         "text file to tokenize (required); repeat for several documents")
        ("split-on", po::value(&split_on)->value_name("SEP"),
         "cut each input into documents at every occurrence of SEP (C escapes: \\n \\t \\r)")
        ("eos-byte", po::value(&eos_byte)->default_value(0)->value_name("B"),
         "byte tokenizer with documents: the byte (0 .. 255) that ends each document")
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
    if (eos_byte < 0 || eos_byte > 255)
        bad_option("eos-byte", std::to_string(eos_byte), "must be a byte, 0 .. 255");
    if (vm.count("split-on") && unescape(split_on).empty())
        bad_option("split-on", split_on, "must not be empty");
    {
        namespace fs = std::filesystem;
        std::error_code ec;
        fs::path dir = fs::absolute(output, ec).parent_path();
        if (!fs::is_directory(dir, ec))
            bad_option("output", output, "directory '" + dir.string() + "' does not exist");
        for (const auto& input : inputs)
            if (fs::exists(output, ec) && fs::equivalent(input, output, ec))
                bad_option("output", output, "is an input file; choose another path");
    }

    const auto t0 = Clock::now();
    // The documents: every input, cut at --split-on; empty pieces are dropped.
    std::vector<std::string> docs;
    size_t total_bytes = 0;
    const std::string sep = unescape(split_on);
    for (const auto& input : inputs) {
        const std::string text = read_input(input);
        std::cout << "prepare: read '" << input << "' (" << text.size() << " bytes)" << std::endl;
        total_bytes += text.size();
        if (sep.empty()) {
            docs.push_back(text);
            continue;
        }
        for (size_t at = 0; at <= text.size();) {
            size_t next = text.find(sep, at);
            if (next == std::string::npos) next = text.size();
            if (next > at) docs.push_back(text.substr(at, next - at));
            at = next + sep.size();
        }
    }
    const bool documents = inputs.size() > 1 || !sep.empty();
    std::string text;  // what the BPE is trained on: the documents, newline-separated
    for (size_t i = 0; i < docs.size(); ++i) text += (i ? "\n" : "") + docs[i];
    if (documents) std::cout << "prepare: " << docs.size() << " documents" << std::endl;

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

    if (documents) tok.eos_id = tok.kind == "bpe" ? 256 + int(tok.merges.size()) : eos_byte;
    if (documents && tok.kind == "byte" && text.find(char(eos_byte)) != std::string::npos)
        std::cout << "prepare: warning: the text itself contains byte " << eos_byte
                  << ", which also ends documents; choose another --eos-byte" << std::endl;
    tok.build_tables();
    ProgressPrinter pp;
    bool printed = false;  // a short encode prints no progress at all, not even 100%
    const auto t_enc = Clock::now();
    std::vector<uint32_t> tokens;
    size_t done_before = 0;
    for (const auto& doc : docs) {  // each document on its own: no BPE chunk crosses a boundary
        std::vector<uint32_t> ids = tok.encode(doc, [&](size_t done, size_t) {
            const size_t d = done_before + done;
            if (d < total_bytes ? !pp.due() : !printed) return;
            printed = true;
            double s = seconds_since(t_enc);
            std::printf("prepare: encoded %.1f / %.1f MB (%.1f%%), %.1f MB/s\n", d / 1e6,
                        total_bytes / 1e6, 100.0 * d / total_bytes, s > 0 ? d / 1e6 / s : 0.0);
            std::fflush(stdout);
        });
        done_before += doc.size();
        tokens.insert(tokens.end(), ids.begin(), ids.end());
        if (documents) tokens.push_back(uint32_t(tok.eos_id));
    }
    if (tokens.size() < 2)
        bad_option("input", inputs[0], "encodes to " + std::to_string(tokens.size()) +
                                           " token(s); need at least 2");

    token_file_write(output, tokens, tok);
    std::printf("prepare: %zu bytes -> %zu tokens (%.2f bytes/token), tokenizer %s, vocab %d, "
                "stored as %s in '%s' (%.2f s)\n",
                total_bytes, tokens.size(), double(total_bytes) / double(tokens.size()),
                tok.kind.c_str(), tok.vocab_size(), tok.vocab_size() <= 65536 ? "uint16" : "uint32",
                output.c_str(), seconds_since(t0));
    if (documents)
        std::printf("prepare: %zu documents, each ended by token %d (attribute eos_id)\n",
                    docs.size(), tok.eos_id);
    return 0;
}

}  // namespace quintet
