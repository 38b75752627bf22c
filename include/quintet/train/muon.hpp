// Muon: orthogonalised momentum for the hidden and expert matrices (docs/math.md "Muon"), and its
// distribution (docs/parallelism.md "Muon"): each whole matrix is orthogonalised once, by one
// rank of the group that holds its pieces (its owner, model/muon_layout), never per shard.
//
// A step, per group (dense matrices over the ranks of a pipeline stage; experts over those of a
// stage and an expert-parallel rank):
//  1. every rank decays its pieces of the weights (W <- (1 - lr wd) W);
//  2. the reduced gradient of every piece goes to its matrix's owner (one all-to-all-v; each
//     element from one rank: its ZeRO slice's, or under plain data parallelism the replica in
//     the owner's place of the replica group; the owner's own pieces are read in place);
//  3. the owner, matrix by matrix: the whole gradient G assembled, M <- mu M + G,
//     U <- G + mu M, X <- Newton-Schulz(U / |U|), X scaled by -lr scale sqrt(max(rows, cols));
//  4. X's pieces back to every rank that holds them (a second all-to-all-v; its own added in
//     place), each adds them to its weights.
// The momentum lives whole on the owner only. Every buffer is allocated when the optimizer is
// built; a step allocates nothing. The GEMMs go through the backend.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "quintet/comm/communicator.hpp"
#include "quintet/deck/train_config.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/model/muon_layout.hpp"
#include "quintet/model/param_groups.hpp"
#include "quintet/model/params.hpp"
#include "quintet/parallel/device_comms.hpp"

namespace quintet {

// ---- the update of one whole matrix, in the steps the distributed step composes ----
// Nesterov momentum: m <- mu m + g, then g <- g + mu m (g becomes U). y: n floats of scratch.
void muon_momentum(Backend& be, float* m, float* g, float* y, size_t n, float mu);
// x [rows, cols] <- x / (|x|_F + 1e-7), then `steps` Newton-Schulz iterations X <- aX + (bA + cA^2)X
// with A = X X^T (on X^T when rows > cols), (a, b, c) = (3.4445, -4.7750, 2.0315). y: rows x cols
// floats, a2 and b2: min(rows, cols)^2 floats of scratch. Returns the buffer holding the result
// (x or y).
float* muon_orthogonalise(Backend& be, float* x, float* y, float* a2, float* b2, int rows, int cols, int steps);
// The factor of the orthogonalised matrix in the update: scale * sqrt(max(rows, cols)).
double muon_rms_factor(int rows, int cols, double scale);

// A piece of a matrix Muon takes that this rank updates: elements [a, b) of the spec's shard
// (row-major over its lcols columns).
struct MuonSegment {
    size_t spec = 0;  // index in table.specs
    size_t a = 0, b = 0;
};
// Where a segment's element a is this step: its reduced gradient and its parameter.
struct MuonPointers {
    const float* grad = nullptr;
    float* param = nullptr;
};

class Muon {
public:
    // segments: this rank's pieces (each spec at most once). sharded: every element of a replica
    // group is updated by one rank (ZeRO >= 1); else by every replica. tp: the tensor-parallel
    // size. rules: table.specs order. collective over the Muon groups (the plan is exchanged)
    Muon(const ParamTable& table, Backend& be, const DeviceComms& comms, int tp, const TrainConfig& cfg,
         const std::vector<TensorRule>& rules, std::vector<MuonSegment> segments, bool sharded);
    ~Muon();
    Muon(const Muon&) = delete;
    Muon& operator=(const Muon&) = delete;

    const std::vector<MuonSegment>& segments() const { return segments_; }
    // One step at learning rate lr (each tensor's multiplier applied): ptr[i] for segments()[i].
    // collective over the Muon groups
    void step(const MuonPointers* ptr, double lr);

    // The whole matrices this rank orthogonalises and their momentum (checkpoints).
    struct Owned {
        size_t logical = 0;  // index in table.logical
        int rows = 0, cols = 0;
        float* momentum = nullptr;
    };
    const std::vector<Owned>& owned() const { return owned_; }
    // Floats it keeps: the momentum (owned matrices) and the exchange's buffers and scratch.
    size_t momentum_floats() const { return momentum_floats_; }
    size_t buffer_floats() const { return buffer_floats_; }
    // Per step: floats this rank sends in the two exchanges, and the Newton-Schulz FLOPs it runs.
    double sent_floats() const { return sent_floats_; }
    double flops() const { return flops_; }

private:
    struct In {       // a piece of the gradient into the whole matrix
        bool local;   // from this rank's segment `src` (else from the receive buffer at src)
        size_t src;
        MuonRect r;
    };
    struct Out {      // a piece of the update back to its holder
        bool local;   // into this rank's segment `dst` (else into the send buffer at dst)
        size_t dst;
        MuonRect r;
    };
    struct Job {      // one owned matrix
        size_t owned;  // index in owned_
        double lr_mult, factor;  // the tensor's lr multiplier; scale * sqrt(max(rows, cols))
        std::vector<In> in;
        std::vector<Out> out;
    };
    struct Item {     // a segment's floats in the holder's exchange buffer
        size_t seg, at, n;
    };
    struct Group {
        const Communicator* comm = nullptr;
        std::vector<Job> jobs;
        std::vector<Item> send, recv;  // gather: designated pieces out; scatter: every piece in
        std::vector<int> g_sc, g_sd, g_rc, g_rd;  // gather counts and displacements (floats)
        std::vector<int> s_sc, s_sd, s_rc, s_rd;  // scatter
        float* seg_buf = nullptr;       // the holder's: gather send, then scatter receive
        float* gather_recv = nullptr;   // the owner's
        float* scatter_send = nullptr;  // the owner's
    };
    void plan(Group& g, const MpiCommunicator& host, Replicas region, int tp, bool sharded, const ParamTable& table,
              const std::vector<TensorRule>& rules);
    float* alloc(size_t n);

    Backend& be_;
    TrainConfig cfg_;
    std::vector<float> decay_wd_, decay_lr_;  // per segment: wd and lr multipliers for the decay
    std::vector<MuonSegment> segments_;
    std::vector<Owned> owned_;
    Group groups_[2];  // dense, expert
    float* momentum_ = nullptr;
    float *x_ = nullptr, *y_ = nullptr, *a2_ = nullptr, *b2_ = nullptr;
    size_t momentum_floats_ = 0, buffer_floats_ = 0;
    double sent_floats_ = 0, flops_ = 0;
    std::vector<float*> allocated_;
};

}  // namespace quintet
