// model.attention = mla: Multi-head Latent Attention (DeepSeek-V2; the model, maths and cache
// derivation in docs/math.md §7.2). Per token:
//     q      = q_b(RMSNorm(q_a(x)))  (or q_proj(x))          per head [q_nope | q_rope]
//     [c|kr] = kv_a_proj_with_mqa(x)                          c: the latent, kr: one shared k_rope
//     [kn|v] = kv_b(RMSNorm(c))                               per head
//     key    = [kn | RoPE(kr)], query = [q_nope | RoPE(q_rope)], scale 1/sqrt(nope+rope) * m(mscale_all_dim)²,
//              cos/sin times m(mscale)/m(mscale_all_dim) (YaRN, docs/math.md §4.4)
// Training materialises per-head K and V and runs the general attention operation with
// Dqk = nope + rope and Dv = v_head_dim (model/mla.cpp). Generation caches only
// [RMSNorm(c) | RoPE(kr)] per token and absorbs kv_b into the query and the output
// (model/mla_generate.cpp).
//
// Its linear layers (tensor parallelism, docs/parallelism.md): q_b (or q_proj) and kv_b are
// column-parallel by head, o_proj row-parallel; q_a and kv_a (its two row blocks, the latent and
// the shared k_rope) are replicated over tp. Their gradients on a tp rank are the share of its
// heads (every step of their backward is linear in the incoming gradient), so they are summed
// over tp (GradSync::tp), and dx is reduced over tp once at the block's entry. Private to model/.
//
// Context parallelism: parallel.cp_mla_kv = ring sends per-head K|V round the ring (as MHA);
// latent all-gathers the compressed rows [c | RoPE(kr)] (kv_lora_rank + qk_rope_dim numbers per
// token instead of n_heads * (nope + rope + v)) and every rank expands all of them with kv_b.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "quintet/model/block.hpp"
#include "quintet/model/rms_norm.hpp"

namespace quintet {

struct MlaShape {
    int C, NH, NHl, h0, dn, dr, dv, rq, rkv;
    int Dqk() const { return dn + dr; }
    int Qw() const { return NHl * Dqk(); }        // q (and the assembled K) columns on this rank
    int KVBw() const { return NHl * (dn + dv); }  // kv_b output columns on this rank
    int Aw() const { return NHl * dv; }           // V and the attention output columns
    int Lw() const { return rkv + dr; }           // the latent row [c | k_rope]
};
MlaShape mla_shape(const ModelConfig& m, const ModelDims& d);

class MlaAttention final : public AttentionBlock {
public:
    MlaAttention(BlockContext& ctx, const ModelConfig& m, const ParamTable& table, int layer);
    void add_slot(const BufferViews& v) override;
    void add_w_slot(const BufferViews& w) override;
    void forward(int slot, const TokenInfo& tok, const float* params, const Act& xn, const float* x, float* h,
                 KvCache* cache) override;
    const float* backward_input(int slot, int wslot, const TokenInfo& tok, const float* params, const Act& xn,
                                const float* dh) override;
    void backward_weight(int slot, int wslot, const TokenInfo& tok, float* grads, const Act& xn, bool later) override;
    std::unique_ptr<KvCache> make_cache(int max_len, bool full_kv, int sequences) const override;  // mla_generate.cpp
    void probe_logits(int slot, const TokenInfo& tok, RmsProbe& out) const override;

private:
    struct Saved {
        float* qa = nullptr;      // [N, rq] q_a(x), the q norm's input (q_lora_rank > 0)
        float* qa_rstd = nullptr; // [N]
        float* q = nullptr;       // [N, Qw] per head [q_nope | RoPE(q_rope)]
        float* c = nullptr;       // [R, rkv] the latent before its norm (R = N, or cp*N latent)
        float* c_rstd = nullptr;  // [R]
        float* k = nullptr;       // [R, Qw] per head [k_nope | RoPE(kr)]
        float* v = nullptr;       // [R, Aw]
        float* lse = nullptr;     // [B, NHl, T]
    };
    RopeArgs q_rope_args(int N) const { return {N, s_.NHl, s_.Dqk(), s_.dn, s_.dr, s_.Qw()}; }
    RopeArgs kr_rope_args(int N) const { return {N, 1, s_.dr, 0, s_.dr, s_.dr}; }
    AttentionArgs args(const TokenInfo& tok) const;
    void expand(int slot, const float* params, int R);  // rows [0, R) of c (and kr) -> K, V
    void assemble_kv(float* k, float* v, const float* kvb, const float* kr, int R);
    void core_forward(int slot, const TokenInfo& tok);
    void cached_core(int slot, const TokenInfo& tok, const float* params, KvCache* cache);  // mla_generate.cpp

    BlockContext& c_;
    const MlaShape s_;
    bool latent_ = false;
    int R_ = 0;  // key rows this rank expands: N, or cp * N in latent mode
    float scale_ = 1.0f;
    // The linear layers and norms: q_a, its norm and q_b, or q_proj; kv_a's latent rows and its
    // k_rope rows; the latent's norm; kv_b; o_proj.
    std::optional<Linear> q_a_;
    std::optional<RmsNormLayer> q_norm_;
    Linear q_;  // q_b_proj, or q_proj
    Linear kv_c_, kv_r_;
    RmsNormLayer kv_norm_;
    Linear kv_b_;
    RowLinear o_;
    BlockContext::RopeTable rope_{};
    float *kr_, *kvb_, *stage_, *datt_, *dq_, *dk_, *dv_, *dkr_, *dc_, *dcn_, *lse_scratch_;
    float *lat_ = nullptr, *lat_all_ = nullptr, *att32_ = nullptr, *lse_ws_ = nullptr;
    std::vector<Saved> slots_;
};

}  // namespace quintet
