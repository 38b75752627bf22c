// quintet's own sgemm for AVX-512 hosts (private to the CPU backend).
//
// Debian's BLIS (0.9) has no Zen 4 configuration and runs its AVX2 kernels there; OpenBLAS
// picks its Skylake-X kernels. Either reaches about 0.75-0.8 of the FMA peak at the shapes a
// decoder trains with (4096 tokens against 128..8192 features; docs/benchmarks.md). This GEMM is the classic
// blocked design, written for those shapes and docs/benchmarks.md's measurements: C is swept
// in 12 x 32 register blocks (24 zmm accumulators, two B vectors, a broadcast A element from
// memory), K in blocks of 256, N in blocks of 512 so a packed B block (512 KiB) stays in L2,
// and the packed A (the thread's rows x 256) streams from L3 one 12-row micro-panel (12 KiB,
// L1) at a time. The CPU backend uses it for every matmul on a host with AVX-512F (chosen
// at run time: the function carries a target attribute, so a portable build gets it too);
// QUINTET_CPU_GEMM=blas in the environment selects the BLAS instead, for a side-by-side run;
// the CMake option QUINTET_AVX512_GEMM=OFF leaves the kernel out of the choice altogether.
//
// Sums run over p in order within each K block, one accumulator per element of C, added to C
// block after block: a pure function of the operands, whatever the thread count (threads
// own disjoint rectangles of C).
#pragma once

namespace quintet::cpu {

// Whether this host runs the AVX-512 kernel (AVX-512F present) and the environment has not
// asked for the BLAS (QUINTET_CPU_GEMM=blas). Read once.
bool avx512_gemm_enabled();

// C[M x N] = alpha op(A) op(B) + beta C (row-major; op(X) = X^T when its flag is set; beta 0
// never reads C), on up to `threads` OpenMP threads (one inside a parallel region). Packing
// scratch is per thread, grown to the largest call and kept.
void avx512_sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                  const float* B, int ldb, float beta, float* C, int ldc, int threads);

}  // namespace quintet::cpu
