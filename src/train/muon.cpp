#include "quintet/train/muon.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <unordered_map>

#include "quintet/core/error.hpp"
#include "quintet/core/profile.hpp"

namespace quintet {

// ---- one whole matrix ---------------------------------------------------------------------

void muon_momentum(Backend& be, float* m, float* g, float* y, size_t n, float mu) {
    be.scale(m, n, mu);
    be.add_inplace(m, g, n);  // M <- mu M + G
    be.copy(y, m, n);
    be.scale(y, n, mu);
    be.add_inplace(g, y, n);  // U <- G + mu M
}

float* muon_orthogonalise(Backend& be, float* x, float* y, float* a2, float* b2, int rows, int cols, int steps) {
    const size_t n = size_t(rows) * size_t(cols);
    const double norm = std::sqrt(be.sumsq(x, n));
    be.scale(x, n, float(1.0 / (norm + 1e-7)));
    constexpr float a = 3.4445f, b = -4.7750f, c = 2.0315f;
    // A tall matrix is iterated as its transpose: A = X^T X, and (B X^T)^T = X B^T.
    const bool tall = rows > cols;
    const int m = tall ? cols : rows;
    const size_t mm = size_t(m) * size_t(m);
    for (int s = 0; s < steps; ++s) {
        if (tall) be.gemm(true, false, m, m, rows, 1.0f, x, cols, x, cols, 0.0f, a2, m);
        else be.gemm(false, true, m, m, cols, 1.0f, x, cols, x, cols, 0.0f, a2, m);
        be.copy(b2, a2, mm);
        be.gemm(false, false, m, m, m, c, a2, m, a2, m, b, b2, m);  // B = b A + c A A
        be.copy(y, x, n);
        if (tall) be.gemm(false, true, rows, cols, m, 1.0f, x, cols, b2, m, a, y, cols);
        else be.gemm(false, false, rows, cols, m, 1.0f, b2, m, x, cols, a, y, cols);
        std::swap(x, y);
    }
    return x;
}

double muon_rms_factor(int rows, int cols, double scale) { return scale * std::sqrt(double(std::max(rows, cols))); }

// ---- the distributed step -----------------------------------------------------------------

namespace {
// A piece's description, sent to its matrix's owner when the plan is made.
constexpr int kDesc = 7;  // matrix (index in the group's list), row0, col0, lcols, a, b, designated

int as_int(size_t v, const char* what) {
    QUINTET_CHECK(v <= size_t(INT_MAX), std::string("Muon: ") + what + " past 2^31 elements");
    return int(v);
}

std::vector<int> displacements(const std::vector<int>& counts) {
    std::vector<int> d(counts.size(), 0);
    for (size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
    return d;
}

size_t total(const std::vector<int>& counts) {
    size_t t = 0;
    for (int c : counts) t += size_t(c);
    return t;
}
}  // namespace

float* Muon::alloc(size_t n) {
    if (n == 0) return nullptr;
    float* p = be_.alloc(n);
    allocated_.push_back(p);
    buffer_floats_ += n;
    return p;
}

Muon::Muon(const ParamTable& table, Backend& be, const DeviceComms& comms, int tp, const TrainConfig& cfg,
           const std::vector<TensorRule>& rules, std::vector<MuonSegment> segments, bool sharded)
    : be_(be), cfg_(cfg), segments_(std::move(segments)) {
    QUINTET_CHECK(comms.muon_stage_host && comms.muon_expert_host, "Muon without its communicators");
    for (const MuonSegment& s : segments_) {
        const TensorRule r = rules.empty() ? TensorRule{} : rules[s.spec];
        decay_lr_.push_back(float(r.lr_mult));
        decay_wd_.push_back(float(cfg_.weight_decay * r.wd_mult));
    }
    groups_[0].comm = comms.muon_stage;
    groups_[1].comm = comms.muon_expert;
    plan(groups_[0], *comms.muon_stage_host, Replicas::dense, tp, sharded, table, rules);
    plan(groups_[1], *comms.muon_expert_host, Replicas::expert, tp, sharded, table, rules);
    // The momentum of the owned matrices, back to back, and the scratch of the largest one.
    size_t largest = 0, largest_side = 0;
    for (const Owned& o : owned_) {
        momentum_floats_ += size_t(o.rows) * size_t(o.cols);
        largest = std::max(largest, size_t(o.rows) * size_t(o.cols));
        const size_t side = size_t(std::min(o.rows, o.cols));
        largest_side = std::max(largest_side, side * side);
        flops_ += newton_schulz_flops({o.rows, o.cols}, cfg_.muon_ns_steps);
    }
    if (momentum_floats_ > 0) {
        momentum_ = be_.alloc(momentum_floats_);
        allocated_.push_back(momentum_);
    }
    size_t at = 0;
    for (Owned& o : owned_) {
        o.momentum = momentum_ + at;
        at += size_t(o.rows) * size_t(o.cols);
    }
    x_ = alloc(largest), y_ = alloc(largest), a2_ = alloc(largest_side), b2_ = alloc(largest_side);
}

Muon::~Muon() {
    for (float* p : allocated_) be_.release(p);
}

void Muon::plan(Group& g, const MpiCommunicator& host, Replicas region, int tp, bool sharded, const ParamTable& table,
                const std::vector<TensorRule>& rules) {
    const int G = host.size(), me = host.rank();
    // The group's matrices: those of `region` this rank holds a shard of, in checkpoint order --
    // the same list on every rank of the group (it holds the same layers and experts).
    std::unordered_map<std::string, size_t> logical_at;
    for (size_t i = 0; i < table.logical.size(); ++i) logical_at.emplace(table.logical[i].name, i);
    std::vector<size_t> specs;  // spec index per matrix
    for (size_t i = 0; i < table.specs.size(); ++i)
        if (table.specs[i].replicas == region && muon_takes(table.specs[i])) specs.push_back(i);
    std::sort(specs.begin(), specs.end(), [&](size_t x, size_t y) {
        return logical_at.at(table.specs[x].name) < logical_at.at(table.specs[y].name);
    });
    // Every rank of the group must list the same matrices (a wrong group would hang or mix them).
    double h = 0;
    for (size_t k = 0; k < specs.size(); ++k) h = std::fmod(h * 1000003.0 + double(logical_at.at(table.specs[specs[k]].name)) + 1, 9007199254740881.0);
    double hh[2] = {h, -h};
    host.all_reduce_max(hh, 2);
    QUINTET_CHECK(hh[0] == -hh[1], "Muon: the ranks of group " + host.name() + " hold different matrices");
    if (specs.empty()) {
        g.comm = nullptr;  // no matrix of this kind on this stage: the group sits out
        return;
    }
    std::vector<MuonMatrix> mats;
    for (size_t i : specs) mats.push_back({table.specs[i].rows, table.specs[i].cols});
    const std::vector<int> owner = muon_owners(mats, G);
    std::unordered_map<size_t, size_t> k_of_spec;
    for (size_t k = 0; k < specs.size(); ++k) k_of_spec.emplace(specs[k], k);

    // This rank's segments in the group, and whether it is the one that sends each element: its
    // ZeRO slice is its own; under plain data parallelism every replica holds the piece and the
    // one in the owner's place of the replica group sends it; of tp replicas, the writer.
    struct Mine {
        size_t seg, k;
        int owner;
        bool designated;
    };
    std::vector<Mine> mine;
    for (size_t s = 0; s < segments_.size(); ++s) {
        auto it = k_of_spec.find(segments_[s].spec);
        if (it == k_of_spec.end()) continue;
        const ParamSpec& spec = table.specs[segments_[s].spec];
        const int o = owner[it->second];
        mine.push_back({s, it->second, o, spec.writer && (sharded || me / tp == o / tp)});
    }
    std::stable_sort(mine.begin(), mine.end(), [](const Mine& x, const Mine& y) { return x.owner < y.owner; });

    // The descriptions of the pieces with another owner, to that owner.
    std::vector<int> dsc(size_t(G), 0), drc(size_t(G), 0);
    std::vector<int32_t> dsend;
    for (const Mine& m : mine) {
        if (m.owner == me) continue;
        const MuonSegment& s = segments_[m.seg];
        const ParamSpec& spec = table.specs[s.spec];
        dsc[size_t(m.owner)] += kDesc;
        for (int v : {int(m.k), spec.row0, spec.col0, spec.lcols, as_int(s.a, "a shard"), as_int(s.b, "a shard"),
                      int(m.designated)})
            dsend.push_back(v);
    }
    host.all_to_all_counts(dsc.data(), drc.data());
    std::vector<int32_t> drecv(total(drc));
    const std::vector<int> dsd = displacements(dsc), drd = displacements(drc);
    host.all_to_allv(dsend.data(), dsc.data(), dsd.data(), drecv.data(), drc.data(), drd.data());

    // Holder side: designated pieces out, every piece back, per owner in this rank's order.
    g.g_sc.assign(size_t(G), 0), g.s_rc.assign(size_t(G), 0);
    size_t at_send = 0, at_recv = 0;
    for (const Mine& m : mine) {
        if (m.owner == me) continue;
        const MuonSegment& s = segments_[m.seg];
        const size_t n = s.b - s.a;
        g.recv.push_back({m.seg, at_recv, n});
        at_recv += n;
        g.s_rc[size_t(m.owner)] += as_int(n, "a piece");
        if (m.designated) {
            g.send.push_back({m.seg, at_send, n});
            at_send += n;
            g.g_sc[size_t(m.owner)] += as_int(n, "a piece");
        }
    }
    g.g_sd = displacements(g.g_sc), g.s_rd = displacements(g.s_rc);

    // Owner side: one job per owned matrix.
    std::vector<size_t> job_of(specs.size(), SIZE_MAX);
    for (size_t k = 0; k < specs.size(); ++k) {
        if (owner[k] != me) continue;
        const ParamSpec& spec = table.specs[specs[k]];
        Job j;
        j.owned = owned_.size();
        j.lr_mult = rules.empty() ? 1.0 : rules[specs[k]].lr_mult;
        j.factor = muon_rms_factor(spec.rows, spec.cols, cfg_.muon_scale);
        owned_.push_back({logical_at.at(spec.name), spec.rows, spec.cols, nullptr});
        job_of[k] = g.jobs.size();
        g.jobs.push_back(std::move(j));
    }
    for (const Mine& m : mine) {  // this rank's own pieces of its matrices, in place
        if (m.owner != me) continue;
        const MuonSegment& s = segments_[m.seg];
        const ParamSpec& spec = table.specs[s.spec];
        Job& j = g.jobs[job_of[m.k]];
        for (const MuonRect& r : muon_rects(s.a, s.b, spec.row0, spec.col0, spec.lcols, spec.cols)) {
            if (m.designated) j.in.push_back({true, m.seg, r});
            j.out.push_back({true, m.seg, r});
        }
    }
    // Received descriptions: each source's pieces in its order; designated ones arrive in the
    // gather, all go back in the scatter.
    g.g_rc.assign(size_t(G), 0), g.s_sc.assign(size_t(G), 0);
    for (int src = 0; src < G; ++src)
        for (int d = drd[size_t(src)]; d < drd[size_t(src)] + drc[size_t(src)]; d += kDesc) {
            const int32_t* q = drecv.data() + d;
            const int n = q[5] - q[4];
            if (q[6]) g.g_rc[size_t(src)] += n;
            g.s_sc[size_t(src)] += n;
        }
    g.g_rd = displacements(g.g_rc), g.s_sd = displacements(g.s_sc);
    for (int src = 0; src < G; ++src) {
        size_t at_g = size_t(g.g_rd[size_t(src)]), at_s = size_t(g.s_sd[size_t(src)]);
        for (int d = drd[size_t(src)]; d < drd[size_t(src)] + drc[size_t(src)]; d += kDesc) {
            const int32_t* q = drecv.data() + d;
            const size_t k = size_t(q[0]);
            QUINTET_CHECK(k < specs.size() && owner[k] == me, "Muon: a piece sent to a rank that does not own it");
            Job& j = g.jobs[job_of[k]];
            const size_t n = size_t(q[5] - q[4]);
            for (const MuonRect& r : muon_rects(size_t(q[4]), size_t(q[5]), q[1], q[2], q[3], table.specs[specs[k]].cols)) {
                if (q[6]) j.in.push_back({false, at_g, r});
                j.out.push_back({false, at_s, r});
            }
            if (q[6]) at_g += n;
            at_s += n;
        }
    }
    // Every element of every owned matrix arrives exactly once.
    for (const Job& j : g.jobs) {
        const Owned& o = owned_[j.owned];
        std::vector<char> seen(size_t(o.rows) * size_t(o.cols), 0);
        for (const In& in : j.in)
            for (int r = 0; r < in.r.rows; ++r)
                for (int c = 0; c < in.r.cols; ++c) {
                    char& e = seen[in.r.whole_at + size_t(r) * size_t(o.cols) + size_t(c)];
                    QUINTET_CHECK(!e, "Muon: an element of " + table.logical[o.logical].name + " arrives twice");
                    e = 1;
                }
        QUINTET_CHECK(std::all_of(seen.begin(), seen.end(), [](char e) { return e != 0; }),
                      "Muon: an element of " + table.logical[o.logical].name + " never arrives");
    }
    g.seg_buf = alloc(std::max(at_send, at_recv));
    g.gather_recv = alloc(total(g.g_rc));
    // When every piece that arrives is designated (ZeRO slices, or tp shards without replicas),
    // the update's pieces go back exactly where the gradient's came from: a matrix's pieces are
    // read before its iteration and overwritten after it, so one buffer serves both.
    bool all_designated = true;
    for (size_t d = 0; d < drecv.size(); d += kDesc) all_designated = all_designated && drecv[d + 6] != 0;
    g.scatter_send = all_designated ? g.gather_recv : alloc(total(g.s_sc));
    sent_floats_ += double(total(g.g_sc) + total(g.s_sc));
}

void Muon::step(const MuonPointers* ptr, double lr) {
    {
        QUINTET_PROFILE("optimizer.muon.decay");
        for (size_t i = 0; i < segments_.size(); ++i) {
            const float lr_i = float(lr * decay_lr_[i]), wd = decay_wd_[i];
            if (wd != 0.0f && lr_i != 0.0f) be_.scale(ptr[i].param, segments_[i].b - segments_[i].a, 1.0f - lr_i * wd);
        }
    }
    const float mu = float(cfg_.muon_momentum);
    for (Group& g : groups_) {
        if (!g.comm) continue;
        const bool exchange = g.comm->size() > 1;
        {
            QUINTET_PROFILE("comm.muon");
            for (const Item& it : g.send) be_.copy(g.seg_buf + it.at, ptr[it.seg].grad, it.n);
            if (exchange)
                g.comm->all_to_allv(g.seg_buf, g.g_sc.data(), g.g_sd.data(), g.gather_recv, g.g_rc.data(), g.g_rd.data());
        }
        {
            QUINTET_PROFILE("optimizer.muon");
            for (const Job& j : g.jobs) {
                const Owned& o = owned_[j.owned];
                const size_t cols = size_t(o.cols), n = size_t(o.rows) * cols;
                for (const In& in : j.in) {
                    const float* src = (in.local ? ptr[in.src].grad : g.gather_recv + in.src) + in.r.piece_at;
                    be_.copy_2d(x_ + in.r.whole_at, cols, src, size_t(in.r.piece_ld), size_t(in.r.rows),
                                size_t(in.r.cols), false);
                }
                muon_momentum(be_, o.momentum, x_, y_, n, mu);
                float* z = muon_orthogonalise(be_, x_, y_, a2_, b2_, o.rows, o.cols, cfg_.muon_ns_steps);
                be_.scale(z, n, float(-lr * j.lr_mult * j.factor));
                for (const Out& out : j.out) {
                    float* dst = (out.local ? ptr[out.dst].param : g.scatter_send + out.dst) + out.r.piece_at;
                    be_.copy_2d(dst, size_t(out.r.piece_ld), z + out.r.whole_at, cols, size_t(out.r.rows),
                                size_t(out.r.cols), out.local);
                }
            }
        }
        {
            QUINTET_PROFILE("comm.muon");
            if (exchange)
                g.comm->all_to_allv(g.scatter_send, g.s_sc.data(), g.s_sd.data(), g.seg_buf, g.s_rc.data(), g.s_rd.data());
            for (const Item& it : g.recv) be_.add_inplace(ptr[it.seg].param, g.seg_buf + it.at, it.n);
        }
    }
}

}  // namespace quintet
