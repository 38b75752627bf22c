// `quintet prepare`: the options, the tokenizer (quintet's own bpe trained first when asked) and
// the tokens around documents; the pipeline itself is data/prepare.hpp. User mistakes (options,
// input files, tokenizer files) are ConfigErrors naming the option, the value and what is valid,
// raised before any work.
#include <boost/program_options.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/core/error.hpp"
#include "quintet/data/prepare.hpp"
#include "quintet/tokenizer/byte_bpe.hpp"
#include "quintet/tokenizer/tokenizer.hpp"
#include "quintet/tokenizer/tokenizer_spec.hpp"
#include "quintet/tools/commands.hpp"

namespace quintet {
namespace {

namespace po = boost::program_options;
using Clock = std::chrono::steady_clock;

constexpr int kMaxVocab = 1 << 20;  // beyond this BPE training memory, not usefulness, dominates

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

[[noreturn]] void bad_option(const std::string& option, const std::string& value, const std::string& valid) {
    throw ConfigError("prepare option --" + option + " = '" + value + "': " + valid);
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
    "quintet prepare: turn text into token files for `quintet train`: one file, or a corpus of shards.\n"
    "\n"
    "Usage: [mpirun -n N] quintet prepare --input FILE|DIR|GLOB ... --tokenizer SPEC --output FILE.h5\n"
    "       [mpirun -n N] quintet prepare --input FILE|DIR|GLOB ... --tokenizer SPEC --shard-tokens N\n"
    "                       --output DIR [--resume]\n"
    "\n"
    "SPEC (docs/tokenizers.md):\n"
    "  byte              one token per byte, vocab_size 256;\n"
    "  bpe               quintet's byte-level BPE, trained on the input itself: GPT-2 pre-tokenizer\n"
    "                    pattern, then the most frequent adjacent pair is merged until the\n"
    "                    vocabulary has --vocab-size tokens (on the first --train-sample bytes);\n"
    "  tiktoken:FILE     a .tiktoken rank file (cl100k_base, o200k_base, r50k_base, Llama 3), with\n"
    "                    --tokenizer-pattern and --tokenizer-specials;\n"
    "  hf:FILE           a Hugging Face tokenizer.json (GPT-2, Llama 3, Qwen, DeepSeek-V3; Llama 2,\n"
    "                    Mistral, Gemma);\n"
    "  spm:FILE          a SentencePiece .model (Llama 2, Mistral, Gemma).\n"
    "\n"
    "Inputs (docs/data.md, \"Formats read\"): files, directories (their files, recursively; hidden\n"
    "ones left out) and globs, read by their names: .jsonl, .json, .ndjson are JSON Lines (one\n"
    "document per line, its text the first of the --jsonl-key fields it has), anything else plain\n"
    "text; .gz, .zst and .xz are decompressed as they stream. A truncated or corrupt file stops the\n"
    "job (exit status 2). A text input that is not UTF-8 is refused (--binary).\n"
    "\n"
    "Documents: every JSON line, every input file of several, every --split-on piece is a document,\n"
    "ended by an end-of-document token (attribute eos_id): --eos, else the tokenizer's\n"
    "<|endoftext|> (bpe: a reserved id after the merges), <|end_of_text|>, </s> or <eos>; for\n"
    "byte the byte --eos-byte (default 0). One plain text file alone is one token stream, exactly\n"
    "`quintet tokenize --whole` of it, unless --eos / --bos ask for tokens around it. --bos T puts T\n"
    "before each document. T: a special token's text or an id. Special-token text in the input\n"
    "is ordinary text.\n"
    "\n"
    "Output: one token file (/tokens, uint16 if vocab_size <= 65536 else uint32, and the tokenizer),\n"
    "or with --shard-tokens N the directory --output of shard_000000.h5, ... of N tokens each, the\n"
    "tokenizer stored once (tokenizer.h5) and manifest.json, written last: a directory with a\n"
    "manifest is complete, and train refuses one without. Work in progress is kept in OUTPUT/.prepare\n"
    "(FILE.prepare) under a lock: SIGINT, SIGTERM or SIGUSR1 stop every rank (exit status 4) with the\n"
    "finished units kept for --resume; a failure (a full disk: exit status 4) removes everything it\n"
    "wrote. Under mpirun the inputs (large plain files in pieces of about 64 MiB) are shared out\n"
    "over the ranks, each on its share of the node's cores; the output does not depend on the\n"
    "number of ranks, and the same command gives the same bytes.\n"
    "\n"
    "Options";

}  // namespace

int prepare_main(int argc, char** argv, MPI_Comm world_handle) {
    const MpiCommunicator world(world_handle, "world");
    const int rank = world.rank();
    std::vector<std::string> inputs;
    std::string tokenizer, pattern, specials, output, split_on, bos, eos, jsonl_key, binary = "refuse";
    int vocab_size = 4096, eos_byte = 0, threads = 0;
    int64_t shard_tokens = 0, train_sample = 0, max_bad_lines = 0;
    po::options_description opts(kUsage);
    opts.add_options()
        ("help,h", "print this help and exit")
        ("input", po::value(&inputs)->composing()->value_name("PATH"),
         "a file, directory or glob to read (required); repeat for more")
        ("split-on", po::value(&split_on)->value_name("SEP"),
         "cut each plain text input into documents at every occurrence of SEP (C escapes: \\n \\t \\r)")
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
        ("output", po::value(&output)->value_name("PATH"),
         "the token file to write (required; its folder is made when missing), or with --shard-tokens the "
         "directory of the shards (made when missing; new, or an interrupted prepare's with --resume)")
        ("jsonl-key", po::value(&jsonl_key)->value_name("KEYS"),
         "JSON Lines inputs: the string field of each line that is its document: a comma list of names or "
         "dotted paths (text,meta.body), the first one a line has")
        ("max-bad-lines", po::value(&max_bad_lines)->value_name("N"),
         "skip up to N malformed JSON lines (not JSON, no such field) with a count; default 0: the first stops "
         "the job")
        ("binary", po::value(&binary)->value_name("RULE"),
         "a text input that is not UTF-8 (a NUL byte or an invalid sequence in its first 64 KiB): refuse "
         "(default, exit status 2), skip (counted), or keep (its bytes tokenized)")
        ("shard-tokens", po::value(&shard_tokens)->value_name("N"),
         "write shards of N tokens (the last may be longer by at most N) into the directory --output")
        ("train-sample", po::value(&train_sample)->value_name("BYTES"),
         "bpe: train on the first BYTES of the documents (0 = all of them)")
        ("resume", "continue an interrupted prepare of the same command from its finished units")
        ("force", "one token file: replace an existing --output (only a token file is ever replaced)")
        ("threads", po::value(&threads)->value_name("N"),
         "threads per rank (default: OMP_NUM_THREADS, else the rank's share of its node's cores)");
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
    if (max_bad_lines < 0) bad_option("max-bad-lines", std::to_string(max_bad_lines), "must be >= 0");
    if (binary != "refuse" && binary != "skip" && binary != "keep")
        bad_option("binary", binary, "valid: refuse, skip, keep");
    if (vm.count("threads") && threads < 1) bad_option("threads", std::to_string(threads), "must be >= 1");
    if (vm.count("force") && shard_tokens > 0)
        bad_option("force", "", "applies to one token file; a directory of shards is never replaced (remove it, or "
                                "choose another)");
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

    prepare_catch_signals();
    // A stop before the pipeline starts (reading the tokenizer, training bpe) leaves nothing.
    auto stop_if_asked = [&] {
        double stop = prepare_interrupted() ? 1.0 : 0.0;
        world.all_reduce_max(&stop, 1);
        if (stop > 0) throw FaultError("prepare: interrupted by a signal before any work was kept; nothing was written");
    };
    PrepareJob job;
    job.files = corpus_inputs(inputs);
    job.sep = unescape(split_on);
    job.shard_tokens = shard_tokens;
    job.output = output;
    job.max_bad_lines = max_bad_lines;
    job.binary = binary;
    job.resume = vm.count("resume") > 0;
    job.force = vm.count("force") > 0;
    job.threads = threads;
    for (int i = 0; i < argc; ++i)
        if (std::string(argv[i]) != "--resume") job.command += (i ? " " : "quintet ") + std::string(argv[i]);
    const size_t n_jsonl = size_t(std::count_if(job.files.begin(), job.files.end(),
                                                [](const InputFile& f) { return f.format == InputFormat::jsonl; }));
    if (n_jsonl > 0 && jsonl_key.empty())
        bad_option("jsonl-key", "", "input '" + std::find_if(job.files.begin(), job.files.end(), [](const InputFile& f) {
                                        return f.format == InputFormat::jsonl;
                                    })->path + "' is JSON Lines (by its extension): name the field that holds each "
                                               "document's text, e.g. --jsonl-key text");
    if (n_jsonl == 0 && !jsonl_key.empty())
        bad_option("jsonl-key", jsonl_key, "no input is JSON Lines: files are read as JSON Lines by their extension "
                                           "(.jsonl, .json, .ndjson, each also .gz, .zst or .xz), as plain text otherwise");
    if (!jsonl_key.empty()) job.keys = JsonlKeys(jsonl_key);
    if (n_jsonl == job.files.size() && !job.sep.empty())
        bad_option("split-on", split_on, "does not apply to JSON Lines: each line is a document");
    // Documents: every JSON line, every file of several, every --split-on piece ends with the
    // end-of-document token; one plain text file alone is one token stream, as `tokenize --whole`.
    const bool documents = job.files.size() > 1 || !job.sep.empty() || n_jsonl > 0;
    const std::string complete = prepare_check_output(job, world);
    if (complete == "complete") {
        prepare_tidy(job, world);
        if (rank == 0) std::cout << "prepare: '" << output << "' is a complete corpus already (manifest.json); nothing to resume" << std::endl;
        return 0;
    }
    if (rank == 0)
        std::cout << "prepare: " << job.files.size() << " input file(s)"
                  << (n_jsonl ? ", " + std::to_string(n_jsonl) + " of them JSON Lines" : std::string())
                  << (documents ? "; every document ends with the end-of-document token"
                                : "; one plain text file, read whole (no end-of-document token unless --eos)")
                  << std::endl;
    if (is_bpe) {
        std::vector<uint32_t> flat;
        const TokenizerState saved = prepare_saved_tokenizer(job);
        if (!saved.empty()) {
            for (auto [a, b] : saved.merges) flat.insert(flat.end(), {a, b});
            if (rank == 0) std::cout << "prepare: --resume: the bpe the interrupted prepare trained" << std::endl;
        } else if (rank == 0) {
            const std::string text = corpus_sample_text(job, size_t(train_sample));
            ProgressPrinter pp;
            const auto t_train = Clock::now();
            const Tokenizer trained = tokenizer_train_bpe(text, vocab_size, [&](int done, int total) {
                if (done < total && !pp.due()) return;
                std::printf("prepare: bpe merges %d / %d (%.1f%%)\n", done, total, 100.0 * done / total);
                std::fflush(stdout);
            });
            for (auto [a, b] : trained.state().merges) flat.insert(flat.end(), {a, b});
            if (trained.vocab_size() < vocab_size)
                std::cout << "prepare: note: the input only supports " << flat.size() / 2
                          << " merges, so vocab_size = " << trained.vocab_size() << " instead of " << vocab_size
                          << std::endl;
            std::printf("prepare: trained bpe on %.1f MB, vocab %d, in %.2f s\n", text.size() / 1e6,
                        trained.vocab_size(), seconds_since(t_train));
        }
        uint64_t n = flat.size();
        world.broadcast(&n, sizeof n, 0);
        flat.resize(n);
        if (n) world.broadcast(flat.data(), n * sizeof(uint32_t), 0);
        std::vector<std::pair<uint32_t, uint32_t>> merges(n / 2);
        for (size_t i = 0; i < merges.size(); ++i) merges[i] = {flat[2 * i], flat[2 * i + 1]};
        // The end-of-text token exists when documents need it or --bos/--eos name it.
        tok = tokenizer_bpe(merges, documents || bos == kEndOfText || eos == kEndOfText, "gpt2", "bpe");
    }
    stop_if_asked();
    job.bos_id = bos.empty() ? -1 : resolve_token("bos", bos, tok);
    job.eos_id = eos.empty() ? -1 : resolve_token("eos", eos, tok);
    if (documents && job.eos_id < 0) {
        job.eos_id = tok.kind() == "byte" ? eos_byte : default_end_of_document(tok);
        if (job.eos_id < 0)
            bad_option("eos", "", "documents need an end-of-document token and " + tok.describe() +
                                      " has none of <|endoftext|>, <|end_of_text|>, </s>, <eos>: give --eos TEXT|ID");
    }
    return prepare_run(job, tok, world);
}

}  // namespace quintet
