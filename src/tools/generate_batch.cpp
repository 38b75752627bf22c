// `quintet generate --prompts FILE`: many prompts decoded together. Each step is one forward of
// the decoder with a row per unfinished sequence, so every linear layer reads its weights once
// for the whole batch instead of once per sequence; attention runs per sequence over its own
// cache. A sequence ends at --tokens new tokens or at --stop-id, and its place in the batch (its
// cache) takes the next prompt of the file. Each row's arithmetic is what a step of that
// sequence alone computes, and each prompt's sampling starts from the same seed, so every line
// of the output is the one `generate --prompt` with that line gives.
#include "generate_batch.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <numeric>

#include "quintet/core/clock.hpp"
#include "quintet/core/error.hpp"
#include "quintet/core/text.hpp"

namespace quintet {

int choose_token(const float* z, int V, const SamplingOptions& o, std::mt19937_64& rng, std::vector<int>& order) {
    if (o.temperature == 0) return int(std::max_element(z, z + V) - z);
    order.resize(size_t(V));
    std::iota(order.begin(), order.end(), 0);
    const int k = o.top_k > 0 ? std::min(o.top_k, V) : V;
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) { return z[a] > z[b]; });
    static thread_local std::vector<double> w;  // kept: no allocation per token
    w.resize(size_t(k));
    for (int i = 0; i < k; ++i) w[size_t(i)] = std::exp((z[order[size_t(i)]] - z[order[0]]) / o.temperature);
    std::discrete_distribution<int> pick(w.begin(), w.end());
    return order[size_t(pick(rng))];
}

void warn_untrained_positions(const RopeConfig& rope, int trained, int64_t prompt, int tokens, const std::string& what,
                              const std::string& ckpt) {
    const int64_t positions = prompt + tokens;
    const bool yarn = rope.scaling == "yarn";
    const int original = rope.original_max_position > 0 ? rope.original_max_position : trained;
    const int64_t reach = yarn ? int64_t(std::llround(rope.factor * original)) : trained;
    if (positions > reach)
        std::fprintf(stderr,
                     "generate: warning: %s (%lld tokens) and --tokens %d reach position %lld, past %s (%lld) "
                     "of checkpoint '%s'%s: positions from %lld on were never trained; proceeding\n",
                     what.c_str(), (long long)prompt, tokens, (long long)positions,
                     yarn ? "the context YaRN extends it to" : "the context its weights were trained at", (long long)reach,
                     ckpt.c_str(),
                     yarn ? "" : " and rope.scaling = none (train or fine-tune with rope.scaling = yarn to extend it)",
                     (long long)reach);
}

std::vector<std::string> read_prompts(const std::string& file) {
    // "-" is standard input, read once: the check before any work keeps what it read.
    static std::vector<std::string> from_stdin;
    static bool stdin_read = false;
    if (file == "-" && stdin_read) return from_stdin;
    std::ifstream f;
    if (file != "-") {
        f.open(file, std::ios::binary);
        if (!f) throw ConfigError("generate: --prompts '" + file + "': cannot read it");
    }
    std::istream& in = file == "-" ? std::cin : f;
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        lines.push_back(line);
    }
    if (in.bad()) throw ConfigError("generate: --prompts '" + file + "': reading it failed");
    if (file == "-") stdin_read = true, from_stdin = lines;
    if (lines.empty()) throw ConfigError("generate: --prompts '" + file + "' has no line: give one prompt per line");
    return lines;
}

namespace {

struct Sequence {
    std::string prompt;
    std::vector<uint32_t> ids;  // prompt, then the new tokens
    size_t prompt_len = 0;
    std::mt19937_64 rng;
    int32_t pending = 0;  // the last chosen token, not yet through the decoder
    bool stopped_by_id = false;
    bool done = false;
};

}  // namespace

int generate_prompts(Backend& be, const ModelConfig& model, const RopeConfig& rope, int trained, const ParamTable& table,
                     const std::vector<float>& params, const Tokenizer& tok, const SamplingOptions& sampling,
                     const PromptsOptions& o) {
    const std::vector<std::string> lines = read_prompts(o.file);
    std::vector<Sequence> seqs(lines.size());
    size_t longest = 0;
    for (size_t i = 0; i < lines.size(); ++i) {
        Sequence& s = seqs[i];
        s.prompt = lines[i];
        s.ids = tok.encode(s.prompt);
        start_if_empty(s.ids, tok);
        s.prompt_len = s.ids.size();
        s.rng.seed(uint64_t(o.seed));
        longest = std::max(longest, s.prompt_len);
    }
    warn_untrained_positions(rope, trained, int64_t(longest), o.tokens, "the longest prompt", o.checkpoint);
    const int slots = int(std::min<size_t>(size_t(o.batch), seqs.size()));
    const int max_len = int(longest) + o.tokens;
    Decoder dec(be, model, rope, trained, table, params, max_len, o.full_kv, slots);
    std::fprintf(stderr, "generate: %zu prompts, %d decoded together, KV cache %zu bytes per token per sequence, %d threads\n",
                 seqs.size(), slots, dec.cache_bytes_per_token(), be.threads());
    const int V = model.vocab_size;
    std::vector<int> order;
    std::vector<int> in_slot(size_t(slots), -1);  // the sequence each slot decodes
    size_t next = 0, printed = 0;
    double prompt_s = 0, step_s = 0;
    long long prompt_tokens = 0, new_tokens = 0, steps = 0, step_tokens = 0;
    // The output in the file's order: a line as soon as it and every line before it are done.
    auto flush = [&] {
        for (; printed < seqs.size() && seqs[printed].done; ++printed) {
            const Sequence& s = seqs[printed];
            const size_t made = s.ids.size() - s.prompt_len;
            const size_t shown = made - (s.stopped_by_id ? 1 : 0);  // the stop token is not text
            std::string line = "{\"index\": " + std::to_string(printed) + ", \"prompt\": \"" + json_escape(utf8_or_replacement(s.prompt)) +
                               "\", \"completion\": \"" +
                               json_escape(utf8_or_replacement(tok.decode(s.ids.data() + s.prompt_len, shown))) +
                               "\", \"prompt_tokens\": " + std::to_string(s.prompt_len) +
                               ", \"new_tokens\": " + std::to_string(made) + ", \"stop\": \"" +
                               (s.stopped_by_id ? "stop_id" : "length") + "\"";
            if (o.print_ids) {
                line += ", \"ids\": [";
                for (size_t i = 0; i < s.ids.size(); ++i) line += (i ? ", " : "") + std::to_string(s.ids[i]);
                line += "]";
            }
            std::cout << line << "}\n" << std::flush;
        }
    };
    // The token chosen from z for sequence s; true when s is finished with it.
    auto take = [&](Sequence& s, const float* z) {
        const int t = choose_token(z, V, sampling, s.rng, order);
        s.ids.push_back(uint32_t(t));
        s.pending = t;
        ++new_tokens;
        s.stopped_by_id = t == o.stop_id;
        return s.stopped_by_id || int(s.ids.size() - s.prompt_len) >= o.tokens;
    };
    // The next prompt into `slot`: its tokens in one forward, its first new token chosen.
    auto start = [&](int slot) {
        while (next < seqs.size()) {
            const int i = int(next++);
            Sequence& s = seqs[size_t(i)];
            if (o.tokens == 0) {
                s.done = true;
                continue;
            }
            const double t0 = now_s();
            dec.reset(slot);
            dec.select(slot);
            const std::vector<int32_t> ids(s.ids.begin(), s.ids.end());
            const std::vector<float>& z = ids.size() > 1 ? dec.prefill(ids.data(), int(ids.size())) : dec.step(ids[0], 0);
            prompt_s += now_s() - t0;
            prompt_tokens += int64_t(ids.size());
            if (take(s, z.data())) {
                s.done = true;
                continue;
            }
            in_slot[size_t(slot)] = i;
            return;
        }
        in_slot[size_t(slot)] = -1;
    };
    for (int slot = 0; slot < slots; ++slot) start(slot);
    flush();
    std::vector<int> rows_slot, finished;  // per step, kept
    std::vector<int32_t> rows_id;
    for (;;) {
        rows_slot.clear(), rows_id.clear();
        for (int slot = 0; slot < slots; ++slot)
            if (in_slot[size_t(slot)] >= 0) {
                rows_slot.push_back(slot);
                rows_id.push_back(seqs[size_t(in_slot[size_t(slot)])].pending);
            }
        if (rows_slot.empty()) break;
        const double t0 = now_s();
        const std::vector<float>& z = dec.step_batch(rows_slot.data(), rows_id.data(), int(rows_slot.size()));
        ++steps;
        step_tokens += (long long)rows_slot.size();
        finished.clear();
        for (size_t r = 0; r < rows_slot.size(); ++r) {
            Sequence& s = seqs[size_t(in_slot[size_t(rows_slot[r])])];
            if (take(s, z.data() + r * size_t(V))) {
                s.done = true;
                finished.push_back(rows_slot[r]);
            }
        }
        step_s += now_s() - t0;
        for (int slot : finished) start(slot);
        flush();
    }
    flush();
    std::fprintf(stderr,
                 "generate: prompts %lld tokens in %.3f s (%.1f tok/s); %lld new tokens, %lld of them in %lld batched "
                 "steps, %.3f s (%.1f tok/s)\n",
                 prompt_tokens, prompt_s, double(prompt_tokens) / std::max(prompt_s, 1e-9), new_tokens, step_tokens, steps,
                 step_s, double(step_tokens) / std::max(step_s, 1e-9));
    return 0;
}

}  // namespace quintet
