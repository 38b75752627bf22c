#include "quintet/model/muon_layout.hpp"

#include <algorithm>
#include <numeric>

namespace quintet {

double newton_schulz_flops(const MuonMatrix& m, int steps) {
    const double lo = std::min(m.rows, m.cols), hi = std::max(m.rows, m.cols);
    return double(steps) * (4.0 * lo * lo * hi + 2.0 * lo * lo * lo);
}

std::vector<int> muon_owners(const std::vector<MuonMatrix>& matrices, int group_size) {
    std::vector<int> owner(matrices.size(), 0);
    if (group_size <= 1) return owner;
    std::vector<size_t> order(matrices.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::vector<double> cost(matrices.size());
    for (size_t k = 0; k < matrices.size(); ++k) cost[k] = newton_schulz_flops(matrices[k], 1);
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return cost[x] > cost[y]; });
    std::vector<double> load(size_t(group_size), 0.0);
    for (size_t k : order) {
        const size_t r = size_t(std::min_element(load.begin(), load.end()) - load.begin());
        owner[k] = int(r);
        load[r] += cost[k];
    }
    return owner;
}

std::vector<MuonRect> muon_rects(size_t a, size_t b, int row0, int col0, int lcols, int cols) {
    std::vector<MuonRect> out;
    if (a >= b) return out;
    const size_t lc = size_t(lcols);
    auto add = [&](size_t r, size_t c, size_t nr, size_t nc) {
        if (nr == 0 || nc == 0) return;
        MuonRect x;
        x.piece_at = r * lc + c - a;
        x.whole_at = (size_t(row0) + r) * size_t(cols) + size_t(col0) + c;
        x.rows = int(nr), x.cols = int(nc), x.piece_ld = lcols;
        out.push_back(x);
    };
    const size_t r0 = a / lc, c0 = a % lc, r1 = b / lc, c1 = b % lc;
    if (r0 == r1) {
        add(r0, c0, 1, c1 - c0);
        return out;
    }
    size_t full_from = r0;
    if (c0 != 0) {
        add(r0, c0, 1, lc - c0);
        full_from = r0 + 1;
    }
    add(full_from, 0, r1 - full_from, lc);
    add(r1, 0, c1 ? 1 : 0, c1);
    return out;
}

}  // namespace quintet
