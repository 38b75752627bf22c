// Muon's distribution over ranks (docs/parallelism.md, "Muon"), as pure arithmetic shared by
// the trainer (train/muon) and the planner (perf/planner): which rank of a group orthogonalises
// each whole matrix (its owner), what that costs, and how its pieces are cut into rectangles.
//
// A group is the ranks that hold pieces of the same matrices: for dense matrices the ranks of one
// pipeline stage (tp x cp x dp), for experts those of one stage and one expert-parallel rank
// (tp x edp). Every rank of a group holds the same matrices (tensor parallelism splits their rows
// or columns, ZeRO their flat elements), so each computes the same owners from the same list.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace quintet {

// A whole matrix of a group, [rows, cols] as its Hugging Face tensor is.
struct MuonMatrix {
    int rows = 0, cols = 0;
    size_t numel() const { return size_t(rows) * size_t(cols); }
};

// FLOPs of one orthogonalisation by `steps` Newton-Schulz iterations (docs/math.md, "Muon"):
// with m = min(rows, cols), n = max(rows, cols), each step is A = X X^T (2 m^2 n), A A (2 m^3)
// and B X (2 m^2 n); the norm and the element-wise terms are left out.
double newton_schulz_flops(const MuonMatrix& m, int steps);

// The owner of every matrix (index into `group_size` ranks): the matrices by decreasing cost
// (ties: list order) each to the least loaded rank so far (ties: the lowest rank) -- the
// longest-processing-time rule, within 4/3 of the best balance.
std::vector<int> muon_owners(const std::vector<MuonMatrix>& matrices, int group_size);

// A piece of a matrix as a rank holds it: elements [a, b) of its shard, row-major over the
// shard's lcols columns, the shard at (row0, col0) of the whole matrix of `cols` columns.
// The piece as at most three rectangles (the tail of a row, whole rows, the head of a row):
// `at` is the piece's first element in each rectangle's row-major count within the piece.
struct MuonRect {
    size_t piece_at = 0;  // offset of the rectangle's first element inside the piece
    size_t whole_at = 0;  // offset of that element in the whole matrix (row-major, cols)
    int rows = 0, cols = 0;
    int piece_ld = 0;     // the shard's row stride (lcols)
};
std::vector<MuonRect> muon_rects(size_t a, size_t b, int row0, int col0, int lcols, int cols);

}  // namespace quintet
