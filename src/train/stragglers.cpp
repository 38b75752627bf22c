#include "quintet/train/stragglers.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>

namespace quintet {

std::string rank_place(const Layout& l, int rank) {
    const Coords c = l.coords_of(rank);
    std::string out;
    auto add = [&](const char* name, int size, int at) {
        if (size > 1) out += (out.empty() ? "" : ", ") + std::string(name) + " " + std::to_string(at);
    };
    add("pp stage", l.size[kPP], c[kPP]);
    add("tp", l.size[kTP], c[kTP]);
    add("cp", l.size[kCP], c[kCP]);
    add("dp", l.size[kDP], c[kDP]);
    add("ep", l.ep, l.dp_cp_index(rank) % l.ep);
    return out;
}

StragglerReport::StragglerReport(std::vector<StragglerRank> ranks, double ratio)
    : ranks_(std::move(ranks)), threshold_(ratio) {
    const size_t n = ranks_.size();
    std::map<int, std::vector<int>> by_group;
    for (size_t r = 0; r < n; ++r) by_group[ranks_[r].group].push_back(int(r));
    for (auto& [g, members] : by_group) groups_.push_back(members);
    last_ratio_.assign(n, 0.0);
    run_.assign(n, 0), span_.assign(n, 0), gap_.assign(n, 0);
    run_mine_.assign(n, 0.0), run_med_.assign(n, 0.0);
    named_.assign(n, 0);
    sum_compute_.assign(n, 0.0), sum_wait_.assign(n, 0.0);
    scratch_.reserve(n);
}

std::string StragglerReport::name(int r) const {
    const StragglerRank& k = ranks_[size_t(r)];
    return "rank " + std::to_string(r) + " (host " + k.host + (k.where.empty() ? "" : ", " + k.where) + ")";
}

std::vector<std::string> StragglerReport::observe(int64_t step, const double* compute, const double* comm_wait,
                                                  bool log_step) {
    (void)step;
    std::vector<std::string> lines;
    ++steps_;
    char buf[160];
    for (const std::vector<int>& members : groups_) {
        for (int r : members) {
            sum_compute_[size_t(r)] += compute[r];
            sum_wait_[size_t(r)] += comm_wait[r];
            if (members.size() < 2) continue;  // no peer doing the same work: nothing to compare with
            scratch_.clear();
            for (int q : members)
                if (q != r) scratch_.push_back(compute[q]);
            const double med = median_of(scratch_);
            const double ratio = med > 0 ? compute[r] / med : 0.0;
            last_ratio_[size_t(r)] = ratio;
            const size_t i = size_t(r);
            const bool slow = ratio > threshold_;
            if (!slow && run_[i] == 0) continue;
            // A run of slow steps; one step at the peers' pace inside it (a peer's own hiccup,
            // often) is forgiven, two in a row end it.
            gap_[i] = slow ? 0 : gap_[i] + 1;
            if (gap_[i] >= 2) {
                if (named_[i]) {
                    std::snprintf(buf, sizeof buf, " is back within %.2fx of its peers' median after %lld steps",
                                  threshold_, (long long)(span_[i] - 1));
                    lines.push_back("straggler: " + name(r) + buf);
                }
                run_[i] = span_[i] = gap_[i] = 0, run_mine_[i] = run_med_[i] = 0.0, named_[i] = 0;
                continue;
            }
            run_[i] += slow;
            ++span_[i];
            run_mine_[i] += compute[r];
            run_med_[i] += med;
            const bool first = slow && run_[i] == kStepsInRow && !named_[i];
            if (first || (named_[i] && log_step)) {
                named_[i] = 1;
                std::snprintf(buf, sizeof buf, " computes %.2fx the median of its peers for %lld steps",
                              run_mine_[i] / run_med_[i], (long long)span_[i]);
                lines.push_back("straggler: " + name(r) + buf);
            }
        }
    }
    return lines;
}

std::vector<std::string> StragglerReport::summary(size_t rows) const {
    std::vector<std::string> out;
    if (steps_ == 0) return out;
    const size_t n = ranks_.size();
    std::vector<double> mean(n), vs(n, 0.0);
    for (size_t r = 0; r < n; ++r) mean[r] = sum_compute_[r] / double(steps_);
    std::vector<double> peers;
    for (const std::vector<int>& members : groups_) {
        if (members.size() < 2) continue;
        for (int r : members) {
            peers.clear();
            for (int q : members)
                if (q != r) peers.push_back(mean[size_t(q)]);
            const double med = median_of(peers);
            vs[size_t(r)] = med > 0 ? mean[size_t(r)] / med : 0.0;
        }
    }
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return mean[size_t(a)] > mean[size_t(b)]; });
    // The slowest rows - 1 and the fastest (all when they fit).
    std::vector<int> shown(order.begin(), order.begin() + long(std::min(n, rows)));
    if (n > rows && rows >= 2) shown.back() = order.back();
    size_t host_w = 4, where_w = 5;
    for (int r : shown) {
        host_w = std::max(host_w, ranks_[size_t(r)].host.size());
        where_w = std::max(where_w, ranks_[size_t(r)].where.size());
    }
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "ranks by compute time (mean of %lld step(s); \"vs peers\": against the median of the other ranks "
                  "of its pipeline stage):",
                  (long long)steps_);
    out.push_back(buf);
    std::snprintf(buf, sizeof buf, "  %6s  %-*s  %-*s  %14s  %16s  %8s", "rank", int(host_w), "host", int(where_w),
                  "where", "compute s/step", "comm wait s/step", "vs peers");
    out.push_back(buf);
    for (size_t k = 0; k < shown.size(); ++k) {
        const int r = shown[k];
        if (n > rows && rows >= 2 && k + 1 == shown.size())
            out.push_back("  ... " + std::to_string(n - rows) + " rank(s) between, then the fastest:");
        char ratio[16] = "-";
        if (vs[size_t(r)] > 0) std::snprintf(ratio, sizeof ratio, "%.2fx", vs[size_t(r)]);
        std::snprintf(buf, sizeof buf, "  %6d  %-*s  %-*s  %14.4f  %16.4f  %8s", r, int(host_w),
                      ranks_[size_t(r)].host.c_str(), int(where_w), ranks_[size_t(r)].where.c_str(), mean[size_t(r)],
                      sum_wait_[size_t(r)] / double(steps_), ratio);
        out.push_back(buf);
    }
    return out;
}

}  // namespace quintet
