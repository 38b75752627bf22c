// The start every job that runs the model shares (`quintet train`, `quintet eval`), in the order
// that keeps every error before any work and every rank in agreement: the headers of every
// shard of data.path and data.val_path read and checked on every rank (tokens are streamed later), the deck resolved against it (vocabulary, end-of-document id) and
// validated for this world, the backend made (a missing GPU stops all ranks alike), where the
// weights come from, the layout (dp resolved into the deck), the resolved deck's text, and last
// the process grid.
#pragma once
#include <memory>
#include <string>

#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/deck/deck.hpp"
#include "quintet/data/dataset.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/parallel/layout.hpp"
#include "quintet/parallel/process_grid.hpp"
#include "quintet/train/checkpointing.hpp"

namespace quintet {

// Threads per rank: train.threads, else OMP_NUM_THREADS, else this rank's cores shared by the
// node's ranks (warns when a rank's threads exceed the cores it may run on). collective
int threads_per_rank(const Deck& deck, const MpiCommunicator& world);

class Session {
public:
    // Reads the headers of deck.data.path (and val_path), resolves and validates the deck, makes the backend. collective
    Session(Deck deck, const MpiCommunicator& world);
    // Where the weights come from (it may resolve rope.original_max_position), the layout, and
    // the resolved deck's text; `warning` (if not empty) goes first among the source's warnings.
    // collective
    void resolve(const std::string& warning = "");
    // The process grid, after the resolved deck was shown. collective
    const ProcessGrid& start_grid();

    Deck deck;
    DataSet data;
    std::unique_ptr<Backend> backend;
    WeightsSource source;    // after resolve()
    std::string deck_text;   // after resolve()
    const MpiCommunicator& world;

private:
    // Resume: the checkpoint's samples per step, unless the deck sets train.global_batch; then
    // the number goes into the resolved deck. ConfigError where this layout cannot run it.
    void keep_global_batch();
    std::unique_ptr<ProcessGrid> grid_;
    std::string batch_note_;  // deck_resolve_global_batch's, shown with the source's warnings
};

}  // namespace quintet
