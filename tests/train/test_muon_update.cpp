// Muon's update of one whole matrix (train/muon.hpp) against a direct float64 evaluation of the
// formulas of docs/math.md "Muon" -- Nesterov momentum, the Frobenius normalisation, the
// Newton-Schulz iteration (on X^T when rows > cols), the scale and the decoupled decay -- on wide,
// tall and square matrices; the orthogonalised X's singular values are the iteration's scalar map
// applied to the input's, inside its known band [0.68, 1.14]; and the pure arithmetic of the
// distribution (model/muon_layout.hpp): owners, costs, rectangles.
// ctest: labels=unit
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "quintet/kernels/backend.hpp"
#include "quintet/model/muon_layout.hpp"
#include "quintet/train/muon.hpp"

using namespace quintet;

namespace {

using Mat = std::vector<double>;  // row-major

Mat matmul(const Mat& a, const Mat& b, int n, int k, int m) {  // [n,k] x [k,m]
    Mat c(size_t(n) * m, 0.0);
    for (int i = 0; i < n; ++i)
        for (int p = 0; p < k; ++p)
            for (int j = 0; j < m; ++j) c[size_t(i) * m + j] += a[size_t(i) * k + p] * b[size_t(p) * m + j];
    return c;
}

Mat transpose(const Mat& a, int n, int m) {
    Mat t(a.size());
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < m; ++j) t[size_t(j) * n + i] = a[size_t(i) * m + j];
    return t;
}

// The formulas, in double: returns X (the orthogonalised U, [rows, cols]) and updates m.
Mat reference_x(Mat& m, const Mat& g, int rows, int cols, double mu, int steps) {
    Mat u(g.size());
    for (size_t i = 0; i < g.size(); ++i) m[i] = mu * m[i] + g[i];
    for (size_t i = 0; i < g.size(); ++i) u[i] = g[i] + mu * m[i];
    double ss = 0;
    for (double v : u) ss += v * v;
    const double s = 1.0 / (std::sqrt(ss) + 1e-7);
    Mat x(u.size());
    for (size_t i = 0; i < u.size(); ++i) x[i] = u[i] * s;
    const bool tall = rows > cols;
    int r = rows, c = cols;
    if (tall) x = transpose(x, rows, cols), std::swap(r, c);
    const double a = 3.4445, b = -4.7750, cc = 2.0315;
    for (int k = 0; k < steps; ++k) {
        const Mat A = matmul(x, transpose(x, r, c), r, c, r);
        const Mat AA = matmul(A, A, r, r, r);
        Mat B(A.size());
        for (size_t i = 0; i < A.size(); ++i) B[i] = b * A[i] + cc * AA[i];
        const Mat BX = matmul(B, x, r, r, c);
        for (size_t i = 0; i < x.size(); ++i) x[i] = a * x[i] + BX[i];
    }
    if (tall) x = transpose(x, r, c);
    return x;
}

// Eigenvalues of a symmetric n x n matrix (cyclic Jacobi), ascending.
std::vector<double> eigenvalues(Mat a, int n) {
    for (int sweep = 0; sweep < 100; ++sweep) {
        double off = 0;
        for (int p = 0; p < n; ++p)
            for (int q = p + 1; q < n; ++q) off += a[size_t(p) * n + q] * a[size_t(p) * n + q];
        if (off < 1e-30) break;
        for (int p = 0; p < n; ++p)
            for (int q = p + 1; q < n; ++q) {
                const double apq = a[size_t(p) * n + q];
                if (std::abs(apq) < 1e-300) continue;
                const double theta = (a[size_t(q) * n + q] - a[size_t(p) * n + p]) / (2 * apq);
                const double t = (theta >= 0 ? 1.0 : -1.0) / (std::abs(theta) + std::sqrt(theta * theta + 1));
                const double c = 1 / std::sqrt(t * t + 1), s = t * c;
                for (int k = 0; k < n; ++k) {  // columns p, q
                    const double akp = a[size_t(k) * n + p], akq = a[size_t(k) * n + q];
                    a[size_t(k) * n + p] = c * akp - s * akq;
                    a[size_t(k) * n + q] = s * akp + c * akq;
                }
                for (int k = 0; k < n; ++k) {  // rows p, q
                    const double apk = a[size_t(p) * n + k], aqk = a[size_t(q) * n + k];
                    a[size_t(p) * n + k] = c * apk - s * aqk;
                    a[size_t(q) * n + k] = s * apk + c * aqk;
                }
            }
    }
    std::vector<double> e(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) e[size_t(i)] = a[size_t(i) * n + i];
    std::sort(e.begin(), e.end());
    return e;
}

// Singular values of x [rows, cols], ascending (from the smaller Gram matrix).
std::vector<double> singular_values(const Mat& x, int rows, int cols) {
    const bool tall = rows > cols;
    const Mat gram = tall ? matmul(transpose(x, rows, cols), x, cols, rows, cols) : matmul(x, transpose(x, rows, cols), rows, cols, rows);
    std::vector<double> e = eigenvalues(gram, std::min(rows, cols));
    for (double& v : e) v = std::sqrt(std::max(v, 0.0));
    return e;
}

double ns_map(double s, int steps) {  // the iteration on one singular value
    for (int k = 0; k < steps; ++k) s = 3.4445 * s - 4.7750 * s * s * s + 2.0315 * s * s * s * s * s;
    return s;
}

struct Case {
    int rows, cols, steps;
};

class MuonUpdate : public ::testing::TestWithParam<Case> {};

TEST_P(MuonUpdate, MatchesTheFormulasInDouble) {
    const Case c = GetParam();
    const size_t n = size_t(c.rows) * c.cols;
    std::mt19937 rng(uint32_t(c.rows * 131 + c.cols * 7 + c.steps));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> g(n), m(n), w(n);
    for (size_t i = 0; i < n; ++i) g[i] = 0.01f * nd(rng), m[i] = 0.02f * nd(rng), w[i] = 0.05f * nd(rng);
    const double mu = 0.95, lr = 0.02, wd = 0.1, scale = 0.2;

    // The backend's fp32 path, composed as the trainer's step composes it.
    auto be = make_cpu_backend(1);
    const size_t side = size_t(std::min(c.rows, c.cols));
    float *bg = be->alloc(n), *bm = be->alloc(n), *bw = be->alloc(n), *y = be->alloc(n);
    float *a2 = be->alloc(side * side), *b2 = be->alloc(side * side);
    be->from_host(bg, g.data(), n), be->from_host(bm, m.data(), n), be->from_host(bw, w.data(), n);
    muon_momentum(*be, bm, bg, y, n, float(mu));
    float* z = muon_orthogonalise(*be, bg, y, a2, b2, c.rows, c.cols, c.steps);
    std::vector<float> x(n), m_out(n);
    be->to_host(x.data(), z, n);
    be->to_host(m_out.data(), bm, n);
    be->scale(bw, n, float(1.0 - lr * wd));
    be->scale(z, n, float(-lr * muon_rms_factor(c.rows, c.cols, scale)));
    be->add_inplace(bw, z, n);
    std::vector<float> w_out(n);
    be->to_host(w_out.data(), bw, n);
    for (float* p : {bg, bm, bw, y, a2, b2}) be->release(p);

    // The formulas in double.
    Mat md(m.begin(), m.end()), gd(g.begin(), g.end());
    const Mat xd = reference_x(md, gd, c.rows, c.cols, mu, c.steps);
    const double factor = scale * std::sqrt(double(std::max(c.rows, c.cols)));
    EXPECT_DOUBLE_EQ(muon_rms_factor(c.rows, c.cols, scale), factor);
    double dx = 0, xmax = 0, dm = 0, mmax = 0, dw = 0, umax = 0;
    for (size_t i = 0; i < n; ++i) {
        const double wref = double(w[i]) - lr * (factor * xd[i] + wd * double(w[i]));
        dx = std::max(dx, std::abs(double(x[i]) - xd[i])), xmax = std::max(xmax, std::abs(xd[i]));
        dm = std::max(dm, std::abs(double(m_out[i]) - md[i])), mmax = std::max(mmax, std::abs(md[i]));
        dw = std::max(dw, std::abs(double(w_out[i]) - wref)), umax = std::max(umax, std::abs(wref - double(w[i])));
    }
    // fp32 against double (measured: 1e-7, 1e-6 and 1e-6 to 3e-6 at ten steps): the momentum to
    // a few ulps; X, after iterations each summing up to 96 products per element, and the
    // weights' change to 2e-5 of their largest element.
    EXPECT_LE(dm, 1e-6 * mmax);
    EXPECT_LE(dx, 2e-5 * xmax) << c.rows << "x" << c.cols;
    EXPECT_LE(dw, 2e-5 * umax) << c.rows << "x" << c.cols;

    // The iteration acts on singular values alone: the output's are the scalar map of the
    // normalised input's, and -- input singular values above 0.01 -- inside the band the map
    // reaches in five steps.
    Mat ud(n);
    double ss = 0;
    for (size_t i = 0; i < n; ++i) ud[i] = gd[i] + mu * md[i], ss += ud[i] * ud[i];
    for (double& v : ud) v /= std::sqrt(ss) + 1e-7;
    const std::vector<double> sin = singular_values(ud, c.rows, c.cols);
    std::vector<double> want;
    for (double s : sin) want.push_back(ns_map(s, c.steps));
    std::sort(want.begin(), want.end());
    const Mat xf(x.begin(), x.end());
    const std::vector<double> sout = singular_values(xf, c.rows, c.cols);
    ASSERT_EQ(sout.size(), want.size());
    for (size_t i = 0; i < sout.size(); ++i) EXPECT_NEAR(sout[i], want[i], 1e-4) << "singular value " << i;
    if (c.steps == 5 && sin.front() >= 0.01) {
        EXPECT_GE(sout.front(), 0.68);
        EXPECT_LE(sout.back(), 1.14);
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MuonUpdate,
                         ::testing::Values(Case{24, 40, 5}, Case{40, 24, 5}, Case{33, 33, 5}, Case{8, 96, 5},
                                           Case{96, 8, 5}, Case{24, 40, 1}, Case{40, 24, 10}));

TEST(MuonUpdate, ZeroGradientGivesNoStep) {
    auto be = make_cpu_backend(1);
    const int r = 6, c = 10;
    float *g = be->alloc(60), *m = be->alloc(60), *y = be->alloc(60), *a2 = be->alloc(36), *b2 = be->alloc(36);
    muon_momentum(*be, m, g, y, 60, 0.95f);
    float* z = muon_orthogonalise(*be, g, y, a2, b2, r, c, 5);
    std::vector<float> x(60, 1.0f);
    be->to_host(x.data(), z, 60);
    for (float v : x) EXPECT_EQ(v, 0.0f);
    for (float* p : {g, m, y, a2, b2}) be->release(p);
}

TEST(MuonLayout, NewtonSchulzFlops) {
    // m = 3, n = 5: per step 4 m^2 n + 2 m^3 = 180 + 54.
    EXPECT_DOUBLE_EQ(newton_schulz_flops({3, 5}, 1), 234.0);
    EXPECT_DOUBLE_EQ(newton_schulz_flops({5, 3}, 5), 5 * 234.0);
}

TEST(MuonLayout, OwnersBalanceTheCost) {
    // Eight matrices on three ranks: the largest first, each to the least loaded.
    const std::vector<MuonMatrix> ms = {{64, 64}, {16, 64}, {64, 16}, {64, 64}, {128, 64}, {16, 16}, {64, 128}, {8, 8}};
    const std::vector<int> o = muon_owners(ms, 3);
    ASSERT_EQ(o.size(), ms.size());
    std::vector<double> load(3, 0.0);
    double most = 0, sum = 0;
    for (size_t k = 0; k < ms.size(); ++k) {
        ASSERT_GE(o[k], 0);
        ASSERT_LT(o[k], 3);
        load[size_t(o[k])] += newton_schulz_flops(ms[k], 1);
        most = std::max(most, newton_schulz_flops(ms[k], 1));
        sum += newton_schulz_flops(ms[k], 1);
    }
    // The longest-processing-time rule: no rank above the mean by more than the largest job.
    for (double l : load) EXPECT_LE(l, sum / 3 + most);
    EXPECT_EQ(o[4], 0);  // the two largest go to ranks 0 and 1 (ties: list order, lowest rank)
    EXPECT_EQ(o[6], 1);
    EXPECT_EQ(muon_owners(ms, 3), o);  // deterministic
    EXPECT_EQ(muon_owners(ms, 1), std::vector<int>(ms.size(), 0));
}

TEST(MuonLayout, RectanglesCoverAPieceOnce) {
    // A column shard [rows 5, lcols 4] at col0 = 3 of a 10-column matrix, every piece [a, b).
    const int rows = 5, lcols = 4, cols = 10, row0 = 2, col0 = 3;
    for (size_t a = 0; a <= size_t(rows * lcols); ++a)
        for (size_t b = a; b <= size_t(rows * lcols); ++b) {
            std::vector<int> seen(size_t(rows * lcols), 0);
            size_t count = 0;
            for (const MuonRect& r : muon_rects(a, b, row0, col0, lcols, cols))
                for (int i = 0; i < r.rows; ++i)
                    for (int j = 0; j < r.cols; ++j) {
                        const size_t local = a + r.piece_at + size_t(i) * size_t(r.piece_ld) + size_t(j);
                        ASSERT_LT(local, seen.size());
                        ++seen[local], ++count;
                        // ... and lands where the shard's element sits in the whole matrix.
                        const size_t whole = r.whole_at + size_t(i) * cols + size_t(j);
                        EXPECT_EQ(whole, (row0 + local / lcols) * cols + col0 + local % lcols);
                    }
            EXPECT_EQ(count, b - a);
            for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], i >= a && i < b ? 1 : 0);
        }
}

}  // namespace
