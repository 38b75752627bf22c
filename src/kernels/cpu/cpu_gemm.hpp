// quintet's own sgemm for x86-64 hosts (private to the CPU backend).
//
// Debian's BLIS (0.9) has no Zen 4 configuration and runs its AVX2 kernels there; OpenBLAS
// picks its Skylake-X kernels. Either reaches about 0.75-0.8 of the FMA peak at the shapes a
// decoder trains with (4096 tokens against 128..8192 features; docs/benchmarks.md). This GEMM is
// the classic blocked design, written for those shapes: C is swept in register blocks (AVX-512:
// 12 x 32, 24 zmm accumulators; AVX2: 6 x 16, 12 ymm), K in blocks of 256, N in blocks whose
// packed B stays in L2 (512 KiB on AVX-512, 256 KiB on AVX2), and the packed A streams one
// micro-panel (L1) at a time. The kernels carry target attributes and are chosen at run time,
// so a portable build gets them too. QUINTET_CPU_GEMM in the environment chooses: auto (the
// default: the AVX-512 kernel on a host with AVX-512F, else the BLAS), blas, avx512, avx2; the
// CMake option QUINTET_OWN_GEMM=OFF leaves both kernels out.
//
// Sums run over p in order within each K block, one accumulator per element of C, added to C
// block after block: a pure function of the operands, whatever the thread count (threads
// own disjoint rectangles of C), and the same bits from either kernel.
#pragma once

namespace quintet::cpu {

enum class GemmKernel { blas, avx2, avx512 };

// The kernel every matmul of this process uses: the host's ISA and QUINTET_CPU_GEMM, read once
// (a bad value stops the rank with the valid choices).
GemmKernel gemm_kernel();

// C[M x N] = alpha op(A) op(B) + beta C (row-major; op(X) = X^T when its flag is set; beta 0
// never reads C) with `kind` (not blas), on up to `threads` OpenMP threads (one inside a parallel
// region). Packing scratch is per thread, grown to the largest call and kept.
void own_sgemm(GemmKernel kind, bool ta, bool tb, int M, int N, int K, float alpha, const float* A,
               int lda, const float* B, int ldb, float beta, float* C, int ldc, int threads);

}  // namespace quintet::cpu
