// `quintet eval --checkpoint CKPT --data DATA [--section.key=value ...]` (docs/long-context.md, "The contracts"): the
// validation cross-entropy of a checkpoint on any layout, at any sequence length and RoPE
// setting; optionally by position (--by-position) and passkey retrieval (--passkey). Collective
// over the world; writes nothing into the checkpoint's run folder.
#include <mpi.h>

#include <boost/program_options.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "quintet/core/error.hpp"
#include "quintet/core/lists.hpp"
#include "quintet/interop/output_path.hpp"
#include "quintet/io/checkpoint.hpp"
#include "quintet/io/h5.hpp"
#include "quintet/io/token_data.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/model/decoder.hpp"
#include "quintet/parallel/process_grid.hpp"
#include "quintet/tools/commands.hpp"
#include "quintet/deck/deck.hpp"
#include "quintet/data/passkey.hpp"
#include "quintet/train/evaluator.hpp"
#include "quintet/train/rank_model.hpp"
#include "quintet/train/session.hpp"

namespace po = boost::program_options;

namespace quintet {

namespace {

const char* kUsage =
    "usage: mpirun -n N quintet eval --checkpoint CKPT --data DATA [--section.key=value ...]\n"
    "                                [--whole] [--by-position OUT.h5] [--passkey N] [--passkey-out OUT.h5]\n"
    "\n"
    "The mean cross-entropy (no auxiliary loss) of the checkpoint's model over eval.batches\n"
    "batches of data.micro_batch_size samples of the validation split of each source of DATA\n"
    "(sample j of batch i at offset (i*mbs + j)*seq_len, docs/math.md §10); DATA has the syntax of\n"
    "data.path (files, directories, globs, weights ignored). With --whole each source of DATA is\n"
    "validation data from its first token to its last whole batch (data.val_path = DATA,\n"
    "eval.batches = 0). Several sources: a line val_loss[<source>]=<x> each before the last line. The model, [rope], [data] and [eval] keys are the\n"
    "checkpoint's with the overrides applied (e.g. --data.seq_len=2048 --rope.scaling=yarn\n"
    "--rope.factor=4); [parallel] comes from the command line alone, so any layout evaluates any\n"
    "checkpoint (dp defaults to what the world size leaves). rope.original_max_position = 0\n"
    "means the context the checkpoint was trained at. Nothing is written into the run folder.\n"
    "Each validation token is evaluated at most once: a source whose split holds fewer whole batches\n"
    "than eval.batches is evaluated on those (a note on stderr gives both numbers); none is refused.\n"
    "The last line of stdout is  val_loss=<x> seq_len=<T> tokens=<target tokens evaluated>.\n"
    "\n"
    "  --by-position OUT.h5   the mean cross-entropy at each position: /loss_by_position [T]\n"
    "  --passkey N            passkey retrieval: N prompts per length (a random 5-digit key at\n"
    "                         depths 0..1 of filler text), greedy decoding on rank 0; a table of\n"
    "                         exact-match retrieval by length and depth\n"
    "  --passkey-lengths L,.. prompt lengths in tokens (default: data.seq_len)\n"
    "  --passkey-out OUT.h5   the table: /passkey/{length, depth, correct} per prompt\n"
    "  --write-passkey-corpus TXT  write N training documents of each length to TXT and exit\n"
    "\n";

std::vector<int> parse_lengths(const std::string& s, int dflt) {
    if (s.empty()) return {dflt};
    const auto v = parse_int_list(s);
    if (!v || std::any_of(v->begin(), v->end(), [](int x) { return x < 16; }))
        throw ConfigError("eval: --passkey-lengths '" + s + "': expected a comma list of lengths >= 16");
    return *v;
}

void write_vector_h5(const std::string& path, const std::vector<std::pair<std::string, std::vector<double>>>& cols,
                     const std::string& deck_text) {
    h5::silence_errors();
    const std::string tmp = path + ".tmp";
    {
        h5::Handle f = h5::file(h5::check(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, h5::file_create_plist(), H5P_DEFAULT),
                                          "create " + tmp));
        for (const auto& [name, v] : cols) {
            const std::string parent = name.substr(0, name.rfind('/'));
            if (!parent.empty()) h5::group(h5::create_groups(f, parent));
            hsize_t n = v.size();
            h5::Handle sp = h5::space(h5::check(H5Screate_simple(1, &n, nullptr), "dataspace"));
            h5::Handle ds = h5::dataset(h5::check(
                H5Dcreate2(f, name.c_str(), H5T_IEEE_F64LE, sp, H5P_DEFAULT, h5::dataset_create_plist(), H5P_DEFAULT),
                "create " + name));
            if (n) h5::check(H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), "write " + name);
        }
        h5::write_attr_string(f, "deck", deck_text);
    }
    std::rename(tmp.c_str(), path.c_str());
}

// Greedy continuation of `prompt`: the first 5 decoded characters that are digits.
std::string greedy_digits(Decoder& dec, const Tokenizer& tok, const std::string& prompt, int max_len) {
    std::vector<uint32_t> ids = tok.encode(prompt);
    const std::vector<float>* z = nullptr;
    int pos = 0;
    for (uint32_t id : ids) z = &dec.step(int(id), pos++);
    // Exact match: the first five characters of the greedy continuation, whatever they are.
    std::string out;
    for (int k = 0; k < 8 && pos < max_len && out.size() < 5; ++k) {
        const uint32_t next = uint32_t(std::max_element(z->begin(), z->end()) - z->begin());
        out += tok.decode(&next, 1);
        if (out.size() < 5) z = &dec.step(int(next), pos++);
    }
    return out.substr(0, 5);
}

}  // namespace

int eval_main(int argc, char** argv, MPI_Comm world_handle) {
    const MpiCommunicator world(world_handle, "world");
    const int rank = world.rank();
    std::string ckpt, data, by_position, passkey_out, passkey_lengths, corpus_out;
    int passkey = 0;
    std::vector<std::string> overrides, tool_args;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        const std::string key = a.substr(0, a.find('='));
        const bool tool = key == "--checkpoint" || key == "--data" || key == "--by-position" || a == "--whole" ||
                          key == "--passkey" || key == "--passkey-out" || key == "--passkey-lengths" ||
                          key == "--write-passkey-corpus" || a == "-h" || a == "--help";
        if (tool) {
            tool_args.push_back(a);
            if (a.find('=') == std::string::npos && a != "-h" && a != "--help" && a != "--whole" && i + 1 < argc)
                tool_args.push_back(argv[++i]);
        } else if (a.rfind("--", 0) == 0 && a.find('.') != std::string::npos) {
            overrides.push_back(a);
        } else {
            throw ConfigError("eval: unexpected argument '" + a + "' (see quintet eval --help)");
        }
    }
    po::options_description desc("options");
    desc.add_options()("help,h", "this text")("checkpoint", po::value(&ckpt), "checkpoint file, or a run folder / its checkpoints/ folder / latest (the checkpoint latest names)")(
        "data", po::value(&data), "token sources (their validation splits are evaluated)")(
        "whole", "evaluate every whole batch of DATA (each source is validation data)")(
        "by-position", po::value(&by_position), "write /loss_by_position [T] to this HDF5 file")(
        "passkey", po::value(&passkey)->default_value(0), "passkey prompts per length")(
        "passkey-lengths", po::value(&passkey_lengths), "comma list of prompt lengths")(
        "passkey-out", po::value(&passkey_out), "write the passkey table to this HDF5 file")(
        "write-passkey-corpus", po::value(&corpus_out), "write a passkey training corpus and exit");
    po::variables_map vm;
    try {
        po::store(po::command_line_parser(tool_args).options(desc).run(), vm);
        po::notify(vm);
    } catch (const po::error& e) {
        throw ConfigError(std::string("eval: ") + e.what() + " (see quintet eval --help)");
    }
    const bool whole = vm.count("whole") > 0;
    if (vm.count("help")) {
        if (rank == 0) std::cout << kUsage << desc << "\n";
        return 0;
    }
    if (!corpus_out.empty()) {  // the synthetic task's training data (byte tokenizer)
        if (passkey <= 0) throw ConfigError("eval: --write-passkey-corpus needs --passkey N (documents per length)");
        if (rank == 0) {
            Tokenizer byte;
            std::string text;
            for (int len : parse_lengths(passkey_lengths, 128)) text += passkey_corpus(byte, passkey, len, 1);
            FILE* f = std::fopen(corpus_out.c_str(), "wb");
            if (!f || std::fwrite(text.data(), 1, text.size(), f) != text.size())
                throw ConfigError("eval: --write-passkey-corpus '" + corpus_out + "': cannot write");
            std::fclose(f);
            std::printf("wrote %zu bytes of passkey documents to %s\n", text.size(), corpus_out.c_str());
        }
        return 0;
    }
    if (ckpt.empty() || data.empty())
        throw ConfigError("eval: --checkpoint and --data are required (see quintet eval --help)");
    // The files it writes, checked before any work (a missing folder would fail after the evaluation).
    const auto any = [](const std::filesystem::path&) { return std::string(); };  // they are overwritten
    if (!by_position.empty())
        output_check(by_position, OutputKind::file, true, "eval: --by-position", "a file such as loss_by_pos.h5", any);
    if (!passkey_out.empty())
        output_check(passkey_out, OutputKind::file, true, "eval: --passkey-out", "a file such as passkey.h5", any);

    // A run folder, its checkpoints/ folder or `latest`: the checkpoint `latest` names.
    {
        std::string note;
        ckpt = checkpoint_resolve(ckpt, "eval: --checkpoint", &note);
        if (rank == 0 && !note.empty()) std::fprintf(stderr, "quintet %s\n", note.c_str());
    }
    // The checkpoint's deck; [parallel] from the command line alone; overrides on top.
    const CheckpointMeta meta = checkpoint_read_meta(ckpt);
    if (const std::string why = checkpoint_verify(ckpt, world); !why.empty())
        throw ConfigError("eval: --checkpoint '" + ckpt + "' is unusable: " + why);
    Deck deck = deck_parse_text(meta.deck);
    deck.parallel = ParallelConfig{};
    deck.checkpoint = CheckpointConfig{};
    deck.train.threads = 0;
    deck.train.device = "cpu";
    {
        deck_load("", overrides);  // every override checked (key, value) as train checks them
        auto opts = deck_options(deck);  // then applied onto the checkpoint's deck
        for (const auto& o : overrides) {
            const std::string kv = o.substr(2);
            const auto eq = kv.find('=');
            const std::string key = kv.substr(0, eq), val = eq == std::string::npos ? "" : kv.substr(eq + 1);
            for (auto& d : opts)
                if (d.key == key) d.set(val);
        }
        bool vs_given = false;
        for (const auto& o : overrides) vs_given = vs_given || o.rfind("--parallel.virtual_stages=", 0) == 0;
        deck_schedule_defaults(deck, vs_given);
    }
    // Evaluation has no training batch: the checkpoint's train.global_batch must not constrain
    // the layout. MoE layers under tp need sequence parallelism; it changes no number, so eval
    // turns it on itself unless the command line says otherwise.
    deck.train.global_batch = 0;
    bool sp_given = false;
    for (const auto& o : overrides) sp_given = sp_given || o.rfind("--parallel.sequence_parallel", 0) == 0;
    if (deck.model.moe.experts > 0 && deck.parallel.tp > 1 && !sp_given) deck.parallel.sequence_parallel = true;
    deck.data.path = data;
    if (whole) {
        deck.data.val_path = data;
        deck.eval.batches = 0;
    }
    deck.checkpoint.resume = "none";
    deck.checkpoint.init_from = ckpt;  // for the trained-context rule of rope.original_max_position
    Session job(std::move(deck), world);
    // The data must be tokenized as the weights were trained (the checkpoint's tokenizer; a
    // checkpoint from before has none, and then at least the vocabulary sizes must agree).
    if (const std::string why = tokenizer_change(meta, job.data.tokenizer); !why.empty())
        throw ConfigError("eval: --data '" + data + "': " + why + "; evaluate on data made with the checkpoint's tokenizer");
    if (const int64_t v = checkpoint_vocab_size(ckpt); v >= 0 && v != job.data.vocab_size)
        throw ConfigError("eval: --data '" + data + "' has vocabulary " + std::to_string(job.data.vocab_size) + " (" +
                          job.data.tokenizer.describe() + ") but checkpoint '" + ckpt + "' was trained with vocabulary " +
                          std::to_string(v));
    if (meta.tokenizer.empty() && rank == 0)
        std::fprintf(stderr, "quintet eval: %s\n", tokenizer_source_note(ckpt, "--data '" + data + "'").c_str());
    // Every passkey length is checked on every rank before any work (a prompt must fit).
    const std::vector<int> passkey_lens =
        passkey > 0 ? parse_lengths(passkey_lengths, job.deck.data.seq_len) : std::vector<int>{};
    for (int len : passkey_lens) passkey_prompt(job.data.tokenizer, len, 0.0, 7, 0);
    job.resolve();
    const ProcessGrid& grid = job.start_grid();
    RankModel model(job.deck, grid, *job.backend);
    const Sampler sampler(job.data, job.deck.data, uint64_t(job.deck.train.seed));
    // Each validation token at most once: eval.batches past a split's whole batches is capped
    // (said on stderr, with both numbers) and tokens= counts what was evaluated.
    Evaluator ev(model, sampler, /*each_token_once=*/true);
    if (rank == 0) {
        for (const auto& w : job.source.warnings) std::fprintf(stderr, "quintet eval: warning: %s\n", w.c_str());
        for (const auto& n : ev.notes()) std::fprintf(stderr, "quintet eval: note: %s\n", n.c_str());
    }
    model.load_weights(ckpt);
    std::vector<double> per_pos;
    std::vector<double> per_source;
    const double loss = ev.evaluate(by_position.empty() ? nullptr : &per_pos, &per_source);
    const Deck& deck_used = job.deck;
    const std::string& text = job.deck_text;
    const DataSet& tokens = job.data;
    Backend* backend = job.backend.get();
    const int T = deck_used.data.seq_len;
    if (rank == 0 && !by_position.empty()) write_vector_h5(by_position, {{"/loss_by_position", per_pos}}, text);

    if (passkey > 0) {
        // Greedy retrieval on rank 0 with the KV-cache decoder over the whole model.
        if (rank == 0) {
            Tokenizer tok = tokens.tokenizer;
            ModelConfig m = deck_used.model;
            ParamTable table = make_param_table(m);
            std::vector<float> params(table.total);
            checkpoint_inspect(ckpt, table, false);
            checkpoint_load(ckpt, table, params.data());
            std::vector<double> col_len, col_depth, col_ok;
            std::printf("passkey retrieval (%d prompts per length, greedy, exact match)\n", passkey);
            for (int len : passkey_lens) {
                int ok = 0;
                int bin_ok[5] = {}, bin_n[5] = {};  // by depth: fifths of the filler
                for (int i = 0; i < passkey; ++i) {
                    const double depth = passkey > 1 ? double(i) / double(passkey - 1) : 0.5;
                    PasskeyPrompt p = passkey_prompt(tok, len, depth, 7, uint64_t(i));
                    Decoder dec(*backend, m, deck_used.rope, T, table, params, p.tokens + 16);
                    const bool hit = greedy_digits(dec, tok, p.prompt, p.tokens + 16) == p.key;
                    ok += hit;
                    const int bin = std::min(4, int(depth * 5));
                    bin_ok[bin] += hit;
                    ++bin_n[bin];
                    col_len.push_back(len);
                    col_depth.push_back(depth);
                    col_ok.push_back(hit ? 1.0 : 0.0);
                }
                std::printf("passkey length=%d retrieval=%.3f (%d/%d) | by depth", len, double(ok) / passkey, ok,
                            passkey);
                for (int b = 0; b < 5; ++b)
                    if (bin_n[b] > 0) std::printf(" %.1f-%.1f: %d/%d", 0.2 * b, 0.2 * (b + 1), bin_ok[b], bin_n[b]);
                std::printf("\n");
            }
            if (!passkey_out.empty())
                write_vector_h5(passkey_out, {{"/passkey/length", col_len}, {"/passkey/depth", col_depth},
                                              {"/passkey/correct", col_ok}}, text);
        }
    }
    if (rank == 0) {
        if (per_source.size() > 1)
            for (size_t v = 0; v < per_source.size(); ++v)
                std::printf("val_loss[%s]=%.8g\n", sampler.val_sources()[v].name.c_str(), per_source[v]);
        std::printf("val_loss=%.8g seq_len=%d tokens=%lld\n", loss, T, (long long)ev.tokens());
        std::fflush(stdout);
    }
    return 0;
}

}  // namespace quintet
