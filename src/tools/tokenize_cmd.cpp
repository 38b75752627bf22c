// `quintet tokenize`: text on stdin -> token ids on stdout (or back with --decode), with any
// tokenizer quintet knows: named (--tokenizer SPEC), a token file's (--data) or a checkpoint's
// (--checkpoint). A plain process (no MPI); encoding runs on all OpenMP threads. The script
// contract (docs/tokenizers.md): stdout's last line is the ids, space-separated.
#include <boost/program_options.hpp>

#include <omp.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "quintet/core/error.hpp"
#include "quintet/deck/deck.hpp"
#include "quintet/io/checkpoint.hpp"
#include "quintet/io/token_data.hpp"
#include "quintet/tokenizer/tokenizer.hpp"
#include "quintet/tokenizer/tokenizer_spec.hpp"
#include "quintet/tools/commands.hpp"

namespace quintet {

Tokenizer checkpoint_tokenizer(const std::string& checkpoint, const CheckpointMeta& meta,
                               const std::string& fallback_data, std::string& note) {
    note.clear();
    if (!meta.tokenizer.empty()) return tokenizer_from_state(meta.tokenizer, "checkpoint '" + checkpoint + "': /tokenizer");
    const std::string data = fallback_data.empty() ? deck_parse_text(meta.deck).data.path : fallback_data;
    note = tokenizer_source_note(checkpoint, "the token file '" + data + "'" +
                                                 (fallback_data.empty() ? " (the data.path of its deck)" : ""));
    return token_file_read_tokenizer(data);
}

namespace {

namespace po = boost::program_options;

const char* kUsage =
    "quintet tokenize: text on stdin -> token ids on stdout, or ids -> text with --decode.\n"
    "\n"
    "Usage: quintet tokenize (--tokenizer SPEC [--tokenizer-pattern P] [--tokenizer-specials S]\n"
    "                         | --checkpoint CKPT | --data FILE) [--whole] [--decode] [--special]\n"
    "\n"
    "SPEC: byte, tiktoken:FILE.tiktoken, hf:tokenizer.json, spm:FILE.model (a token file's bpe:\n"
    "--data FILE). Without --whole each input line (without its newline) is encoded on its own and\n"
    "gives one output line of space-separated ids; with --whole the whole input is one text and one\n"
    "line. Special-token text (\"<|endoftext|>\") is ordinary text unless --special is given.\n"
    "--decode reads ids (space-separated; one text per line, or all of them with --whole) and\n"
    "writes the text. Scripts: the last line of stdout is the ids.\n"
    "\n"
    "Options";

void append_ids(const std::vector<uint32_t>& ids, std::string& out) {
    char buf[16];
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i) out += ' ';
        const auto r = std::to_chars(buf, buf + sizeof buf, ids[i]);
        out.append(buf, r.ptr);
    }
    out += '\n';
}

std::vector<uint32_t> parse_ids(std::string_view line, size_t line_no, int vocab) {
    std::vector<uint32_t> ids;
    size_t i = 0;
    while (i < line.size()) {
        while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r' || line[i] == '\n')) ++i;
        if (i == line.size()) break;
        size_t j = i;
        while (j < line.size() && !(line[j] == ' ' || line[j] == '\t' || line[j] == '\r' || line[j] == '\n')) ++j;
        uint64_t v = 0;
        const auto r = std::from_chars(line.data() + i, line.data() + j, v);
        if (r.ptr != line.data() + j || v >= uint64_t(vocab))
            throw ConfigError("tokenize --decode: line " + std::to_string(line_no) + ": '" +
                              std::string(line.substr(i, j - i)) + "' is not a token id; valid: 0 .. " +
                              std::to_string(vocab - 1));
        ids.push_back(uint32_t(v));
        i = j;
    }
    return ids;
}

}  // namespace

int tokenize_main(int argc, char** argv) {
    std::string spec, pattern, specials, checkpoint, data;
    po::options_description opts(kUsage);
    opts.add_options()("help,h", "print this help and exit")(
        "tokenizer", po::value(&spec)->value_name("SPEC"), tokenizer_spec_help())(
        "tokenizer-pattern", po::value(&pattern)->value_name("P"),
        "tiktoken: the pre-tokenizer, cl100k_base | o200k_base | gpt2 | llama3 | a regex (default: FILE's stem)")(
        "tokenizer-specials", po::value(&specials)->value_name("S"),
        "tiktoken: special tokens, a preset name, none, or TEXT=ID,... (default: the pattern's)")(
        "checkpoint", po::value(&checkpoint)->value_name("CKPT"), "the tokenizer a checkpoint was trained with (a file, or a run folder / its checkpoints/ folder / latest)")(
        "data", po::value(&data)->value_name("FILE"), "the tokenizer of a token file (quintet prepare)")(
        "whole", "the whole input is one text (one output line)")(
        "decode", "ids -> text")("special", "match special-token text in the input")(
        "stats", "print bytes, tokens and MB/s to stderr");
    po::variables_map vm;
    try {
        po::store(po::command_line_parser(argc, argv).options(opts).positional(po::positional_options_description()).run(),
                  vm);
        po::notify(vm);
    } catch (const po::error& e) {
        throw ConfigError(std::string("quintet tokenize: ") + e.what() + " (see `quintet tokenize --help`)");
    }
    if (vm.count("help")) {
        std::cout << opts << "\nExample:\n  echo 'Hello, world' | quintet tokenize --tokenizer "
                             "tiktoken:cl100k_base.tiktoken\n";
        return 0;
    }
    const int sources = int(vm.count("tokenizer") + vm.count("checkpoint") + vm.count("data"));
    if (sources != 1)
        throw ConfigError("quintet tokenize: give exactly one of --tokenizer SPEC, --checkpoint CKPT, --data FILE "
                          "(got " + std::to_string(sources) + ")");
    if (!vm.count("tokenizer") && (vm.count("tokenizer-pattern") || vm.count("tokenizer-specials")))
        throw ConfigError("quintet tokenize: --tokenizer-pattern and --tokenizer-specials go with --tokenizer "
                          "tiktoken:FILE; a token file or checkpoint stores its own");
    const bool whole = vm.count("whole"), decode = vm.count("decode"), special = vm.count("special"),
               stats = vm.count("stats");

    using Clock = std::chrono::steady_clock;
    const auto t_load = Clock::now();
    Tokenizer tok;
    if (vm.count("tokenizer")) {
        tok = tokenizer_load({spec, pattern, specials});
    } else if (vm.count("data")) {
        tok = token_file_read_tokenizer(data);
    } else {
        std::string note;
        checkpoint = checkpoint_resolve(checkpoint, "quintet tokenize: --checkpoint", &note);
        if (!note.empty()) std::fprintf(stderr, "%s\n", note.c_str());
        note.clear();
        const CheckpointMeta meta = checkpoint_read_meta(checkpoint);
        tok = checkpoint_tokenizer(checkpoint, meta, "", note);
        if (!note.empty()) std::fprintf(stderr, "quintet tokenize: %s\n", note.c_str());
    }
    const double load_s = std::chrono::duration<double>(Clock::now() - t_load).count();

    std::string input;
    {
        std::vector<char> buf(size_t(1) << 20);
        for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), stdin)) > 0;) input.append(buf.data(), n);
    }
    // Lines: each without its '\n'; a final line without one counts too.
    std::vector<std::string_view> lines;
    if (!whole)
        for (size_t at = 0; at < input.size();) {
            size_t nl = input.find('\n', at);
            if (nl == std::string::npos) nl = input.size();
            lines.emplace_back(input.data() + at, nl - at);
            at = nl + 1;
        }

    const auto t0 = Clock::now();
    std::string out;
    size_t n_tokens = 0;
    if (decode) {
        if (whole) {
            const std::vector<uint32_t> ids = parse_ids(input, 1, tok.vocab_size());
            out = tok.decode(ids.data(), ids.size());
            n_tokens = ids.size();
        } else {
            for (size_t l = 0; l < lines.size(); ++l) {
                const std::vector<uint32_t> ids = parse_ids(lines[l], l + 1, tok.vocab_size());
                out += tok.decode(ids.data(), ids.size());
                out += '\n';
                n_tokens += ids.size();
            }
        }
    } else if (whole) {
        const std::vector<uint32_t> ids = tok.encode_parallel(input, special);
        n_tokens = ids.size();
        append_ids(ids, out);
    } else {
        std::vector<std::vector<uint32_t>> ids(lines.size());
#pragma omp parallel for schedule(dynamic, 64)
        for (size_t l = 0; l < lines.size(); ++l) {
            if (special) tok.encode_with_specials(lines[l], ids[l]);
            else tok.encode(lines[l], ids[l]);
        }
        for (const auto& v : ids) {
            n_tokens += v.size();
            append_ids(v, out);
        }
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
    if (stats)
        std::fprintf(stderr,
                     "tokenize: %s, loaded in %.3f s; %zu bytes <-> %zu tokens in %.3f s: %.2f MB/s on %d thread(s)\n",
                     tok.describe().c_str(), load_s, input.size(), n_tokens, s, s > 0 ? input.size() / 1e6 / s : 0.0,
                     omp_get_max_threads());
    return 0;
}

}  // namespace quintet
