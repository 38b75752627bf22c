// `quintet prepare`: text files -> HDF5 token file (io/token_data.hpp), with any tokenizer quintet
// knows (tokenizer/tokenizer_spec.hpp), training quintet's own bpe on the input first when asked.
// Collective: every rank reads the inputs and encodes a share of them on all its threads; rank 0
// gathers the ids and writes the file. User mistakes (options, input files, tokenizer files) are
// ConfigErrors naming the option, the value and what is valid, raised before any work.
#include <boost/program_options.hpp>

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/core/error.hpp"
#include "quintet/io/token_data.hpp"
#include "quintet/tokenizer/byte_bpe.hpp"
#include "quintet/tokenizer/tokenizer.hpp"
#include "quintet/tokenizer/tokenizer_spec.hpp"
#include "quintet/tools/commands.hpp"
#include "prepare_corpus.hpp"

namespace quintet {
namespace {

namespace po = boost::program_options;
using Clock = std::chrono::steady_clock;

constexpr int kMaxVocab = 1 << 20;  // beyond this BPE training memory, not usefulness, dominates
constexpr size_t kPartBytes = size_t(1) << 20;  // the largest unit of work shared by threads and ranks

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

[[noreturn]] void bad_option(const std::string& option, const std::string& value, const std::string& valid) {
    throw ConfigError("prepare option --" + option + " = '" + value + "': " + valid);
}

std::string read_input(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::exists(path, ec)) bad_option("input", path, "file does not exist");
    if (fs::is_directory(path, ec)) bad_option("input", path, "is a directory; expected a text file");
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

// --bos / --eos: a special token's text, or an id of the vocabulary.
int resolve_token(const std::string& option, const std::string& value, const Tokenizer& tok) {
    if (!value.empty() && std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        const long long id = value.size() > 10 ? -1 : std::stoll(value);
        if (id < 0 || id >= tok.vocab_size())
            bad_option(option, value, "not an id of " + tok.describe() + "; valid: 0 .. " +
                                          std::to_string(tok.vocab_size() - 1) + ", or a special token's text");
        return int(id);
    }
    if (const int id = tok.special_id(value); id >= 0) return id;
    std::string names;
    for (size_t i = 0; i < tok.specials().size() && i < 12; ++i) names += (i ? ", " : "") + tok.specials()[i].text;
    if (tok.specials().size() > 12) names += ", ... (" + std::to_string(tok.specials().size()) + " in all)";
    bad_option(option, value, "not a special token of " + tok.describe() + "; valid: " +
                                  (names.empty() ? std::string("an id (it has no special tokens)") : names + ", or an id"));
}

// The end-of-document token a tokenizer has by one of the usual names, or -1.
int default_end_of_document(const Tokenizer& tok) {
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"})
        if (const int id = tok.special_id(name); id >= 0) return id;
    return -1;
}

const char* kUsage =
    "quintet prepare: turn text files into an HDF5 token file for `quintet train`.\n"
    "\n"
    "Usage: [mpirun -n N] quintet prepare --input FILE.txt [--input MORE.txt ...] [--split-on SEP]\n"
    "                       --tokenizer SPEC [--vocab-size N] [--bos T] [--eos T] --output data.h5\n"
    "       [mpirun -n N] quintet prepare --input DIR|GLOB|FILE[.gz] ... [--jsonl-key KEY]\n"
    "                       --tokenizer SPEC [--train-sample BYTES] --shard-tokens N --output DIR\n"
    "\n"
    "SPEC (docs/tokenizers.md):\n"
    "  byte              one token per byte, vocab_size 256;\n"
    "  bpe               quintet's byte-level BPE, trained on the input itself: GPT-2 pre-tokenizer\n"
    "                    pattern, then the most frequent adjacent pair is merged until the\n"
    "                    vocabulary has --vocab-size tokens;\n"
    "  tiktoken:FILE     a .tiktoken rank file (cl100k_base, o200k_base, r50k_base, Llama 3), with\n"
    "                    --tokenizer-pattern and --tokenizer-specials;\n"
    "  hf:FILE           a Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama 3, Qwen 2);\n"
    "  spm:FILE          a SentencePiece .model (Llama 2, Mistral, Gemma).\n"
    "\n"
    "Documents: with several --input files, or --split-on SEP (cuts each input at every SEP;\n"
    "escapes \\n \\t \\r), the data is a sequence of documents, each ended by an end-of-document\n"
    "token whose id is stored in the file (attribute eos_id): --eos, else the tokenizer's\n"
    "<|endoftext|> (bpe: a reserved id after the merges), <|end_of_text|>, </s> or <eos>; for\n"
    "byte the byte --eos-byte (default 0). --bos T puts T before each document (attribute\n"
    "bos_id), --eos T after it, also for a single input. T: a special token's text or an id.\n"
    "Training with data.document_mask = true then keeps attention inside each document.\n"
    "\n"
    "The input is read as raw bytes; special-token text in it is ordinary text. Encoding runs on\n"
    "all threads of every rank. The output holds /tokens (uint16 if vocab_size <= 65536, else\n"
    "uint32), the attributes vocab_size, tokenizer and format_version, and the tokenizer itself\n"
    "(/tokenizer), so it travels with the data. It is written to OUTPUT.tmp and renamed when complete.\n"
    "\n"
    "Corpora (docs/data.md): --input may be a directory (its files, recursively) or a glob, and\n"
    "files ending in .gz are decompressed. --jsonl-key KEY reads every input as JSON Lines, one\n"
    "document per line (the string field KEY). --shard-tokens N writes shard_000000.h5, ... of N\n"
    "tokens each into the directory --output. These inputs are streamed in bounded memory (a\n"
    "document's parts of 8 MB; a document that cannot be cut, or cut by --split-on, is held\n"
    "whole); under mpirun the files (large plain or JSON Lines files in pieces of about 64 MiB)\n"
    "are shared out over the ranks, and the shards do not depend on the number of ranks. bpe\n"
    "trains on the first --train-sample bytes of the documents (0 = all).\n"
    "\n"
    "Options";

// One unit of encoding: text[begin, end) of document `doc`.
struct Part {
    size_t doc = 0, begin = 0, end = 0;
};

}  // namespace

int prepare_main(int argc, char** argv, MPI_Comm world_handle) {
    const MpiCommunicator world(world_handle, "world");
    const int rank = world.rank(), size = world.size();
    std::vector<std::string> inputs;
    std::string tokenizer, pattern, specials, output, split_on, bos, eos, jsonl_key;
    int vocab_size = 4096, eos_byte = 0;
    int64_t shard_tokens = 0, train_sample = 0;
    po::options_description opts(kUsage);
    opts.add_options()
        ("help,h", "print this help and exit")
        ("input", po::value(&inputs)->composing()->value_name("FILE"),
         "text file to tokenize (required); repeat for several documents")
        ("split-on", po::value(&split_on)->value_name("SEP"),
         "cut each input into documents at every occurrence of SEP (C escapes: \\n \\t \\r)")
        ("tokenizer", po::value(&tokenizer)->value_name("SPEC"), "tokenizer to use (required): see above")
        ("tokenizer-pattern", po::value(&pattern)->value_name("P"),
         "tiktoken: cl100k_base | o200k_base | gpt2 | llama3 | a regex (default: FILE's stem)")
        ("tokenizer-specials", po::value(&specials)->value_name("S"),
         "tiktoken: special tokens: a preset name, none, or TEXT=ID,... (default: the pattern's)")
        ("vocab-size", po::value(&vocab_size)->default_value(4096)->value_name("N"),
         "bpe only: vocabulary size including the 256 byte tokens; 257 .. 1048576. "
         "Fewer tokens result if the input runs out of pairs to merge")
        ("bos", po::value(&bos)->value_name("T"), "token before each document (text of a special token, or an id)")
        ("eos", po::value(&eos)->value_name("T"), "token after each document (text of a special token, or an id)")
        ("eos-byte", po::value(&eos_byte)->default_value(0)->value_name("B"),
         "byte tokenizer with documents: the byte (0 .. 255) that ends each document")
        ("output", po::value(&output)->value_name("FILE"),
         "HDF5 token file to write (required); its directory must exist. With --shard-tokens: a directory")
        ("jsonl-key", po::value(&jsonl_key)->value_name("KEY"),
         "the inputs are JSON Lines: one document per line, its text the string field KEY")
        ("shard-tokens", po::value(&shard_tokens)->value_name("N"),
         "write shards of N tokens (the last may be longer by at most N) into the directory --output")
        ("train-sample", po::value(&train_sample)->value_name("BYTES"),
         "bpe: train on the first BYTES of the documents (0 = all of them)");
    po::variables_map vm;
    try {
        po::store(po::command_line_parser(argc, argv)
                      .options(opts)
                      .positional(po::positional_options_description())  // none allowed
                      .run(), vm);
        po::notify(vm);
    } catch (const po::error& e) {
        throw ConfigError(std::string("quintet prepare: ") + e.what() + " (see `quintet prepare --help`)");
    }
    if (vm.count("help")) {
        if (rank == 0)
            std::cout << opts << "\nExample:\n  quintet prepare --input data/tinyshakespeare.txt "
                                 "--tokenizer bpe --vocab-size 4096 --output data/shakespeare.h5\n";
        return 0;
    }
    for (const char* required : {"input", "tokenizer", "output"})
        if (!vm.count(required))
            throw ConfigError(std::string("quintet prepare: option --") + required +
                              " is required (see `quintet prepare --help`)");
    const bool is_bpe = tokenizer == "bpe";
    if (vm.count("shard-tokens") && shard_tokens < 2)
        bad_option("shard-tokens", std::to_string(shard_tokens), "must be at least 2 (tokens per shard)");
    if (vm.count("train-sample") && (train_sample < 0 || !is_bpe))
        bad_option("train-sample", std::to_string(train_sample),
                   train_sample < 0 ? "must be >= 0 bytes" : "applies to --tokenizer bpe only");
    if (vm.count("jsonl-key") && jsonl_key.empty()) bad_option("jsonl-key", "", "must name a field");
    if (vm.count("jsonl-key") && vm.count("split-on"))
        bad_option("split-on", split_on, "does not apply to JSON Lines (--jsonl-key): each line is a document");
    // Corpus mode: anything but plain text files into one file.
    bool corpus = shard_tokens > 0 || !jsonl_key.empty() || train_sample > 0;
    for (const auto& in : inputs) {
        std::error_code ec;
        if (in.find_first_of("*?[") != std::string::npos || std::filesystem::is_directory(in, ec) ||
            (in.size() > 3 && in.compare(in.size() - 3, 3, ".gz") == 0))
            corpus = true;
    }
    if (is_bpe && (vocab_size <= 256 || vocab_size > kMaxVocab))
        bad_option("vocab-size", std::to_string(vocab_size),
                   "must be in 257 .. " + std::to_string(kMaxVocab) + " (the 256 byte tokens plus at least one merge)");
    if (!is_bpe && !vm["vocab-size"].defaulted())
        bad_option("vocab-size", std::to_string(vocab_size),
                   "applies to --tokenizer bpe only; the other tokenizers bring their own vocabulary");
    if (tokenizer != "byte" && !vm["eos-byte"].defaulted())
        bad_option("eos-byte", std::to_string(eos_byte), "applies to --tokenizer byte only; use --eos");
    if (eos_byte < 0 || eos_byte > 255) bad_option("eos-byte", std::to_string(eos_byte), "must be a byte, 0 .. 255");
    if (vm.count("split-on") && unescape(split_on).empty()) bad_option("split-on", split_on, "must not be empty");
    if (corpus) {
        namespace fs = std::filesystem;
        std::error_code ec;
        const fs::path dir = shard_tokens > 0 ? fs::absolute(output, ec) : fs::absolute(output, ec).parent_path();
        if (shard_tokens > 0) {
            if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
                bad_option("output", output, "is a file; with --shard-tokens it is the directory of the shards");
            if (!fs::is_directory(dir.parent_path(), ec))
                bad_option("output", output, "directory '" + dir.parent_path().string() + "' does not exist");
            for (const auto& e : fs::directory_iterator(dir, ec))
                if (e.path().extension() == ".h5")
                    bad_option("output", output, "already holds token files (" + e.path().filename().string() +
                                                     "); choose a new or empty directory");
            world.barrier();
            if (rank == 0) fs::create_directories(dir, ec);
            world.barrier();
        } else if (!fs::is_directory(dir, ec)) {
            bad_option("output", output, "directory '" + dir.string() + "' does not exist");
        }
    } else {
        namespace fs = std::filesystem;
        std::error_code ec;
        const fs::path dir = fs::absolute(output, ec).parent_path();
        if (!fs::is_directory(dir, ec)) bad_option("output", output, "directory '" + dir.string() + "' does not exist");
        for (const auto& input : inputs)
            if (fs::exists(output, ec) && fs::equivalent(input, output, ec))
                bad_option("output", output, "is an input file; choose another path");
    }
    // A named tokenizer and the tokens it is asked for are checked before the inputs are read.
    Tokenizer tok;
    if (!is_bpe) {
        tok = tokenizer_load({tokenizer, pattern, specials});
        if (!bos.empty()) resolve_token("bos", bos, tok);
        if (!eos.empty()) resolve_token("eos", eos, tok);
    } else if (!pattern.empty() || !specials.empty()) {
        bad_option(pattern.empty() ? "tokenizer-specials" : "tokenizer-pattern", pattern.empty() ? specials : pattern,
                   "applies to tiktoken:FILE only; bpe uses the GPT-2 pattern");
    } else {
        for (const auto& [option, value] : {std::pair{"bos", bos}, std::pair{"eos", eos}})
            if (!value.empty() && value != kEndOfText && !std::all_of(value.begin(), value.end(), ::isdigit))
                bad_option(option, value, std::string("bpe has one special token, ") + kEndOfText + ", or give an id");
    }

    if (corpus) {
        CorpusJob job;
        job.files = corpus_inputs(inputs);
        job.jsonl_key = jsonl_key;
        job.sep = unescape(split_on);
        job.shard_tokens = shard_tokens;
        job.output = output;
        for (const auto& f : job.files)
            if (std::error_code ec; std::filesystem::exists(output, ec) && std::filesystem::equivalent(f, output, ec))
                bad_option("output", output, "is an input file; choose another path");
        const bool documents = job.files.size() > 1 || !job.sep.empty() || !jsonl_key.empty();
        if (rank == 0)
            std::cout << "prepare: " << job.files.size() << " input file(s)" << (jsonl_key.empty() ? "" : ", JSON Lines")
                      << std::endl;
        if (is_bpe) {
            std::vector<uint32_t> flat;
            if (rank == 0) {
                const std::string text = corpus_sample_text(job, size_t(train_sample));
                ProgressPrinter pp;
                const auto t_train = Clock::now();
                const Tokenizer trained = tokenizer_train_bpe(text, vocab_size, [&](int done, int total) {
                    if (done < total && !pp.due()) return;
                    std::printf("prepare: bpe merges %d / %d (%.1f%%)\n", done, total, 100.0 * done / total);
                    std::fflush(stdout);
                });
                for (auto [a, b] : trained.state().merges) flat.insert(flat.end(), {a, b});
                std::printf("prepare: trained bpe on %.1f MB, vocab %d, in %.2f s\n", text.size() / 1e6,
                            trained.vocab_size(), seconds_since(t_train));
            }
            uint64_t n = flat.size();
            world.broadcast(&n, sizeof n, 0);
            flat.resize(n);
            if (n) world.broadcast(flat.data(), n * sizeof(uint32_t), 0);
            std::vector<std::pair<uint32_t, uint32_t>> merges(n / 2);
            for (size_t i = 0; i < merges.size(); ++i) merges[i] = {flat[2 * i], flat[2 * i + 1]};
            tok = tokenizer_bpe(merges, documents || bos == kEndOfText || eos == kEndOfText, "gpt2", "bpe");
        }
        job.bos_id = bos.empty() ? -1 : resolve_token("bos", bos, tok);
        job.eos_id = eos.empty() ? -1 : resolve_token("eos", eos, tok);
        if (documents && job.eos_id < 0) {
            job.eos_id = tok.kind() == "byte" ? eos_byte : default_end_of_document(tok);
            if (job.eos_id < 0)
                bad_option("eos", "", "documents need an end-of-document token and " + tok.describe() +
                                          " has none of <|endoftext|>, <|end_of_text|>, </s>, <eos>: give --eos TEXT|ID");
        }
        return prepare_corpus(job, tok, world);
    }

    const auto t0 = Clock::now();
    // The documents: every input, cut at --split-on; empty pieces are dropped.
    std::vector<std::string> texts;
    std::vector<std::string_view> docs;
    size_t total_bytes = 0;
    const std::string sep = unescape(split_on);
    for (const auto& input : inputs) {
        texts.push_back(read_input(input));
        if (rank == 0) std::cout << "prepare: read '" << input << "' (" << texts.back().size() << " bytes)" << std::endl;
    }
    for (const auto& text : texts) {
        total_bytes += text.size();
        if (sep.empty()) {
            docs.emplace_back(text);
            continue;
        }
        for (size_t at = 0; at <= text.size();) {
            size_t next = text.find(sep, at);
            if (next == std::string::npos) next = text.size();
            if (next > at) docs.push_back(std::string_view(text).substr(at, next - at));
            at = next + sep.size();
        }
    }
    const bool documents = inputs.size() > 1 || !sep.empty();
    if (documents && rank == 0) std::cout << "prepare: " << docs.size() << " documents" << std::endl;

    if (is_bpe) {
        // Rank 0 trains on the documents, newline-separated; the others receive the merges.
        std::vector<uint32_t> flat;
        if (rank == 0) {
            std::string text;
            for (size_t i = 0; i < docs.size(); ++i) (text += (i ? "\n" : "")) += docs[i];
            ProgressPrinter pp;
            const auto t_train = Clock::now();
            const Tokenizer trained = tokenizer_train_bpe(text, vocab_size, [&](int done, int total) {
                if (done < total && !pp.due()) return;
                const double s = seconds_since(t_train);
                std::printf("prepare: bpe merges %d / %d (%.1f%%), %.0f merges/s\n", done, total, 100.0 * done / total,
                            s > 0 ? done / s : 0.0);
                std::fflush(stdout);
            });
            for (auto [a, b] : trained.state().merges) flat.insert(flat.end(), {a, b});
            if (trained.vocab_size() < vocab_size)
                std::cout << "prepare: note: the input only supports " << flat.size() / 2
                          << " merges, so vocab_size = " << trained.vocab_size() << " instead of " << vocab_size
                          << std::endl;
            std::printf("prepare: trained bpe, vocab %d, in %.2f s\n", trained.vocab_size(), seconds_since(t_train));
        }
        uint64_t n = flat.size();
        world.broadcast(&n, sizeof n, 0);
        flat.resize(n);
        if (n) world.broadcast(flat.data(), n * sizeof(uint32_t), 0);
        std::vector<std::pair<uint32_t, uint32_t>> merges(n / 2);
        for (size_t i = 0; i < merges.size(); ++i) merges[i] = {flat[2 * i], flat[2 * i + 1]};
        // The end-of-text token exists when documents need it or --bos/--eos name it.
        const bool eot = documents || bos == kEndOfText || eos == kEndOfText;
        tok = tokenizer_bpe(merges, eot, "gpt2", "bpe");
    }

    // The tokens around each document.
    int bos_id = bos.empty() ? -1 : resolve_token("bos", bos, tok);
    int eos_id = eos.empty() ? -1 : resolve_token("eos", eos, tok);
    if (documents && eos_id < 0) {
        eos_id = tok.kind() == "byte" ? eos_byte : default_end_of_document(tok);
        if (eos_id < 0)
            bad_option("eos", "", "documents need an end-of-document token and " + tok.describe() +
                                      " has none of <|endoftext|>, <|end_of_text|>, </s>, <eos>: give --eos TEXT|ID");
    }
    if (documents && tok.kind() == "byte" && eos.empty() && rank == 0)
        for (const auto& d : docs)
            if (d.find(char(eos_byte)) != std::string_view::npos) {
                std::cout << "prepare: warning: the text itself contains byte " << eos_byte
                          << ", which also ends documents; choose another --eos-byte" << std::endl;
                break;
            }

    // Parts: documents cut where the tokenizer allows, shared out by bytes over the ranks; about
    // four per thread of every rank, of 64 KiB to 1 MiB.
    const size_t part_target = std::clamp(total_bytes / (4 * size_t(size) * size_t(omp_get_max_threads())),
                                          size_t(1) << 16, kPartBytes);
    std::vector<Part> parts;
    for (size_t d = 0; d < docs.size(); ++d) {
        const std::vector<std::string_view> cut = tokenizer_cut(tok, docs[d], part_target);
        if (cut.empty()) parts.push_back({d, 0, docs[d].size()});
        for (const auto& c : cut) {
            const size_t b = size_t(c.data() - docs[d].data());
            parts.push_back({d, b, b + c.size()});
        }
    }
    // Rank r encodes parts [first_part[r], first_part[r + 1]): about a size-th of the bytes each.
    size_t part_bytes = 0;
    for (const Part& p : parts) part_bytes += p.end - p.begin;
    std::vector<size_t> first_part(size_t(size) + 1, parts.size());
    first_part[0] = 0;
    {
        size_t bytes = 0, r = 1;
        for (size_t p = 0; p < parts.size(); ++p) {
            while (r < size_t(size) && bytes >= part_bytes * r / size_t(size)) first_part[r++] = p;
            bytes += parts[p].end - parts[p].begin;
        }
    }
    const size_t lo = first_part[size_t(rank)], hi = first_part[size_t(rank) + 1];
    size_t my_bytes = 0;
    for (size_t p = lo; p < hi; ++p) my_bytes += parts[p].end - parts[p].begin;

    ProgressPrinter pp;
    const auto t_enc = Clock::now();
    std::vector<std::vector<uint32_t>> ids(hi - lo);
    std::atomic<size_t> done{0};
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t p = lo; p < hi; ++p) {
        const Part& part = parts[p];
        ids[p - lo].reserve((part.end - part.begin) / 3 + 8);
        tok.encode_range(docs[part.doc], part.begin, part.end, ids[p - lo]);
        const size_t d = done.fetch_add(part.end - part.begin) + (part.end - part.begin);
        if (rank == 0 && omp_get_thread_num() == 0 && d < my_bytes && pp.due()) {
            const double s = seconds_since(t_enc);
            std::printf("prepare: encoded %.1f / %.1f MB%s (%.1f%%), %.1f MB/s on %d threads\n", d / 1e6,
                        my_bytes / 1e6, size > 1 ? " of rank 0's share" : "", 100.0 * d / std::max<size_t>(1, my_bytes),
                        s > 0 ? d / 1e6 / s : 0.0, omp_get_num_threads());
            std::fflush(stdout);
        }
    }
    const double enc_s = seconds_since(t_enc);

    // Rank 0 gathers every part's ids (as int32, bit for bit) and their counts.
    std::vector<int32_t> send, counts_send;
    for (const auto& v : ids) {
        send.insert(send.end(), v.begin(), v.end());
        counts_send.push_back(int32_t(v.size()));
        QUINTET_CHECK(send.size() < size_t(INT32_MAX), "prepare: a rank's share encodes to 2^31 tokens or more; "
                                                       "run with more ranks");
    }
    ids.clear();
    std::vector<uint32_t> part_ids(parts.size());  // on rank 0: the token count of every part
    std::vector<uint32_t> all;                     // on rank 0: every part's ids, in order
    if (size == 1) {
        all.assign(send.begin(), send.end());
        for (size_t p = 0; p < parts.size(); ++p) part_ids[p] = uint32_t(counts_send[p]);
    } else {
        auto gather = [&](const std::vector<int32_t>& mine, std::vector<int32_t>& out) {
            std::vector<int> sc(size_t(size), 0), sd(size_t(size), 0), rc(size_t(size), 0), rd(size_t(size), 0);
            sc[0] = int(mine.size());
            world.all_to_all_counts(sc.data(), rc.data());
            size_t total = 0;
            for (int r = 0; r < size; ++r) {
                rd[size_t(r)] = int(total);
                total += size_t(rc[size_t(r)]);
            }
            QUINTET_CHECK(total < size_t(INT32_MAX), "prepare: more than 2^31 tokens to gather on rank 0");
            out.resize(total);
            world.all_to_allv(mine.data(), sc.data(), sd.data(), out.data(), rc.data(), rd.data());
        };
        std::vector<int32_t> got, got_counts;
        gather(counts_send, got_counts);
        gather(send, got);
        if (rank == 0) {
            all.assign(got.begin(), got.end());
            for (size_t p = 0; p < parts.size(); ++p) part_ids[p] = uint32_t(got_counts[p]);
        }
    }
    // Per-rank encoding times, for the summary line.
    std::vector<double> times(static_cast<size_t>(size));
    world.gather(&enc_s, times.data(), 1, 0);
    if (rank != 0) return 0;

    // Assemble: [bos] document [eos], document after document.
    std::vector<uint32_t> tokens;
    tokens.reserve(all.size() + 2 * docs.size());
    size_t at = 0;
    for (size_t p = 0; p < parts.size(); ++p) {
        const bool first = p == 0 || parts[p - 1].doc != parts[p].doc;
        const bool last = p + 1 == parts.size() || parts[p + 1].doc != parts[p].doc;
        if (first && bos_id >= 0) tokens.push_back(uint32_t(bos_id));
        tokens.insert(tokens.end(), all.begin() + at, all.begin() + at + part_ids[p]);
        at += part_ids[p];
        if (last && eos_id >= 0) tokens.push_back(uint32_t(eos_id));
    }
    if (tokens.size() < 2)
        bad_option("input", inputs[0], "encodes to " + std::to_string(tokens.size()) + " token(s); need at least 2");

    token_file_write(output, tokens, tok, eos_id, bos_id);
    const double slowest = *std::max_element(times.begin(), times.end());
    std::printf("prepare: encoded %.1f MB in %.2f s (%.1f MB/s; %d rank(s) x %d thread(s))\n", total_bytes / 1e6,
                slowest, slowest > 0 ? total_bytes / 1e6 / slowest : 0.0, size, omp_get_max_threads());
    std::printf("prepare: %zu bytes -> %zu tokens (%.2f bytes/token), tokenizer %s, stored as %s in '%s' (%.2f s)\n",
                total_bytes, tokens.size(), double(total_bytes) / double(tokens.size()), tok.describe().c_str(),
                tok.vocab_size() <= 65536 ? "uint16" : "uint32", output.c_str(), seconds_since(t0));
    if (documents || eos_id >= 0 || bos_id >= 0)
        std::printf("prepare: %zu document(s)%s%s\n", docs.size(),
                    bos_id >= 0 ? (", each begun by token " + std::to_string(bos_id) + " (attribute bos_id)").c_str() : "",
                    eos_id >= 0 ? (", each ended by token " + std::to_string(eos_id) + " (attribute eos_id)").c_str() : "");
    return 0;
}

}  // namespace quintet
