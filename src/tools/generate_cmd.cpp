// `quintet generate --checkpoint CKPT.h5 --prompt TEXT`: sample text from a trained model.
// Single process, incremental decoding with a KV cache: each new token costs one row of every
// matmul and one attention row over the cached keys/values, instead of re-running the prefix.
#include <boost/program_options.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <numeric>
#include <random>
#include <sstream>
#include <vector>

#include "quintet/core/error.hpp"
#include "quintet/core/clock.hpp"
#include "quintet/core/rng.hpp"
#include "quintet/interop/output_path.hpp"
#include "quintet/io/checkpoint.hpp"
#include "quintet/io/h5.hpp"
#include "quintet/io/token_data.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/model/decoder.hpp"
#include "quintet/model/params.hpp"
#include "quintet/model/rope.hpp"
#include "quintet/model/speculative.hpp"
#include "quintet/tools/commands.hpp"
#include "quintet/deck/deck.hpp"
#include "generate_batch.hpp"

namespace po = boost::program_options;

namespace quintet {

int generate_main(int argc, char** argv) {
    std::string ckpt, prompt, data;
    int tokens = 200, top_k = 40;
    double temperature = 0.8;
    int64_t seed = 1;
    std::string kv_cache = "compact";
    std::string prompt_ids, probs_out, speculative = "none", prompts_file;
    int batch = 16, stop_id = -1, threads = 0;
    po::options_description desc(
        "usage: quintet generate --checkpoint CKPT.h5 --prompt TEXT [options]\n"
        "       quintet generate --checkpoint CKPT.h5 --prompts FILE [options]\n\n"
        "Samples text from a checkpoint with a KV cache, with the tokenizer stored in the checkpoint\n"
        "(a checkpoint from before: the token file --data, else its deck's data.path).\n\noptions");
    desc.add_options()("help,h", "this text")(
        "checkpoint", po::value(&ckpt), "checkpoint file (run_dir/checkpoints/step_*.h5), or a run folder / its checkpoints/ folder / latest (the checkpoint latest names)")(
        "prompt", po::value(&prompt)->default_value(""), "text to continue")(
        "tokens", po::value(&tokens)->default_value(200), "tokens to generate")(
        "temperature", po::value(&temperature)->default_value(0.8, "0.8"), "softmax temperature; 0 = greedy")(
        "top-k", po::value(&top_k)->default_value(40), "sample among the k most likely; 0 = all")(
        "seed", po::value(&seed)->default_value(1), "sampling seed")(
        "data", po::value(&data), "checkpoints without a tokenizer: the token file whose tokenizer to use "
        "(default: the deck's data.path); with one, checked to agree")(
        "prompt-ids", po::value(&prompt_ids),
        "the prompt as token ids (space-separated) instead of --prompt: the same tokens for another runtime")(
        "print-ids", "after the text, one more stdout line: the ids of the prompt and of the continuation")(
        "probs", po::value(&probs_out),
        "write the next-token probabilities after every token (prompt and continuation) to this file: "
        "float32, little-endian, [positions, vocabulary] (docs/interop.md); the prompt then goes through "
        "the decoder one token at a time (else the prompt is one forward)")(
        "kv-cache", po::value(&kv_cache)->default_value("compact"),
        "compact: what each attention kind needs (MLA: the latent [c_kv | k_rope], kv_b absorbed); "
        "full: per-head K and V as training computes them (for comparison)")(
        "speculative", po::value(&speculative)->default_value("none"),
        "none, or mtp: the checkpoint's multi-token prediction modules (model.mtp_depth) draft the next "
        "tokens and the model verifies them in one forward; the output is plain greedy decoding's, "
        "token for token (--temperature 0 only); the acceptance rate on stderr")(
        "prompts", po::value(&prompts_file),
        "a file of prompts (- = standard input), one per line, decoded together (--batch at a time); one JSON line per prompt "
        "on stdout in the file's order: index, prompt, completion, prompt_tokens, new_tokens, stop (length | "
        "stop_id) and, with --print-ids, ids; each line is what --prompt with that prompt and --seed gives")(
        "batch", po::value(&batch)->default_value(16),
        "with --prompts: sequences decoded together at most (each keeps a KV cache)")(
        "stop-id", po::value(&stop_id)->default_value(-1),
        "a token id that ends a sequence when it is generated (not shown in the text); -1 = none")(
        "threads", po::value(&threads)->default_value(0),
        "threads for the prompt and every step; 0 = OMP_NUM_THREADS, else every core this process may run on");
    po::variables_map vm;
    try {
        po::store(po::parse_command_line(argc, argv, desc), vm);
        po::notify(vm);
    } catch (const po::error& e) {
        throw ConfigError(std::string("generate: ") + e.what() + " (see quintet generate --help)");
    }
    if (vm.count("help")) { std::cout << desc << "\n"; return 0; }
    if (ckpt.empty()) throw ConfigError("generate: --checkpoint is required (see quintet generate --help)");
    if (tokens < 0) throw ConfigError("generate: --tokens = " + std::to_string(tokens) + ": must be >= 0");
    if (temperature < 0) throw ConfigError("generate: --temperature must be >= 0");
    if (kv_cache != "compact" && kv_cache != "full")
        throw ConfigError("generate: --kv-cache = '" + kv_cache + "': valid: compact | full");
    if (speculative != "none" && speculative != "mtp")
        throw ConfigError("generate: --speculative = '" + speculative + "': valid: none | mtp");
    const bool spec = speculative == "mtp";
    const bool many = vm.count("prompts") > 0;
    if (many) {
        if (!prompt.empty() || vm.count("prompt-ids"))
            throw ConfigError("generate: --prompts FILE gives the prompts: leave out --prompt and --prompt-ids");
        if (!probs_out.empty() || spec)
            throw ConfigError(std::string("generate: --prompts decodes plainly: leave out ") +
                              (spec ? "--speculative" : "--probs") + " (or give one --prompt)");
        read_prompts(prompts_file);  // unreadable or empty: said before any work
    }
    if (batch < 1) throw ConfigError("generate: --batch = " + std::to_string(batch) + ": must be >= 1");
    if (threads < 0 || threads > 4096)
        throw ConfigError("generate: --threads = " + std::to_string(threads) + ": 0 (OMP_NUM_THREADS or every core) to 4096");
    // Verification keeps the drafts the greedy choice agrees with; sampled tokens would need
    // another acceptance rule (and RNG use) than plain sampling's.
    if (spec && temperature != 0)
        throw ConfigError("generate: --speculative mtp decodes greedily only: give --temperature 0 (not " +
                          std::to_string(temperature) + ")");
    if (spec && !probs_out.empty())
        throw ConfigError("generate: --speculative mtp with --probs: the probabilities are written by plain "
                          "decoding (leave out --speculative)");
    if (!probs_out.empty())  // checked before any work; an existing file is overwritten
        output_check(probs_out, OutputKind::file, true, "generate: --probs", "a file such as probs.f32",
                     [](const std::filesystem::path&) { return std::string(); });
    // Read the deck first, to build the parameter table the checkpoint must match; RoPE as the
    // checkpoint trained it (YaRN's original_max_position = 0: the trained context it records).
    {  // a run folder, its checkpoints/ folder or `latest`: the checkpoint `latest` names
        std::string note;
        ckpt = checkpoint_resolve(ckpt, "generate: --checkpoint", &note);
        if (!note.empty()) std::fprintf(stderr, "%s\n", note.c_str());
    }
    const CheckpointMeta meta = checkpoint_read_meta(ckpt);
    if (spec && deck_parse_text(meta.deck).model.mtp_depth == 0)
        throw ConfigError("generate: --speculative mtp: checkpoint '" + ckpt + "' has no MTP modules "
                          "(model.mtp_depth = 0): train with model.mtp_depth >= 1, or leave out --speculative");
    if (const std::string why = checkpoint_verify(ckpt, MpiCommunicator(MPI_COMM_SELF, "self")); !why.empty())
        throw ConfigError("generate: --checkpoint '" + ckpt + "' is unusable: " + why);
    const std::string& deck_text = meta.deck;
    Deck deck = deck_parse_text(deck_text);
    // The checkpoint's own tokenizer; a checkpoint from before has the data's (--data, else its deck's).
    std::string note;
    const Tokenizer tok = checkpoint_tokenizer(ckpt, meta, data, note);
    if (!note.empty()) std::fprintf(stderr, "generate: %s\n", note.c_str());
    if (!meta.tokenizer.empty() && !data.empty())
        if (const std::string why = tokenizer_change(meta, token_file_read_tokenizer(data)); !why.empty())
            throw ConfigError("generate: --data '" + data + "': " + why);
    if (const int64_t v = checkpoint_vocab_size(ckpt); v >= 0 && v != tok.vocab_size())
        throw ConfigError("generate: the tokenizer (" + tok.describe() + ") has vocabulary " +
                          std::to_string(tok.vocab_size()) + " but checkpoint '" + ckpt + "' was trained with vocabulary " +
                          std::to_string(v) + ": the token file is from another tokenizer");
    deck.model.vocab_size = tok.vocab_size();
    if (stop_id < -1 || stop_id >= tok.vocab_size())
        throw ConfigError("generate: --stop-id = " + std::to_string(stop_id) + ": a token id (0 to " +
                          std::to_string(tok.vocab_size() - 1) + ") or -1 for none");
    ParamTable table = make_param_table(deck.model);
    checkpoint_inspect(ckpt, table);
    std::vector<float> params(table.total);
    checkpoint_load(ckpt, table, params.data());
    std::vector<uint32_t> ids;
    if (vm.count("prompt-ids")) {
        if (vm["prompt"].defaulted() == false && !prompt.empty())
            throw ConfigError("generate: give --prompt or --prompt-ids, not both");
        std::istringstream in(prompt_ids);
        for (std::string w; in >> w;) {
            char* end = nullptr;
            const unsigned long v = std::strtoul(w.c_str(), &end, 10);
            if (*end != '\0' || v >= unsigned(tok.vocab_size()))
                throw ConfigError("generate: --prompt-ids: '" + w + "' is not a token id (0 to " +
                                  std::to_string(tok.vocab_size() - 1) + ")");
            ids.push_back(uint32_t(v));
        }
        prompt = tok.decode(ids.data(), ids.size());
    } else {
        ids = tok.encode(prompt);
    }
    start_if_empty(ids, tok);
    auto be = make_cpu_backend(threads);
    const int trained = meta.trained_context > 0 ? int(meta.trained_context) : deck.data.seq_len;
    const SamplingOptions sampling{temperature, top_k};
    if (many) {
        PromptsOptions po;
        po.file = prompts_file, po.batch = batch, po.tokens = tokens, po.stop_id = stop_id, po.seed = seed;
        po.print_ids = vm.count("print-ids") > 0, po.full_kv = kv_cache == "full", po.checkpoint = ckpt;
        return generate_prompts(*be, deck.model, deck.rope, trained, table, params, tok, sampling, po);
    }
    warn_untrained_positions(deck.rope, trained, int64_t(ids.size()), tokens, "the prompt", ckpt);
    Decoder dec(*be, deck.model, deck.rope, trained, table, params, int(ids.size()) + tokens,
                kv_cache == "full");
    std::fprintf(stderr, "generate: %s attention, KV cache %zu bytes per token (%s, all %d layers), %d threads\n",
                 deck.model.attention.c_str(), dec.cache_bytes_per_token(), kv_cache.c_str(),
                 deck.model.n_layers, be->threads());
    const double t0 = now_s();
    std::mt19937_64 rng(seed);
    std::cout << prompt << std::flush;
    const std::vector<float>* logits = nullptr;
    std::FILE* probs = nullptr;
    if (!probs_out.empty() && !(probs = std::fopen(probs_out.c_str(), "wb")))
        throw ConfigError("generate: --probs '" + probs_out + "': cannot create it");
    std::vector<float> p;
    auto step = [&](int token, int pos) {  // one token through the decoder; its probabilities to --probs
        logits = &dec.step(token, pos);
        if (!probs) return;
        const auto& z = *logits;
        const float mx = *std::max_element(z.begin(), z.end());
        double sum = 0;
        p.resize(z.size());
        for (size_t i = 0; i < z.size(); ++i) sum += (p[i] = std::exp(z[i] - mx));
        for (float& x : p) x = float(x / sum);
        if (std::fwrite(p.data(), sizeof(float), p.size(), probs) != p.size())
            throw RankError("generate: writing --probs '" + probs_out + "' failed");
    };
    // The prompt in one forward (its matmuls have a row per token) where nothing needs the
    // probabilities after each prompt token.
    if (spec) dec.keep_hidden(true);
    if (!probs && ids.size() > 1) {
        const std::vector<int32_t> prompt_ids(ids.begin(), ids.end());
        logits = &dec.prefill(prompt_ids.data(), int(prompt_ids.size()));
    } else {
        for (size_t i = 0; i < ids.size(); ++i) step(int(ids[i]), int(i));
    }
    const double t_prompt = now_s();
    std::vector<int> order(deck.model.vocab_size);
    const size_t prompt_len = ids.size();
    size_t shown = 0;
    bool stopped = false;  // --stop-id came
    auto show = [&](int next) {
        // What the new token adds to the decoded text (SentencePiece decodes a sequence, not
        // token by token: a piece's leading space depends on its place). --stop-id is not text.
        ids.push_back(uint32_t(next));
        if (next == stop_id) {
            stopped = true;
            return;
        }
        const std::string text = tok.decode(ids.data() + prompt_len, ids.size() - prompt_len);
        std::cout << text.substr(std::min(shown, text.size())) << std::flush;
        shown = text.size();
    };
    if (spec && tokens > 0) {
        // The first token from the prompt's logits, then rounds of drafts and one verification.
        MtpSpeculator sp(dec, std::vector<int32_t>(ids.begin(), ids.end()));
        int next = int(std::max_element(logits->begin(), logits->end()) - logits->begin());
        show(next);
        for (int made = 1; made < tokens && !stopped;) {
            const std::vector<int32_t> got = sp.advance(next, tokens - made);
            for (size_t i = 0; i < got.size() && !stopped; ++i) show(got[i]);
            made += int(got.size());
            next = got.back();
        }
        const SpeculativeStats& st = sp.stats();
        std::fprintf(stderr,
                     "generate: speculative mtp (depth %d): %lld verification forwards for %d new tokens; drafted "
                     "%lld, accepted %lld, acceptance rate %.3f\n",
                     dec.mtp_depth(), (long long)st.rounds, tokens, (long long)st.drafted, (long long)st.accepted,
                     st.rate());
    }
    for (int n = 0; n < (spec ? 0 : tokens) && !stopped; ++n) {
        const int next = choose_token(logits->data(), int(logits->size()), sampling, rng, order);
        show(next);
        if (!stopped) step(next, int(ids.size()) - 1);
    }
    std::cout << std::endl;  // the sample's last line ends before the statistics (stderr) begin
    if (probs && std::fclose(probs) != 0) throw RankError("generate: writing --probs '" + probs_out + "' failed");
    if (vm.count("print-ids")) {
        for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
        std::cout << std::endl;
    }
    const double el = (now_s() - t0);
    const int made = int(ids.size() - prompt_len);
    std::fprintf(stderr, "generate: %zu tokens (%zu prompt + %d new%s) in %.3f s: %.1f tokens/s\n", ids.size(),
                 prompt_len, made, stopped ? ", ended by --stop-id" : "", el, double(ids.size()) / std::max(el, 1e-9));
    // The prompt one token at a time through the same step as the new tokens; the new tokens'
    // time includes choosing and decoding them.
    const double prompt_s = t_prompt - t0, new_s = now_s() - t_prompt;
    std::fprintf(stderr, "generate: prompt %zu tokens in %.3f s (%.1f tok/s); %d new tokens in %.3f s (%.1f tok/s)\n",
                 prompt_len, prompt_s, double(prompt_len) / std::max(prompt_s, 1e-9), made, new_s,
                 double(made) / std::max(new_s, 1e-9));
    return 0;
}

}  // namespace quintet
