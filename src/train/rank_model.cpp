#include "quintet/train/rank_model.hpp"

#include "quintet/core/error.hpp"
#include "quintet/io/checkpoint.hpp"
#include "quintet/perf/host_peak.hpp"

namespace quintet {

namespace {

// What this rank holds of the model, and the padding of each arena region to its replica
// group's size (so ZeRO-1 shards are even).
ShardPlan shard_plan(const Deck& deck, const ProcessGrid& grid) {
    ShardPlan p;
    p.tp = grid.tp().size();
    p.tp_rank = grid.coord(kTP);
    p.sequence_parallel = deck.parallel.sequence_parallel;
    p.pp = grid.pp().size();
    p.chunks = stage_chunks(deck.model.n_layers, p.pp, deck.parallel.virtual_stages, grid.coord(kPP),
                            deck.parallel.pp_layers, schedule_placement(deck.parallel.schedule));
    p.ep = grid.ep().size();
    p.ep_rank = grid.layout().group_rank(Group::ep, grid.rank());
    p.pad[int(Replicas::dense)] = grid.dp_cp().size();
    p.pad[int(Replicas::expert)] = grid.edp().size();
    p.zero = deck.parallel.zero;
    return p;
}

}  // namespace

RankModel::RankModel(const Deck& deck, const ProcessGrid& grid, Backend& be)
    : deck_(deck), grid_(grid), be_(be), rss_before_(process_rss_bytes()),
      dims_(model_dims(deck.model, grid.tp().size(), grid.coord(kTP))),
      comms_(grid, be, dims_.kv_group(), dims_.tied || dims_.mtp > 0, deck.train.optimizer == "muon"),
      tp_(comms_.group(Group::tp), deck.parallel.sequence_parallel),
      table_(make_param_table(deck.model, shard_plan(deck, grid))) {
    const auto& dc = deck.data;
    host_arena_ = be.device() == Device::cpu;
    const int zero = deck.parallel.zero;
    const bool bf16 = deck.train.precision == "bf16";
    if (zero < 3) params_ = be_.alloc(table_.total);  // zero 3 keeps only its slices (ZeroState)
    if (bf16 && zero < 3) params_bf16_ = be_.alloc_bf16(table_.total);
    if (zero >= 2) zero_ = std::make_unique<ZeroState>(table_, be_, comms_, zero, bf16, params_, params_bf16_);
    if (grid.cp().size() > 1) {
        cp_ = std::make_unique<ContextParallel>(comms_.group(Group::cp), be_, dc.micro_batch_size, dc.seq_len);
        cp_->mla_kv = deck.parallel.cp_mla_kv == "latent" ? MlaKv::latent : MlaKv::ring;
    }
    if (grid.ep().size() > 1)
        ep_ = std::make_unique<ExpertParallel>(comms_.group(Group::ep), be_, deck.model.moe.experts);
    ChunkOptions opt;
    opt.ep = ep_.get();
    opt.precision = deck.train.precision == "bf16" ? Precision::bf16 : Precision::fp32;
    opt.cp = cp_.get();
    opt.document_mask = dc.document_mask;
    opt.document_positions = deck.rope.document_positions;
    opt.eos_id = dc.eos_id;
    opt.recompute = deck.train.recompute == "full"        ? Recompute::full
                    : deck.train.recompute == "selective" ? Recompute::selective
                                                          : Recompute::none;
    opt.split_bw = schedule_splits_backward(deck.parallel.schedule);
    opt.units = zero_.get();
    opt.mtp_weight = deck.train.mtp_weight;
    const int pp = grid.pp().size(), stage = grid.coord(kPP);
    const Placement placement = schedule_placement(deck.parallel.schedule);
    for (const auto& plan : stage_chunks(deck.model.n_layers, pp, deck.parallel.virtual_stages, stage,
                                         deck.parallel.pp_layers, placement)) {
        chunks_.push_back(std::make_unique<ModelChunk>(be_, deck.model, deck.rope, table_, plan, tp_,
                                                       dc.micro_batch_size, dc.seq_len, opt));
        if (params_bf16_) chunks_.back()->set_bf16_weights(params_, params_bf16_);
        // docs/math.md §10: the aux loss is averaged over the step's microbatches of all replicas.
        chunks_.back()->set_aux_scale(1.0 / double(grid.dp().size() * deck.parallel.microbatches));
    }
    std::vector<PipelineStage*> stages;
    for (auto& c : chunks_) stages.push_back(c.get());
    exec_ = std::make_unique<PipelineExecutor>(
        std::move(stages), be_, comms_.group(Group::pp), stage, deck.parallel.virtual_stages,
        make_schedule(deck.parallel.schedule, pp, stage, deck.parallel.microbatches, deck.parallel.virtual_stages),
        deck.parallel.microbatches, dc.micro_batch_size, dc.seq_len, placement);
    // Layout-invariant init: each element is a function of (seed, name, logical index) only --
    // under ZeRO-3 only this rank's slices of it.
    if (params_) {
        std::vector<float> host(table_.total);
        init_params(host.data(), table_, deck.model, deck.init, uint64_t(deck.train.seed), 0, table_.total);
        be_.from_host(params_, host.data(), table_.total);
    } else {
        std::vector<float> host;
        for (const auto& p : zero_->layout().pieces) {
            host.resize(p.owned.size());
            init_params_range(host.data(), table_, deck.model, deck.init, uint64_t(deck.train.seed), p.owned.lo,
                              p.owned.hi);
            be_.from_host(zero_->param_shard() + p.at, host.data(), host.size());
        }
    }
    refresh_bf16_weights();
    flops_per_token_ = model_flops_per_token(table_, dims_, dc.seq_len);
}

RankModel::~RankModel() {
    exec_.reset();
    chunks_.clear();
    zero_.reset();
    if (params_) be_.release(params_);
    if (params_bf16_) be_.release_bf16(params_bf16_);
}

void RankModel::refresh_bf16_weights() {
    if (params_bf16_) be_.to_bf16(params_bf16_, params_, table_.total);
    if (zero_) zero_->params_changed();
}

void RankModel::load_weights(const std::string& path) {
    checkpoint_inspect(path, table_, false);
    std::vector<float> hp;
    float* dst = params_;
    if (!host_arena_ || !params_) {
        hp.resize(table_.total);
        dst = hp.data();
    }
    checkpoint_load(path, table_, dst);
    if (!params_) load_shard(hp.data());
    else if (!host_arena_) be_.from_host(params_, hp.data(), table_.total);
    refresh_bf16_weights();
}

void RankModel::load_shard(const float* whole) {
    for (const auto& p : zero_->layout().pieces)
        be_.from_host(zero_->param_shard() + p.at, whole + p.owned.lo, p.owned.size());
}

void RankModel::take_moe_counts(MoeCounts& counts) {
    for (auto& c : chunks_) c->take_moe_counts(counts);
}

void RankModel::update_balance_bias(const MoeCounts& step) {
    for (auto& c : chunks_) c->update_balance_bias(params_, step);
}

double RankModel::param_bytes() const {
    if (zero_) return zero_->param_bytes();
    const double total = double(table_.total);
    return total * 4 + (params_bf16_ ? total * 2 : 0);
}

double RankModel::activation_bytes() const {
    double b = double(exec_->activation_bytes());
    for (const auto& c : chunks_) b += double(c->scratch_bytes());
    return b;
}

double RankModel::buffer_bytes() const {
    return double(exec_->buffer_bytes()) + (cp_ ? double(cp_->buffer_bytes()) : 0) +
           (ep_ ? double(ep_->buffer_bytes()) : 0);
}

}  // namespace quintet
