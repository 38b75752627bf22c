// Runs one stage's pipeline action list (parallel/pipeline_schedule) on this rank's model
// chunks: forward and backward per microbatch, activations of the microbatches in flight kept in
// chunk slots, point-to-point sends and receives on the pp communicator. Receives are posted one
// action ahead into a staging buffer, so the next message can land while this stage computes;
// sends are non-blocking and a slot is reused only once its sends completed. Knows nothing of
// data parallelism, optimizers or files, and nothing of the model: it drives PipelineStage, which
// the model's chunk (model/transformer.hpp) implements and a test can implement without a model.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "quintet/comm/communicator.hpp"
#include "quintet/kernels/backend.hpp"
#include "quintet/parallel/grad_ready.hpp"
#include "quintet/parallel/pipeline_schedule.hpp"

namespace quintet {

// One virtual stage of the model on this rank, as the executor sees it: activations of the
// microbatches in flight live in slots; the boundary tensors [boundary_floats()] travel
// between stages.
class PipelineStage {
public:
    virtual ~PipelineStage() = default;
    virtual int add_slot() = 0;  // one more microbatch in flight; returns its index
    virtual int slots() const = 0;
    // Forward of one microbatch into `slot` (ids and targets: the whole microbatch, host [B*T],
    // read when needs_tokens()); returns the sum of token cross-entropies (last stage) or 0.
    virtual double forward(int slot, const float* params, const int32_t* ids, const int32_t* targets,
                           float grad_scale, bool need_grad) = 0;
    virtual double aux_loss(int slot) const = 0;  // the auxiliary losses of slot's last forward
    // The multi-token prediction modules' summed cross-entropies of slot's last forward (0: none).
    virtual double mtp_loss(int slot) const { (void)slot; return 0.0; }
    // Backward of the microbatch in `slot`; gradients accumulate into `grads`; `hook` is told of
    // each finished gradient (or null).
    virtual void backward(int slot, const float* params, float* grads, GradReadyHook* hook) = 0;
    // The backward in two parts (zero-bubble schedules): B leaves grad_input(slot) and writes no
    // gradient; W, later, accumulates the parameter gradients. B then W = backward.
    virtual void backward_input(int slot, const float* params) = 0;
    virtual void backward_weight(int slot, const float* params, float* grads, GradReadyHook* hook) = 0;
    virtual bool needs_tokens() const = 0;
    virtual float* input(int slot) = 0;        // from the previous stage
    virtual float* output(int slot) = 0;       // to the next stage
    virtual float* grad_output(int slot) = 0;  // from the next stage
    virtual float* grad_input(int slot) = 0;   // to the previous stage
    virtual size_t boundary_floats() const = 0;
    virtual size_t slot_bytes() const = 0;       // activation bytes of one slot
    virtual size_t workspace_bytes() const = 0;  // activation bytes kept once for all slots
};

class PipelineExecutor {
public:
    // stages: this rank's virtual stages (chunk c = virtual_stage(pp, stage, c, placement)); all
    // share B and T. A transfer whose peer is this stage itself (zbv's turn of the V) is staged
    // in local buffers, as many as the list ever has in flight (self_messages_in_flight).
    PipelineExecutor(std::vector<PipelineStage*> chunks, Backend& be,
                     const Communicator& pp_comm, int stage, int virtual_stages,
                     std::vector<Action> actions, int microbatches, int B, int T,
                     Placement placement = Placement::loop);
    ~PipelineExecutor();

    // Fills microbatch mb's tokens: ids[B*T], targets[B*T] (host).
    using Data = std::function<void(int mb, int32_t* ids, int32_t* targets)>;
    struct Result {
        double ce_sum = 0;    // sum of token cross-entropies (last virtual stage; else 0)
        double aux_sum = 0;   // sum over microbatches of the chunks' auxiliary losses
        double mtp_sum = 0;   // sum of the MTP modules' token cross-entropies (last virtual stage)
        double t_wait = 0;    // seconds blocked in pipeline receives
    };
    // One step's schedule. Gradients accumulate into grads; `last_hook` is told of finished
    // gradients during each chunk's last backward of the step (or null).
    // collective over pp (and tp inside the chunks)
    Result run(const float* params, float* grads, float grad_scale, const Data& data,
               GradReadyHook* last_hook);
    // Forward only of one microbatch through every virtual stage (evaluation); returns this
    // stage's share of the cross-entropy sum. collective over pp
    double forward_only(const float* params, const int32_t* ids, const int32_t* targets);

    // Activation bytes of the microbatches in flight at this step's peak, over this stage's chunks.
    size_t activation_bytes() const;
    // The receive staging of the next message (one microbatch's boundary activations), and the
    // local staging of the messages this stage sends itself.
    size_t buffer_bytes() const;

private:
    int acquire_slot(int chunk);
    bool to_self(const Action& a) const { return schedule_peer(pp_, v_, stage_, a, placement_).stage == stage_; }
    std::vector<PipelineStage*> chunks_;
    Backend& be_;
    const Communicator& comm_;
    int pp_, stage_, v_, m_, B_, T_;
    std::vector<Action> actions_;
    Placement placement_;
    float* recv_stage_ = nullptr;  // [Nr, C] the pre-posted receive lands here
    // Messages to this stage itself: a pool of [Nr, C] buffers, and per direction (fwd, bwd) the
    // ones sent and not yet received, in order.
    std::vector<float*> local_;
    std::vector<float*> local_free_;
    std::vector<float*> local_queue_[2];
    std::vector<int32_t> ids_, tgt_;
    // per chunk: free slots, the slot of each microbatch, sends in flight per slot
    std::vector<std::vector<int>> free_slots_, slot_of_mb_;
    std::vector<std::vector<std::vector<int>>> pending_;
    std::vector<int> in_flight_, peak_in_flight_;
    std::vector<int> backwards_left_;  // per chunk: backward (or backward_weight) actions still to run this step
};

}  // namespace quintet
