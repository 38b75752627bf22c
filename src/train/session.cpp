#include "quintet/train/session.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>

#include "quintet/core/error.hpp"
#include "quintet/io/checkpoint.hpp"
#ifdef QUINTET_WITH_CUDA
#include "quintet/comm/nccl_communicator.hpp"
#endif

namespace quintet {

namespace {

// The cores this process may run on: its affinity mask, which mpirun narrows when it binds
// ranks (0 where the mask cannot be read).
int affinity_cores() {
    cpu_set_t mask;
    return sched_getaffinity(0, sizeof mask, &mask) == 0 ? std::max(1, CPU_COUNT(&mask)) : 0;
}

// The threads of a rank bound to fewer cores (mpirun binds each rank to one core by default
// when there are 2 ranks or fewer) share them: a 2x slowdown that only the tokens/s would show.
// Said once, by rank 0, naming the first rank concerned.
void warn_if_threads_exceed_cores(int threads, const MpiCommunicator& world) {
    int cores = affinity_cores();
    if (cores == 0) cores = threads;  // unknown: nothing to say
    const int rank = world.rank();
    // The fewest cores any rank has below its thread count, and the first rank with that many.
    int over = threads > cores ? cores : INT32_MAX;
    world.all_reduce_min(&over, 1);
    int first = threads > cores && cores == over ? rank : INT32_MAX;
    world.all_reduce_min(&first, 1);
    if (rank == 0 && over != INT32_MAX)
        std::cerr << "warning: " << threads << " threads per rank, but rank " << first
                  << " may run on only " << over
                  << " core(s) (its CPU affinity mask), so its threads share them and run slower. "
                     "mpirun binds each rank to one core by default for 2 ranks or fewer: launch "
                     "with `mpirun --bind-to none` or `--map-by slot:PE="
                  << threads << "` (as jobs/common.sh does), or run fewer threads per rank.\n";
}

}  // namespace

int threads_per_rank(const Deck& deck, const MpiCommunicator& world) {
    int threads = 0;
    if (deck.train.threads > 0) threads = deck.train.threads;
    else if (const char* e = std::getenv("OMP_NUM_THREADS"); e && std::atoi(e) > 0) threads = std::atoi(e);
    else {
        const int n = world.split_node()->size();
        int cores = int(sysconf(_SC_NPROCESSORS_ONLN));
        if (const char* e = std::getenv("QUINTET_CORES"); e && std::atoi(e) > 0) cores = std::atoi(e);
        threads = std::max(1, cores / n);
        if (const int bound = affinity_cores(); bound > 0) threads = std::min(threads, bound);
    }
    warn_if_threads_exceed_cores(threads, world);
    return threads;
}

Session::Session(Deck d, const MpiCommunicator& w) : deck(std::move(d)), world(w) {
    // Every rank reads and checks the data headers, so a bad file fails everywhere alike.
    data = data_open(deck.data);
    // A vocab_size the user gave must be the data's; one from a checkpoint's resolved deck (eval)
    // is left to the tokenizer checks, which name both tokenizers.
    if (deck.given.count("model.vocab_size") && deck.model.vocab_size > 0 && deck.model.vocab_size != data.vocab_size)
        config_fail("model.vocab_size", std::to_string(deck.model.vocab_size),
                    "must be 0 or the token file's vocab_size, " + std::to_string(data.vocab_size) + " ('" +
                        data.first_file + "')");
    deck.model.vocab_size = data.vocab_size;
    if (deck.data.eos_id < 0) deck.data.eos_id = data.eos_id;  // resolved into the deck text
    batch_note_ = deck_resolve_global_batch(deck, world.size());
    deck_validate(deck, world.size());
    // The backend, before any output: a missing GPU must stop every rank alike (a ConfigError
    // on some ranks only would leave the others waiting in a collective).
    if (deck.train.device == "cuda") {
        std::string err;
        try {
#ifdef QUINTET_WITH_CUDA
            backend = make_cuda_backend(cuda_local_device(world.handle()));
#else
            backend = make_cuda_backend(0);
#endif
        } catch (const std::exception& e) {
            err = e.what();
        }
        int any = err.empty() ? 0 : 1;
        world.all_reduce_max(&any, 1);
        if (any) throw ConfigError(err.empty() ? "train.device = cuda failed on another rank" : err);
    } else {
        backend = make_cpu_backend(threads_per_rank(deck, world));
    }
}

void Session::resolve(const std::string& warning) {
    // Where the weights come from (resume wins over init_from) and the context they were trained
    // at: rope.original_max_position = 0 resolves to it, so the resolved deck says the number.
    source = resolve_weights_source(deck, world);
    if (!warning.empty()) source.warnings.insert(source.warnings.begin(), warning);
    // The data must be tokenized as the weights were (docs/tokenizers.md, "Checkpoints").
    if (!source.path.empty())
        if (std::string w = weights_tokenizer_check(source.path, data.tokenizer, deck.data.path,
                                                    deck.checkpoint.allow_tokenizer_change, source.resume);
            !w.empty())
            source.warnings.push_back(std::move(w));
    if (!batch_note_.empty()) source.warnings.push_back(batch_note_);
    report_changes(source, deck);  // another model is the first thing to say (it throws)
    keep_global_batch();
    const auto& par = deck.parallel;
    const Layout layout = make_layout(world.size(), par.tp, par.cp, par.pp, par.dp, par.ep);
    // Store the resolved layout, not "auto", so a checkpoint says what it was written with.
    deck.parallel.dp = layout.size[kDP];
    deck_text = deck_to_text(deck);
    source.changes = report_changes(source, deck);
}

void Session::keep_global_batch() {
    // A resume continues the checkpoint's curve: its samples per step, whatever this layout's dp,
    // unless this deck sets train.global_batch itself (then the change is reported as allowed).
    if (source.resume && !source.deck.empty() && !deck.given.count("train.global_batch")) {
        const Deck theirs = deck_parse_text(source.deck);
        const int64_t g = theirs.train.global_batch > 0
                              ? theirs.train.global_batch
                              : int64_t(std::max(theirs.parallel.dp, 1)) * theirs.parallel.microbatches *
                                    theirs.data.micro_batch_size;
        if (g != deck_global_batch(deck, world.size())) {
            const int before = deck.parallel.microbatches;
            deck.train.global_batch = g;
            const auto& p = deck.parallel;
            const int64_t per = int64_t(make_layout(world.size(), p.tp, p.cp, p.pp, p.dp, p.ep).size[kDP]) *
                                deck.data.micro_batch_size;
            if (g % per != 0)
                throw ConfigError("checkpoint.resume '" + source.path + "': the run has " + std::to_string(g) +
                                  " samples per step, not a multiple of dp x data.micro_batch_size = " +
                                  std::to_string(per) + " on this layout; resume on a layout whose dp x "
                                  "micro_batch_size divides it, or set train.global_batch to change the batch");
            deck_resolve_global_batch(deck, world.size());
            source.warnings.push_back("the global batch stays the checkpoint's " + std::to_string(g) +
                                      " samples per step: parallel.microbatches " + std::to_string(before) + " -> " +
                                      std::to_string(deck.parallel.microbatches) +
                                      " on this layout (set train.global_batch to change it)");
        }
    }
    // The resolved deck says the number, so a later resume knows it whatever the layout.
    if (deck.train.global_batch <= 0) deck.train.global_batch = deck_global_batch(deck, world.size());
    deck_validate(deck, world.size());
}

const ProcessGrid& Session::start_grid() {
    const auto& par = deck.parallel;
    const Layout layout = make_layout(world.size(), par.tp, par.cp, par.pp, par.dp, par.ep);
    grid_ = std::make_unique<ProcessGrid>(world, layout, deck.train.collective_timeout_s);
    return *grid_;
}

}  // namespace quintet
