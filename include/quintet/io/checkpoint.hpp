// Checkpoints: one HDF5 file per checkpoint, written by every rank together (io/checkpoint_writer:
// rank 0 lays out the file with HDF5, each rank writes its part of every tensor into it).
// Every tensor is stored whole, under its Hugging Face name and logical shape; each rank writes
// the part of the flat arena it owns, so a checkpoint loads into any other layout.
// The file is written as step_NNNNNNNN.h5.tmp, fsync'd and renamed when complete; `latest` (a
// one-line text file, written the same way) names the last complete checkpoint; only then are
// old ones pruned. Every dataset carries a "checksum" attribute, verified before a load.
// Formats: docs/formats.md.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "quintet/comm/mpi_communicator.hpp"
#include "quintet/model/params.hpp"
#include "quintet/parallel/layout.hpp"
#include "quintet/tokenizer/tokenizer.hpp"

namespace quintet {

constexpr int64_t kCheckpointFormatVersion = 1;
// The run state kept beside the tensors (docs/formats.md): group /train_state, its attribute
// `skips_in_row` and the dataset spike_window [n, 2] float64 (loss, gradient norm of the last n
// accepted steps, oldest first; train/spikes).
inline constexpr const char* kCheckpointStateGroup = "/train_state";
inline constexpr const char* kCheckpointSpikeWindow = "spike_window";

struct CheckpointMeta {
    int64_t step = 0;
    int64_t tokens_seen = 0;
    std::string deck;    // resolved deck text
    std::string layout;  // e.g. "tp=1 cp=1 dp=2 pp=1 zero=1"
    // The longest sequence the weights were trained at (their run and the runs they came from);
    // 0 in checkpoints older than the attribute (then the deck's data.seq_len stands in).
    int64_t trained_context = 0;
    // The tokenizer of the data the weights were trained on (group /tokenizer, the same as in the
    // token file, io/tokenizer_store.hpp); empty in checkpoints from before it travelled with them.
    TokenizerState tokenizer;
    // The parameter groups' multipliers the run trained with (model/param_groups.hpp groups_text);
    // empty in checkpoints older than the attribute.
    std::string param_groups;
    // The optimizer whose state /optim holds (train.optimizer): "adamw" in checkpoints older
    // than the attribute.
    std::string optimizer = "adamw";
    // The data blend's segments (data/sampler.hpp, blend_segments_text): "" in checkpoints older
    // than the attribute (the deck's weights from sample 0).
    std::string blend;
    // The run state (/train_state; empty and 0 in checkpoints older than it): the spike window,
    // [n][2] row-major, and the skipped steps in a row at the checkpoint.
    std::vector<double> spike_window;
    int64_t skips_in_row = 0;
};

// The optimizer state of a checkpoint (docs/formats.md): for every trainable tensor AdamW's two
// moments (/optim/exp_avg/<name>, /optim/exp_avg_sq/<name>), except, under optimizer = muon, the
// matrices Muon takes (model/param_groups.hpp muon_takes): their momentum, /optim/momentum/<name>.
// A rank's AdamW moments sit in arrays indexed through ArenaRange's state_index; Muon's momentum
// whole on the rank that orthogonalises the matrix.
struct OptimizerStateIo {
    std::string optimizer = "adamw";  // adamw | muon
    float* exp_avg = nullptr;
    float* exp_avg_sq = nullptr;
    // save: the parts of the AdamW tensors this rank writes; load: those whose moments it holds
    std::vector<ArenaRange> ranges;
    struct Whole {
        size_t logical = 0;  // index in table.logical
        float* data = nullptr;
    };
    std::vector<Whole> momentum;  // the whole matrices whose momentum this rank keeps
    bool muon_tensor(const LogicalTensor& t) const;
};

// "" when a run on data tokenized by `data_tok` may take its weights from a checkpoint with
// `meta`; else the problem, naming both tokenizers (and both vocabulary sizes when they differ).
// A checkpoint without a tokenizer (older than the group) is accepted: the caller says where the
// tokenizer is taken from (tokenizer_source_note).
std::string tokenizer_change(const CheckpointMeta& meta, const Tokenizer& data_tok);
// The check before a run takes its weights from `checkpoint` (resume, or init_from) and trains
// on the token file `data_path` tokenized by `data_tok`. A tokenizer that is not the
// checkpoint's, or (a checkpoint without one) another vocabulary size, is a ConfigError naming
// both, unless `allow` (checkpoint.allow_tokenizer_change). Allowed, the vocabulary may grow for
// init_from (vocabulary extension: the new rows start as the mean of the trained ones,
// checkpoint_load), never shrink, nor change on resume. Returns a warning to print, or "".
std::string weights_tokenizer_check(const std::string& checkpoint, const Tokenizer& data_tok,
                                    const std::string& data_path, bool allow, bool resume);
// The vocabulary the weights were trained with: the rows of the embedding
// (/params/model.embed_tokens.weight), or -1 when it has none. ConfigError as checkpoint_read_meta.
int64_t checkpoint_vocab_size(const std::string& path);
// For a checkpoint without a tokenizer: "checkpoint X has no tokenizer (...); using the one of Y".
std::string tokenizer_source_note(const std::string& checkpoint, const std::string& taken_from);

// Collective over `comm` (every rank of the job). params: this rank's local arena; `writes`:
// the ranges of it this rank writes (tensors it holds as a non-writer replica are skipped);
// `state`: its optimizer state (ranges: the parts it writes). Returns the final path. Old
// checkpoints beyond `keep` are removed. meta.optimizer is taken from state.optimizer. The three
// phases of io/checkpoint_writer.hpp in a row.
std::string checkpoint_save(const MpiCommunicator& comm, const std::string& run_dir, const CheckpointMeta& meta,
                            const ParamTable& table, const float* params, const std::vector<ArenaRange>& writes,
                            const OptimizerStateIo& state, int keep);

// run_dir/checkpoints/step_NNNNNNNN.h5, and the metrics snapshot kept beside it
// (step_NNNNNNNN.metrics: metrics.h5 as it was when the checkpoint was written; pruned with it).
std::string checkpoint_path(const std::string& run_dir, int64_t step);
std::string checkpoint_metrics_path(const std::string& checkpoint);

// The path named by run_dir/checkpoints/latest, or "" when there is none.
std::string checkpoint_latest(const std::string& run_dir);

// The checkpoint file a command's `--checkpoint` names (`what`, e.g. "eval: --checkpoint"): a file
// as it is; a run folder, its checkpoints/ folder (a trailing slash or not) or the `latest` file
// in it: the checkpoint `latest` names. *note (when given) says which file a folder or `latest`
// resolved to. ConfigError for a folder without `latest`, or a `latest` naming a missing file.
std::string checkpoint_resolve(const std::string& given, const std::string& what, std::string* note = nullptr);

// "" when `path` opens, every tensor reads in full and matches its stored checksum (checkpoints
// from before the checksums: every tensor reads); else why not, e.g. "tensor /params/x does not
// match its checksum". The ranks of `comm` share the reading. collective over comm
std::string checkpoint_verify(const std::string& path, const MpiCommunicator& comm);
// resume = auto: `latest`, else the newest step_*.h5, that verifies ("" when none does). Each
// one passed over is added to `skipped` with the reason. collective over comm
std::string checkpoint_newest_valid(const std::string& run_dir, const MpiCommunicator& comm,
                                    std::vector<std::string>* skipped);

// The attributes of a checkpoint (no tensor read); ConfigError naming the file when it is
// missing, not HDF5, not a quintet checkpoint or of another format_version.
CheckpointMeta checkpoint_read_meta(const std::string& path);

// Checks that `path` is a complete quintet checkpoint whose tensors have exactly the logical
// shapes of `table`; throws ConfigError naming the first mismatch. Collective-safe (read-only).
// with_optimizer: and the optimizer state of the file's own optimizer (its attribute).
// with_optimizer = false: the parameters only (weights-only loads: init_from, eval, generate);
// then the embedding and lm_head may have fewer rows than `table` (a vocabulary extension,
// allowed by weights_tokenizer_check: checkpoint_load starts the new rows as the mean of the rest).
CheckpointMeta checkpoint_inspect(const std::string& path, const ParamTable& table,
                                  bool with_optimizer = true);

// Reads this rank's shard of every tensor into the local arena `params`, and (when `state` is
// given) the optimizer state it holds (state->ranges: the parts of AdamW's tensors; the whole
// matrices of state->momentum). A state tensor the file lacks is an error unless
// `missing_state_is_zero` (the optimizer changed, checkpoint.allow_optimizer_change): then it is
// left as it is (zero). Independent per rank.
void checkpoint_load(const std::string& path, const ParamTable& table, float* params,
                     const OptimizerStateIo* state = nullptr, bool missing_state_is_zero = false);

}  // namespace quintet
