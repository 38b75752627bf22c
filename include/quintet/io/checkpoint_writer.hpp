// Writing a checkpoint (docs/formats.md "Checkpoint", docs/reliability.md "Checkpoints"), in
// three phases, so that the long middle one can run on a thread of its own while training goes on
// (checkpoint.async):
//  1. open (collective; the calling thread): rank 0 checks that the file system has room, then
//     creates step_N.h5.tmp with serial HDF5 -- the attributes, the tokenizer, the run state and
//     every tensor's dataset with its storage allocated but nothing written -- and every rank
//     learns where each dataset's bytes lie in the file;
//  2. write (any thread; no HDF5 and no MPI call, so neither library is ever used from two
//     threads at once): this rank's part of every tensor is written with pwrite at those
//     offsets, its share of each tensor's checksum summed on the way, and the file fdatasync'd;
//     rank 0 first makes the metrics snapshot beside the checkpoint durable;
//  3. commit (collective; the thread of phase 1): a failure on any rank is agreed on and reported
//     by every rank (the partial file removed, the earlier checkpoints untouched); else the
//     checksums are all-reduced and written as the datasets' `checksum` attributes, the file is
//     closed, fsync'd and renamed, `latest` is replaced (tmp, fsync, rename), and checkpoints
//     beyond `keep` are pruned.
// checkpoint_save (io/checkpoint.hpp) runs the three in a row.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/io/checkpoint.hpp"
#include "quintet/model/params.hpp"

namespace quintet {

// One range of the parameter arena this rank writes, and where its values are in host memory,
// each [arena.size()] floats: the parameters (/params), or AdamW's two moments of a range of its
// tensors (/optim/exp_avg, /optim/exp_avg_sq); a source holds either or both (null: not this
// source's).
struct CheckpointSource {
    Range arena;
    const float* params = nullptr;
    const float* exp_avg = nullptr;
    const float* exp_avg_sq = nullptr;
};

// Muon's momentum of one whole matrix (/optim/momentum/<name>, table.logical[logical].numel()
// floats in host memory), written by the rank that orthogonalises it.
struct CheckpointWhole {
    size_t logical = 0;
    const float* data = nullptr;
};

class CheckpointWriter {
public:
    // Phase 1. collective over `comm`. `sources` and `momentum` must stay valid and unchanged
    // until write() returns; meta.optimizer says which tensors have AdamW's moments and which
    // Muon's momentum (io/checkpoint.hpp OptimizerStateIo). `metrics_tmp` (rank 0, may be ""): a finished copy of metrics.h5 at
    // checkpoint_metrics_path(path()) + ".tmp", made durable and renamed by write(). Throws
    // IoError on every rank (nothing written) when the file system has no room, or when rank 0
    // cannot create the file.
    CheckpointWriter(const MpiCommunicator& comm, const std::string& run_dir, const CheckpointMeta& meta,
                     const ParamTable& table, std::vector<CheckpointSource> sources,
                     std::vector<CheckpointWhole> momentum, int keep, const std::string& metrics_tmp = "");
    ~CheckpointWriter();  // not committed: the partial file is removed (rank 0)
    CheckpointWriter(const CheckpointWriter&) = delete;
    CheckpointWriter& operator=(const CheckpointWriter&) = delete;

    const std::string& path() const { return final_path_; }  // run_dir/checkpoints/step_N.h5
    size_t bytes() const { return bytes_; }                    // what this rank writes

    // Phase 2: "" when done, else what failed, naming the file ("write of X: No space left on
    // device"). Returns early (with "cancelled") once *cancel is set. Any thread; never throws.
    std::string write(const std::atomic<bool>* cancel = nullptr) noexcept;

    // Phase 3. collective over the communicator of phase 1. `error`: this rank's write() result.
    // Returns the final path, or throws IoError on every rank naming the rank, the file and the
    // error of the first rank that failed (the file removed, `latest` unchanged).
    std::string commit(const std::string& error);

private:
    struct Piece {        // elements [a, b) of this rank's shard `spec` of dataset `dataset`
        size_t dataset;
        const ParamSpec* spec;  // null: elements [a, b) of the whole tensor (Muon's momentum)
        size_t a, b;
        const float* src;  // element a
    };
    void create_file(const CheckpointMeta& meta, const ParamTable& table, std::vector<uint64_t>& offsets);
    void discard() noexcept;  // rank 0: the partial file (and the metrics snapshot beside it) removed

    const MpiCommunicator& comm_;
    std::string run_dir_, final_path_, tmp_path_, metrics_tmp_;
    int64_t step_ = 0;
    int keep_ = 0;
    std::vector<CheckpointSource> sources_;
    std::vector<Piece> pieces_;
    std::vector<uint64_t> offsets_;    // every dataset's first byte in the file
    std::vector<uint64_t> checksums_;  // this rank's share, per dataset
    size_t datasets_ = 0, bytes_ = 0;
    bool committed_ = false;
    struct Open;                   // rank 0: the HDF5 file and datasets, open from phase 1 to 3
    std::unique_ptr<Open> open_;
};

}  // namespace quintet
