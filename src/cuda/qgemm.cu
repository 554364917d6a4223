/* qgemm.cu -- the many-token MLX-affine product on the tensor cores:
 * y [m][rows] = x [m][cols] . W^T with W's 4- or 8-bit codes read once per
 * token tile, dequantized in registers and fed to mma.sync (m16n8k16, f16
 * in, f32 accumulated). It replaces, for batched decode and prefill,
 * gemm.cu's pass that writes the whole of W as f16 before cuBLAS reads it
 * back (16 GB a step for Llama-8B at 4 bits): here W's bytes are read once.
 *
 * NUMERICS: gemm.cu's f16 path exactly, up to the order of the f32 sums.
 *   - x: each row scaled by 2^-e (max |x_row| in [2^(e-1), 2^e)) and
 *     rounded to f16 by scale_rows_kernel into scratch, with 2^e kept; the
 *     product's row is multiplied back by 2^e (exact).
 *   - W: f16(f32(f32(code * s) + b)), s and b widened to f32, as
 *     gemm.cu's dequant_kernel. The code * s product comes out of one FMA:
 *     the code, masked in place, is OR-ed into the mantissa of F = 2^(23-j)
 *     (j its bit position, <= 12), so F = 2^(23-j) + code exactly, and
 *     fma(F, s, -2^(23-j) s) = round(code * s), the constant exact as a
 *     power-of-two multiple of s; the bias goes on with fma(v, 1, b) =
 *     round(v + b). No branch: a scale with |s| >= 2^100 (f16 and bf16
 *     scales never are) is used as s 2^-64 and the bias added by
 *     fma(v, 2^64, b), exact too. Only infinite scales differ: NaN here
 *     where gemm.cu has inf (every code but 0 overflows f16 anyway).
 *   - Except 4-bit codes under f16 or bf16 scales (every MLX checkpoint's
 *     case): W = f16(code * s + b) rounded once (one HFMA2 on s and b as
 *     f16), which is gemm.cu's value unless the f32 sum rounded first;
 *     half the instructions a weight (deq4h).
 *
 * TILING. A block (8 warps) computes 256 weight rows x BN tokens (BN = 8,
 * 16, 32 or 64: the template NT = BN / 8, picked from m; larger m loops
 * over token tiles in gridDim.y). Weight rows are the MMA's M dimension
 * (a warp owns 32 of them: 2 m16 tiles), tokens its N dimension. K moves
 * in slices of 64 columns through a ring of kStages shared-memory stages
 * filled by cp.async (codes and x 16 bytes at a time, scales and biases
 * as the 4-byte words that hold them). Per slice a lane dequantizes the
 * 16 consecutive columns [16t, 16t+16) of its rows (t = lane % 4: one
 * 8- or 16-byte read of codes, one group's scale), which is the MMA's k
 * order permuted: at 8 bits, in k-step j the lane's fragment positions
 * {2t, 2t+1, 2t+8, 2t+9} are columns 16t + 4j + {0, 1, 2, 3}; at 4 bits
 * word w = 16t + 8(j/2) .. + 7 gives k-step j the columns w + {h, h + 4,
 * h + 1, h + 5}, h = 2(j%2) (its codes paired by shifts). The B fragments
 * (x) follow the same permutation, so each is one 16-byte shared-memory
 * read of x as the x pass stored it (in order, or at 4 bits each 8
 * columns as 0 4 1 5 2 6 3 7), and no shuffling is needed on either side.
 * Dequantizing costs about 4 instructions per weight (the f32 arithmetic
 * the numerics demand, one f16 pack per two), about 2 for deq4h, once per
 * token tile. The deq4h instances are built for two blocks an SM (128
 * registers): at 64 tokens one block of 158 was alone on its SM.
 *
 * STATUS (H200, first version): exact (tests/cuda/test_cuda_qgemv.c), and
 * 2-3.8x faster than gemm.cu's path at m = 32 and 64, but far from the
 * bandwidth (0.3-0.5 TB/s at 4 bits, 1.4 TB/s for the 8-bit head) and
 * slower than it at m = 512. ncu on 4096 x 4096, m = 32: the SMs hold a
 * block only ~55% of the kernel's time and issue 0.3 instructions per
 * scheduler-cycle when they do (long-scoreboard stalls), with L2 and
 * DRAM mostly idle; halving the instructions per slice did not change the
 * time, so latency, not issue, bounds it.
 *
 * SPLIT-K. 4096 rows are only 16 blocks; m <= 64 (one token tile) would
 * leave most of the 132 SMs idle. So a cluster of S = 1..8 blocks shares a
 * row tile, each block a contiguous run of slices; at the end each block
 * leaves its f32 partial tile in its shared memory and block r of the
 * cluster adds rows [r*256/S, (r+1)*256/S) of all S partials, in rank
 * order (a replay gives the same bits), through distributed shared
 * memory, scales by 2^e and writes y. No global scratch, no atomics.
 *
 * SEVERAL PRODUCTS OF ONE x (gate and up; rlm__cuda_qgemm_multi) share
 * one x pass and one launch: the row tiles run through the matrices in
 * turn, so at 64 tokens Llama-8B's gate and up are one grid of 112 tiles
 * split over half as many blocks each as either alone.
 *
 * The x pass and the product are two launches; the product is launched
 * programmatically dependent on it (PDL), so its blocks start loading
 * codes while x is scaled and wait (griddepcontrol.wait) only before
 * their first read of x. The launch configuration depends only on (m,
 * rows, cols, bits, group, sdtype), so the pair can be captured in a
 * CUDA graph.
 */
#include "common.cuh"

#include <cooperative_groups.h>
#include <atomic>
#include <cstdlib>
#include <type_traits>
#include <cuda_runtime.h>

namespace {

using namespace rlm_cuda;
namespace cg = cooperative_groups;

constexpr int kThreads = 256;              /* 8 warps */
constexpr int kWarpRows = 32;              /* weight rows a warp owns: 2 m16 tiles */
constexpr int kMTiles = kWarpRows / 16;
constexpr int kBM = kThreads / kWarp * kWarpRows; /* weight rows per block */
constexpr int kSlice = 64;                 /* columns per K step */
constexpr int kXPitch = kSlice * 2 + 16;   /* bytes per token row of an x stage: padded, no bank conflicts */
constexpr int kPPitch = kBM + 4;           /* floats per token row of the partial tile: no bank conflicts */
constexpr int kSmemBudget = 110592;        /* per block: two blocks fit an SM's 227 KB */
constexpr int kMaxCluster = 8;             /* portable cluster size */
constexpr int kTargetBlocks = 256;         /* about two per SM on an H100/H200 */

/* The shape of one instantiation: bits and tokens per block (8 * NT). */
template <int BITS, int NT>
struct Cfg {
  static constexpr int kBN = 8 * NT;
  static constexpr int kCodeBytes = kSlice * BITS / 8;           /* one row's codes in a slice */
  static constexpr int kCodes = kBM * kCodeBytes;                /* stage part 1: codes [kBM][kCodeBytes] */
  static constexpr int kX = kBN * kXPitch;                       /* part 2: x [kBN][kXPitch] f16 */
  static constexpr int kScales = 2 * 2 * kBM * 4;                /* part 3: [scale|bias][slot][kBM] words */
  static constexpr int kStage = kCodes + kX + kScales;
  static constexpr int kStages = kSmemBudget / kStage < 8 ? kSmemBudget / kStage : 8;
  static constexpr int kSmem = kStages * kStage;
  static constexpr int kKB = NT <= 4 ? 4 : 2;                    /* k-steps whose B fragments are held at once */
  static_assert(kBM * kCodeBytes % (16 * kThreads) == 0, "whole rounds of 16-byte copies");
  static_assert(kStages >= 2, "two stages at least");
  static_assert(kSmem >= kBN * kPPitch * 4, "the partial tile reuses the stages");
  static_assert(kStage % 16 == 0, "16-byte aligned stages");
};

/* What a block needs: device pointers and the shape. */
struct Args {
  const uint8_t *wq;    /* codes [rows][cols*bits/8] */
  const void *sc, *bi;  /* scales, biases [rows][cols/g] */
  const __half *xs;     /* x scaled to f16 [m][cols] (scratch) */
  const float *back;    /* 2^e per row of x [m] (scratch) */
  float *y;             /* [m][rows] */
  int64_t m, rows;
  int cols, g;
  int g_shift;          /* log2(g) */
  int sc_odd, bi_odd;   /* bit 1 of the scales' and biases' addresses (2-byte types: which half) */
};

/* Several products of one x in a launch (rlm__cuda_qgemm_multi): each
 * matrix's own fields of Args; cols, bits, group and scale type agree. */
constexpr int kMaxMats = 3;
struct Mat {
  const uint8_t *wq;
  const void *sc, *bi;
  float *y;
  int64_t rows;
  int sc_odd, bi_odd;
};
struct Mats {
  Mat mat[kMaxMats];
  int tile0[kMaxMats + 1]; /* matrix i's row tiles are tile0[i] .. tile0[i + 1] - 1 */
  int k;
};

/* ---- PTX helpers ---------------------------------------------------------- */

/* smem_u32, cp_async16/4, cp_commit and cp_wait<N>: common.cuh. */
/* PDL: wait for the x pass's results (a no-op without the launch attribute). */
__device__ __forceinline__ void wait_for_x_pass() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

/* d += a . b: A 16x16 f16 row-major (4 regs of half2), B 16x8 f16 col-major (2), f32 accumulators. */
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_h2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi); /* lo in the low half */
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}

/* ---- dequantization --------------------------------------------------------- */

/* One row's group: s (times 2^-64 where |s| >= 2^100, so that the FMA's
 * constants stay finite), the FMA constants c[j/4] = -2^(23-j) s for codes
 * at bit j = 0, 4, 8, 12 of a word (8-bit codes use c[0] only), and the
 * bias b added by fma(v, up, b): up = 1, or 2^64 for the scaled s, exact
 * either way (v * up is fl(code * s)). */
struct Deq {
  float s, b, up, c[4];
};

__device__ __forceinline__ Deq make_deq(float s, float b) {
  Deq d;
  const bool big = !(fabsf(s) < 0x1p100f);
  d.s = big ? s * 0x1p-64f : s, d.up = big ? 0x1p64f : 1.0f, d.b = b;
  d.c[0] = d.s * -8388608.0f, d.c[1] = d.s * -524288.0f, d.c[2] = d.s * -32768.0f, d.c[3] = d.s * -2048.0f;
  return d;
}

/* A 4-bit word (8 consecutive columns) as 4 half2: (c0,c4) (c1,c5) (c2,c6)
 * (c3,c7), deq4h's pairs (x is stored in that order: scale_row_f16's PERM8). */
__device__ __forceinline__ void deq4(uint32_t w, const Deq &d, uint32_t (&p)[4]) {
  const uint32_t hi = w >> 16; /* codes 4..7 at bits 0, 4, 8, 12 */
  float f[8];
  f[0] = __fmaf_rn(__uint_as_float((w & 0xFu) | 0x4B000000u), d.s, d.c[0]);
  f[1] = __fmaf_rn(__uint_as_float((w & 0xF0u) | 0x49000000u), d.s, d.c[1]);
  f[2] = __fmaf_rn(__uint_as_float((w & 0xF00u) | 0x47000000u), d.s, d.c[2]);
  f[3] = __fmaf_rn(__uint_as_float((w & 0xF000u) | 0x45000000u), d.s, d.c[3]);
  f[4] = __fmaf_rn(__uint_as_float((hi & 0xFu) | 0x4B000000u), d.s, d.c[0]);
  f[5] = __fmaf_rn(__uint_as_float((hi & 0xF0u) | 0x49000000u), d.s, d.c[1]);
  f[6] = __fmaf_rn(__uint_as_float((hi & 0xF00u) | 0x47000000u), d.s, d.c[2]);
  f[7] = __fmaf_rn(__uint_as_float((hi & 0xF000u) | 0x45000000u), d.s, d.c[3]);
#pragma unroll
  for (int k = 0; k < 4; k++) p[k] = pack_h2(__fmaf_rn(f[k], d.up, d.b), __fmaf_rn(f[k + 4], d.up, d.b));
}

/* 4-bit codes under f16 or bf16 scales: W = fma(code, s, b) in f16, one
 * rounding, with s and b as f16 (exact for f16 scales, and for bf16 ones
 * inside f16's range; past it W is not finite, as a W past 65504 already
 * is on the f32 path). About 2 instructions a weight against deq4's 4.5:
 * code k of the word masked into 1024's mantissa (half2 1024 + c), 1024
 * taken off exactly, then one HFMA2. The shifts pair codes k and k + 4,
 * so the pairs are (c0,c4) (c1,c5) (c2,c6) (c3,c7), as in deq4. */
struct DeqH {
  __half2 s, b;
};

__device__ __forceinline__ DeqH make_deqh(float s, float b) { return {__float2half2_rn(s), __float2half2_rn(b)}; }

__device__ __forceinline__ void deq4h(uint32_t w, const DeqH &d, uint32_t (&p)[4]) {
  const __half2 k1024 = __half2half2(__ushort_as_half((unsigned short)0x6400u));
#pragma unroll
  for (int k = 0; k < 4; k++) {
    const uint32_t u = (w >> (4 * k) & 0x000f000fu) | 0x64006400u;
    __half2 h;
    memcpy(&h, &u, 4);
    h = __hfma2(__hsub2(h, k1024), d.s, d.b);
    memcpy(&p[k], &h, 4);
  }
}

/* An 8-bit word (4 consecutive columns) as 2 half2: (c0,c1) (c2,c3). The
 * byte goes into 2^23's mantissa by one byte permute. */
__device__ __forceinline__ void deq8(uint32_t w, const Deq &d, uint32_t (&p)[2]) {
  float f[4];
#pragma unroll
  for (int k = 0; k < 4; k++)
    f[k] = __fmaf_rn(__fmaf_rn(__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u + k)), d.s, d.c[0]), d.up, d.b);
  p[0] = pack_h2(f[0], f[1]);
  p[1] = pack_h2(f[2], f[3]);
}

/* ---- scales and biases ---------------------------------------------------------
 * A stage keeps, per row and slot (the slice's first or second group; two
 * only for g = 32), the aligned 4-byte word that holds the element: the
 * element itself for f32, the element and a neighbour for f16/bf16 (cp.async
 * copies 4 bytes at least). Where that word would reach outside the array
 * (its first or last element, at an odd address: only the first and last
 * rows can) a plain load places the element in the half it would have had. */

/* The f32 value in a stage word: the word (f32), or its high or low half
 * (f16, bf16: high where the element's address has bit 1 set). */
template <typename S>
__device__ __forceinline__ float scale_value(uint32_t word, int high);
template <>
__device__ __forceinline__ float scale_value<float>(uint32_t word, int) {
  return __uint_as_float(word);
}
template <>
__device__ __forceinline__ float scale_value<__nv_bfloat16>(uint32_t word, int high) {
  return __uint_as_float(high ? word & 0xffff0000u : word << 16);
}
template <>
__device__ __forceinline__ float scale_value<__half>(uint32_t word, int high) {
  return __half2float(__ushort_as_half((unsigned short)(high ? word >> 16 : word & 0xffffu)));
}

/* ---- the producer: one slice into one stage ------------------------------------ */

/* A thread's share of every stage, its addresses worked out once: 16-byte
 * chunks c = tid + k * kThreads of the codes (row c / chunks-per-row) and
 * of x (token c / 8), and the scale and bias words of row tid. Rows past
 * the end read the last row, tokens past m the last token; their results
 * are never stored. */
template <int BITS, int NT, typename S>
struct Producer {
  using C = Cfg<BITS, NT>;
  static constexpr int kPerRow = C::kCodeBytes / 16;
  static constexpr int kCodeChunks = kBM * kPerRow / kThreads;
  static constexpr int kXAll = C::kBN * 8;
  static constexpr int kXChunks = (kXAll + kThreads - 1) / kThreads;
  static_assert(kBM == kThreads, "a thread a row of scales");
  static_assert(kBM * kPerRow % kThreads == 0, "whole rounds of code chunks");

  const uint8_t *code[kCodeChunks]; /* slice 0 */
  const uint8_t *x[kXChunks];       /* slice 0 */
  const S *sc, *bi;                 /* row tid's first group */
  int nq, g_shift;
  bool edge;                        /* the first or the last row: words may reach outside */

  __device__ __forceinline__ Producer(const Args &p, int64_t row0, int64_t tok0) {
    const int tid = threadIdx.x;
    const int64_t row_bytes = (int64_t)p.cols * BITS / 8;
#pragma unroll
    for (int k = 0; k < kCodeChunks; k++) {
      const int c = tid + k * kThreads;
      const int64_t r = row0 + c / kPerRow, R = r < p.rows ? r : p.rows - 1;
      code[k] = p.wq + R * row_bytes + (c % kPerRow) * 16;
    }
#pragma unroll
    for (int k = 0; k < kXChunks; k++) {
      const int c = tid + k * kThreads;
      const int64_t t = tok0 + (c >> 3), T = t < p.m ? t : p.m - 1;
      x[k] = reinterpret_cast<const uint8_t *>(p.xs + T * p.cols) + (c & 7) * 16;
    }
    const int64_t r = row0 + tid, R = r < p.rows ? r : p.rows - 1, ng = p.cols >> p.g_shift;
    sc = static_cast<const S *>(p.sc) + R * ng, bi = static_cast<const S *>(p.bi) + R * ng;
    nq = p.g == 32 ? 2 : 1, g_shift = p.g_shift;
    edge = R == 0 || R == p.rows - 1;
  }

  /* The word holding element e of the array [base, end) into dst. */
  __device__ __forceinline__ void scale_word(uint32_t *dst, const S *e, const void *base, const S *end) const {
    if constexpr (sizeof(S) == 4) {
      cp_async4(dst, e);
    } else {
      const uintptr_t a = reinterpret_cast<uintptr_t>(e), w = a & ~(uintptr_t)3;
      if (!edge || (w >= reinterpret_cast<uintptr_t>(base) && w + 4 <= reinterpret_cast<uintptr_t>(end))) {
        cp_async4(dst, reinterpret_cast<const void *>(w));
      } else {
        const uint32_t v = *reinterpret_cast<const uint16_t *>(a);
        *dst = (a & 2) ? v << 16 : v;
      }
    }
  }

  __device__ __forceinline__ void weights(uint8_t *stage, int slice, const Args &p) const {
    const int64_t off = (int64_t)slice * C::kCodeBytes;
#pragma unroll
    for (int k = 0; k < kCodeChunks; k++) cp_async16(stage + (threadIdx.x + k * kThreads) * 16, code[k] + off);
    uint32_t *sw = reinterpret_cast<uint32_t *>(stage + C::kCodes + C::kX) + threadIdx.x;
    const int gi = (slice * kSlice) >> g_shift;
    const int64_t total = p.rows * (p.cols >> g_shift);
    for (int q = 0; q < nq; q++) {
      scale_word(sw + q * kBM, sc + gi + q, p.sc, static_cast<const S *>(p.sc) + total);
      scale_word(sw + (2 + q) * kBM, bi + gi + q, p.bi, static_cast<const S *>(p.bi) + total);
    }
  }

  __device__ __forceinline__ void xs(uint8_t *stage, int slice) const {
#pragma unroll
    for (int k = 0; k < kXChunks; k++) {
      const int c = threadIdx.x + k * kThreads;
      if (kXAll % kThreads && c >= kXAll) break;
      cp_async16(stage + C::kCodes + (c >> 3) * kXPitch + (c & 7) * 16, x[k] + slice * (kSlice * 2));
    }
  }
};

/* ---- the consumer: one slice of MMAs ---------------------------------------------- */

/* The Deq of local row rl for slot q; e_odd: the parity of its element
 * index (row * cols/g + group). */
template <typename S, typename D = Deq>
__device__ __forceinline__ D row_deq(const uint32_t *sw, const Args &p, int rl, int q, int e_odd) {
  const float sc = scale_value<S>(sw[q * kBM + rl], e_odd ^ p.sc_odd);
  const float bi = scale_value<S>(sw[(2 + q) * kBM + rl], e_odd ^ p.bi_odd);
  if constexpr (std::is_same<D, DeqH>::value)
    return make_deqh(sc, bi);
  else
    return make_deq(sc, bi);
}

/* Half-precision arithmetic for 4-bit codes under half-precision scales. */
template <int BITS, typename S>
constexpr bool kHalfDeq = BITS == 4 && !std::is_same<S, float>::value;

/* acc[i][n] += rows (warp*32 + 16i ..) x tokens (8n ..) over one slice.
 * Lane (g8 = lane/4, t = lane%4) handles columns [16t, 16t+16) of rows
 * 16i + g8 and 16i + g8 + 8: k-step j's A fragment is 4 of those columns
 * of those rows (the top's order), its B fragment the same columns of
 * token 8n + g8.
 * row_odd: bit 2i + h, the parity of row 16i + g8 + 8h (clamped). */
template <int BITS, int NT, typename S>
__device__ __forceinline__ void compute_slice(float (&acc)[kMTiles][NT][4], const uint8_t *stage, const Args &p,
                                              int slice, int row_odd, int warp, int g8, int t) {
  using C = Cfg<BITS, NT>;
  constexpr int KB = C::kKB;
  const uint8_t *codes = stage, *xsm = stage + C::kCodes;
  const uint32_t *sw = reinterpret_cast<const uint32_t *>(stage + C::kCodes + C::kX);
  const int q = p.g == 32 ? t >> 1 : 0;
  const int gi_odd = (((slice * kSlice) >> p.g_shift) + q) & 1, ng_odd = (p.cols >> p.g_shift) & 1;
#pragma unroll
  for (int kb = 0; kb < 4 / KB; kb++) {
    uint32_t b[NT][KB][2];
#pragma unroll
    for (int n = 0; n < NT; n++) {
      const uint8_t *xr = xsm + (n * 8 + g8) * kXPitch + t * 32 + kb * KB * 8;
#pragma unroll
      for (int h = 0; h < KB / 2; h++) {
        const uint4 u = *reinterpret_cast<const uint4 *>(xr + 16 * h);
        b[n][2 * h][0] = u.x, b[n][2 * h][1] = u.y, b[n][2 * h + 1][0] = u.z, b[n][2 * h + 1][1] = u.w;
      }
    }
#pragma unroll
    for (int i = 0; i < kMTiles; i++) {
      const int rl = warp * kWarpRows + i * 16 + g8;
      using D = typename std::conditional<kHalfDeq<BITS, S>, DeqH, Deq>::type;
      const D dl = row_deq<S, D>(sw, p, rl, q, gi_odd ^ ((row_odd >> (2 * i)) & ng_odd)),
              dh = row_deq<S, D>(sw, p, rl + 8, q, gi_odd ^ ((row_odd >> (2 * i + 1)) & ng_odd));
      uint32_t a[KB][4];
      if (BITS == 4) { /* words 2t, 2t+1 of the row: k-steps 0-1 and 2-3 */
        const uint32_t *cl = reinterpret_cast<const uint32_t *>(codes + rl * C::kCodeBytes) + 2 * t;
        const uint32_t *ch = reinterpret_cast<const uint32_t *>(codes + (rl + 8) * C::kCodeBytes) + 2 * t;
#pragma unroll
        for (int wq = 0; wq < KB / 2; wq++) {
          const int wi = KB == 4 ? wq : kb;
          uint32_t pl[4], ph[4];
          if constexpr (kHalfDeq<BITS, S>)
            deq4h(cl[wi], dl, pl), deq4h(ch[wi], dh, ph);
          else
            deq4(cl[wi], dl, pl), deq4(ch[wi], dh, ph);
          a[2 * wq][0] = pl[0], a[2 * wq][1] = ph[0], a[2 * wq][2] = pl[1], a[2 * wq][3] = ph[1];
          a[2 * wq + 1][0] = pl[2], a[2 * wq + 1][1] = ph[2], a[2 * wq + 1][2] = pl[3], a[2 * wq + 1][3] = ph[3];
        }
      } else if constexpr (!kHalfDeq<BITS, S>) { /* words 4t .. 4t+3: one k-step each */
        const uint32_t *cl = reinterpret_cast<const uint32_t *>(codes + rl * C::kCodeBytes) + 4 * t;
        const uint32_t *ch = reinterpret_cast<const uint32_t *>(codes + (rl + 8) * C::kCodeBytes) + 4 * t;
#pragma unroll
        for (int j = 0; j < KB; j++) {
          uint32_t pl[2], ph[2];
          deq8(cl[kb * KB + j], dl, pl);
          deq8(ch[kb * KB + j], dh, ph);
          a[j][0] = pl[0], a[j][1] = ph[0], a[j][2] = pl[1], a[j][3] = ph[1];
        }
      }
#pragma unroll
      for (int n = 0; n < NT; n++)
#pragma unroll
        for (int j = 0; j < KB; j++) mma16816(acc[i][n], a[j], b[n][j][0], b[n][j][1]);
    }
  }
}

/* ---- the kernels ---------------------------------------------------------------- */

/* A block a row of x, scaled into f16's range (common.cuh, as gemm.cu
 * does); it lets the product's blocks start at once (PDL). */
constexpr int kScaleThreads = 256;
template <bool PERM8>
__global__ void __launch_bounds__(kScaleThreads)
    scale_rows_kernel(const float *__restrict__ x, int64_t cols, __half *__restrict__ xs, float *__restrict__ back) {
  pdl_launch(); /* the product's blocks come in now and load codes (common.cuh) */
  pdl_wait();
  scale_row_f16<kScaleThreads, PERM8>(x + (int64_t)blockIdx.x * cols, cols, xs + (int64_t)blockIdx.x * cols,
                                      back + blockIdx.x);
}

/* Block (tile * S + r, token tile) of a cluster of S: rows [256 (tile -
 * t0), +256) of p's matrix (t0: its first tile in the grid) x tokens [8 NT
 * ty, +8 NT), slices [r nsl / S, (r+1) nsl / S). */
template <int BITS, int NT, typename S>
__device__ __forceinline__ void qgemm_tile(const Args p, int t0) {
  using C = Cfg<BITS, NT>;
  extern __shared__ __align__(16) uint8_t smem[];
  cg::cluster_group cluster = cg::this_cluster();
  const int n_rank = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g8 = lane >> 2, t = lane & 3;
  const int64_t row0 = (int64_t)(blockIdx.x / n_rank - t0) * kBM, tok0 = (int64_t)blockIdx.y * C::kBN;
  const int n_slices = p.cols / kSlice;
  const int s0 = rank * n_slices / n_rank, n = (rank + 1) * n_slices / n_rank - s0;

  int row_odd = 0; /* parities of this lane's rows, clamped as the producer clamps them */
#pragma unroll
  for (int k = 0; k < 2 * kMTiles; k++) {
    const int64_t r = row0 + warp * kWarpRows + (k >> 1) * 16 + (k & 1) * 8 + g8;
    row_odd |= (int)((r < p.rows ? r : p.rows - 1) & 1) << k;
  }
  float acc[kMTiles][NT][4];
#pragma unroll
  for (int i = 0; i < kMTiles; i++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int k = 0; k < 4; k++) acc[i][j][k] = 0.f;

  /* Prologue: the first kStages - 1 slices' weights, then (after the x
   * pass is done) their x, all as one group; empty groups keep the count
   * at one per stage, so wait<kStages - 2> below means "slice it landed". */
  const Producer<BITS, NT, S> prod(p, row0, tok0);
  for (int s = 0; s < C::kStages - 1 && s < n; s++) prod.weights(smem + s * C::kStage, s0 + s, p);
  wait_for_x_pass();
  for (int s = 0; s < C::kStages - 1 && s < n; s++) prod.xs(smem + s * C::kStage, s0 + s);
  cp_commit();
  for (int s = 0; s < C::kStages - 2; s++) cp_commit();

  int use = 0, fill = C::kStages - 1; /* the stages slice it and slice it + kStages - 1 use */
  for (int it = 0; it < n; it++) {
    cp_wait<C::kStages - 2>();
    __syncthreads(); /* slice it is visible to all; the stage refilled below is free */
    if (it + C::kStages - 1 < n) {
      uint8_t *st = smem + fill * C::kStage;
      prod.weights(st, s0 + it + C::kStages - 1, p);
      prod.xs(st, s0 + it + C::kStages - 1);
    }
    cp_commit();
    compute_slice<BITS, NT, S>(acc, smem + use * C::kStage, p, s0 + it, row_odd, warp, g8, t);
    use = use + 1 == C::kStages ? 0 : use + 1;
    fill = fill + 1 == C::kStages ? 0 : fill + 1;
  }
  cp_wait<0>();
  __syncthreads(); /* every warp is done with the stages: the partial tile overwrites them */

  /* The partial tile, P [token][row] (c0, c1: row 16i + g8, tokens 2t,
   * 2t+1; c2, c3: row + 8). */
  float *P = reinterpret_cast<float *>(smem);
#pragma unroll
  for (int i = 0; i < kMTiles; i++)
#pragma unroll
    for (int j = 0; j < NT; j++) {
      const int r = warp * kWarpRows + i * 16 + g8, tk = j * 8 + 2 * t;
      P[tk * kPPitch + r] = acc[i][j][0];
      P[(tk + 1) * kPPitch + r] = acc[i][j][1];
      P[tk * kPPitch + r + 8] = acc[i][j][2];
      P[(tk + 1) * kPPitch + r + 8] = acc[i][j][3];
    }
  cluster.sync();

  /* Rows [rank * rb, +rb) of the tile: the S partials summed in rank order. */
  const int rb = kBM / n_rank, quads = rb / 4;
  const int n_tok = p.m - tok0 < C::kBN ? (int)(p.m - tok0) : C::kBN;
  for (int idx = threadIdx.x; idx < n_tok * quads; idx += kThreads) {
    const int tk = idx / quads, r = rank * rb + (idx % quads) * 4;
    float4 v = *reinterpret_cast<const float4 *>(cluster.map_shared_rank(P, 0) + tk * kPPitch + r);
    for (int k = 1; k < n_rank; k++) {
      const float4 u = *reinterpret_cast<const float4 *>(cluster.map_shared_rank(P, k) + tk * kPPitch + r);
      v.x += u.x, v.y += u.y, v.z += u.z, v.w += u.w;
    }
    const float up = p.back[tok0 + tk];
    float *yr = p.y + (tok0 + tk) * p.rows + row0 + r;
    const int64_t left = p.rows - (row0 + r);
    if (left > 0) yr[0] = v.x * up;
    if (left > 1) yr[1] = v.y * up;
    if (left > 2) yr[2] = v.z * up;
    if (left > 3) yr[3] = v.w * up;
  }
  /* The other blocks may still be reading this one's P: wait for all before
   * exiting (relaxed: what this block wrote needs no ordering for them). */
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
}

template <int BITS, int NT, typename S>
__global__ void __launch_bounds__(kThreads, kHalfDeq<BITS, S> ? 2 : 1) qgemm_kernel(const Args p) {
  qgemm_tile<BITS, NT, S>(p, 0);
}

/* Block (tile * S + r, token tile) of several products of one x (gate and
 * up): the row tiles run through the matrices in turn, each tile in one
 * matrix, whose fields replace p's (by selects: constant indices only, as
 * qgemm_i8.cu found an indexed parameter read in the loop). */
template <int BITS, int NT, typename S>
__global__ void __launch_bounds__(kThreads, kHalfDeq<BITS, S> ? 2 : 1) qgemm_multi_kernel(const Args p, const Mats ms) {
  const int tile = (int)(blockIdx.x / cg::this_cluster().num_blocks());
  const int mi = tile >= ms.tile0[2] && ms.k > 2 ? 2 : tile >= ms.tile0[1] && ms.k > 1 ? 1 : 0;
  const Mat &w = mi == 0 ? ms.mat[0] : mi == 1 ? ms.mat[1] : ms.mat[2];
  Args q = p;
  q.wq = w.wq, q.sc = w.sc, q.bi = w.bi, q.y = w.y, q.rows = w.rows, q.sc_odd = w.sc_odd, q.bi_odd = w.bi_odd;
  qgemm_tile<BITS, NT, S>(q, mi == 0 ? 0 : mi == 1 ? ms.tile0[1] : ms.tile0[2]);
}

/* ---- launch --------------------------------------------------------------------- */

/* Tokens per block / 8 for m rows of x. RINGLM_CUDA_QGEMM_NT4=1: at most
 * 4 (64 tokens as two token tiles of two blocks an SM each, where one
 * tile of 8 n-tiles a warp spills at two blocks an SM), to compare. */
int pick_nt(int64_t m) {
  static const bool nt4 = env_switch("RINGLM_CUDA_QGEMM_NT4", false);
  return m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 || nt4 ? 4 : 8;
}

/* Blocks per cluster: doubled while the grid is under kTargetBlocks and
 * each block keeps 4 slices at least. */
int pick_cluster(int64_t blocks, int n_slices) {
  int s = 1;
  while (s < kMaxCluster && blocks * s < kTargetBlocks && n_slices / (2 * s) >= 4) s *= 2;
  return s;
}

/* Clusters of s blocks of this instance the card holds at once (0: the
 * query failed), asked once per s. */
template <int BITS, int NT, typename S, bool MULTI>
int resident_clusters(int s) {
  static std::atomic<int> known[kMaxCluster + 1];
  int n = known[s].load(std::memory_order_relaxed);
  if (n) return n - 1;
  cudaLaunchAttribute at;
  at.id = cudaLaunchAttributeClusterDimension;
  at.val.clusterDim.x = (unsigned)s, at.val.clusterDim.y = 1, at.val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)s, 1, 1), cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = Cfg<BITS, NT>::kSmem, cfg.attrs = &at, cfg.numAttrs = 1;
  const cudaError_t e = MULTI ? cudaOccupancyMaxActiveClusters(&n, qgemm_multi_kernel<BITS, NT, S>, &cfg)
                              : cudaOccupancyMaxActiveClusters(&n, qgemm_kernel<BITS, NT, S>, &cfg);
  if (e != cudaSuccess) (void)cudaGetLastError(), n = 0;
  known[s].store(n + 1, std::memory_order_relaxed);
  return n;
}

/* Blocks per cluster. One token tile of 32 or 64 tokens: the widest split
 * (each block 4 slices at least) whose clusters all fit on the card at
 * once, so the grid is one wave. pick_cluster's rule gave the 8B's gate
 * 448 blocks of 8 slices, about two waves at two blocks an SM: 75.8 us at
 * 64 tokens, 63.8 at 32, against 65.9 and 50.6 in one wave of 224 (H200).
 * Elsewhere pick_cluster's rule, which was faster at 16 tokens (57 against
 * 76 us) and at 128 (down: 160 against 190). RINGLM_CUDA_QGEMM_WAVE=0:
 * pick_cluster's rule everywhere, to compare. */
template <int BITS, int NT, typename S, bool MULTI>
int pick_cluster_wave(int64_t clusters, int n_slices) {
  static const bool wave = env_switch("RINGLM_CUDA_QGEMM_WAVE", true);
  if (!wave || NT < 4) return pick_cluster(clusters, n_slices);
  int s = 1;
  while (s < kMaxCluster && n_slices / (2 * s) >= 4 && clusters <= resident_clusters<BITS, NT, S, MULTI>(2 * s)) s *= 2;
  return s;
}

/* One product (ms NULL: qgemm_kernel) or several of one x (ms: the
 * matrices, qgemm_multi_kernel, split as its own occupancy allows: its
 * registers may hold fewer blocks an SM). */
template <int BITS, int NT, typename S>
cudaError_t launch(const Args &a, const Mats *ms, cudaStream_t st) {
  using C = Cfg<BITS, NT>;
  static const cudaError_t attr =
      cudaFuncSetAttribute(qgemm_kernel<BITS, NT, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem);
  static const cudaError_t attr_multi =
      cudaFuncSetAttribute(qgemm_multi_kernel<BITS, NT, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem);
  if (attr != cudaSuccess || (ms && attr_multi != cudaSuccess)) return attr != cudaSuccess ? attr : attr_multi;
  const int64_t tiles = ms ? ms->tile0[ms->k] : (a.rows + kBM - 1) / kBM, tok_tiles = (a.m + C::kBN - 1) / C::kBN;
  const int s = tok_tiles > 1 ? pick_cluster(tiles * tok_tiles, a.cols / kSlice)
                : ms ? pick_cluster_wave<BITS, NT, S, true>(tiles, a.cols / kSlice)
                     : pick_cluster_wave<BITS, NT, S, false>(tiles, a.cols / kSlice);
  const dim3 grid((unsigned)(tiles * s), (unsigned)tok_tiles, 1), cluster((unsigned)s, 1, 1);
  if (ms) return launch_kc(qgemm_multi_kernel<BITS, NT, S>, grid, &cluster, dim3(kThreads, 1, 1), C::kSmem, st, a, *ms);
  return launch_kc(qgemm_kernel<BITS, NT, S>, grid, &cluster, dim3(kThreads, 1, 1), C::kSmem, st, a);
}

template <int BITS, typename S>
cudaError_t launch_nt(const Args &a, const Mats *ms, cudaStream_t st) {
  switch (pick_nt(a.m)) {
  case 1: return launch<BITS, 1, S>(a, ms, st);
  case 2: return launch<BITS, 2, S>(a, ms, st);
  case 4: return launch<BITS, 4, S>(a, ms, st);
  default: return launch<BITS, 8, S>(a, ms, st);
  }
}

template <typename S>
cudaError_t launch_bits(const Args &a, const Mats *ms, int bits, cudaStream_t st) {
  return bits == 4 ? launch_nt<4, S>(a, ms, st) : launch_nt<8, S>(a, ms, st);
}

size_t x_bytes(int64_t m, int64_t cols) { return (size_t)m * (size_t)cols * 2; }

} // namespace

extern "C" size_t rlm__cuda_qgemm_scratch_bytes(int64_t m, int64_t cols) {
  return (x_bytes(m, cols) + (size_t)m * 4 + 255) / 256 * 256;
}

/* The checks of one matrix, and that matrix i agrees with matrix 0 in
 * what a launch shares. */
static rlm_status check_mat(const rlm_cuda_qmat *w, const rlm_cuda_qmat *w0, int i, const char *fn, rlm_error *err) {
  if (!w->wq || !w->scales || !w->biases || w->rows < 1 || w->cols < 1)
    return fail(err, RLM_ERR_INVALID, fn, "weights %d: NULL codes, scales or biases, or an empty matrix", i);
  if (w->bits != 4 && w->bits != 8)
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "%d-bit weights are not supported (4 and 8 are)", w->bits);
  if (w->cols % kSlice || w->cols > INT32_MAX)
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "cols %lld is not a multiple of %d (or past 2^31)", (long long)w->cols,
                kSlice);
  if (w->sdtype != RLM_DTYPE_F16 && w->sdtype != RLM_DTYPE_BF16 && w->sdtype != RLM_DTYPE_F32)
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "scale dtype %d (f16, bf16 and f32 are supported)", (int)w->sdtype);
  if ((w->group_size != 32 && w->group_size != 64 && w->group_size != 128) || w->cols % w->group_size)
    return fail(err, RLM_ERR_INVALID, fn, "group %d for %lld columns (32, 64, 128 dividing cols are valid)",
                w->group_size, (long long)w->cols);
  if (reinterpret_cast<uintptr_t>(w->wq) & 15 || reinterpret_cast<uintptr_t>(w->scales) & 1 ||
      reinterpret_cast<uintptr_t>(w->biases) & 1)
    return fail(err, RLM_ERR_INVALID, fn, "weights %d: codes must be 16-byte aligned, scales and biases 2-byte", i);
  if (w != w0 && (w->cols != w0->cols || w->bits != w0->bits || w->group_size != w0->group_size ||
                  w->sdtype != w0->sdtype))
    return fail(err, RLM_ERR_INVALID, fn, "weights %d differ from weights 0 in cols, bits, group or scale dtype", i);
  return RLM_OK;
}

/* Bit 1 of a 2-byte array's address: which half of its aligned words. */
static int odd_half(const void *a) { return (int)(reinterpret_cast<uintptr_t>(a) >> 1 & 1); }

extern "C" rlm_status rlm__cuda_qgemm_multi(const rlm_cuda_qmat *ws, float *const *ys, int k, const float *x,
                                            int64_t m, void *scratch, rlm_cuda_stream stream, rlm_error *err) {
  const char *fn = "rlm__cuda_qgemm";
  if (!ws || !ys || k < 1 || k > kMaxMats || !x || !scratch || m < 1)
    return fail(err, RLM_ERR_INVALID, fn, "NULL argument, m < 1, or %d products (1 to %d)", k, kMaxMats);
  if (reinterpret_cast<uintptr_t>(scratch) & 15) return fail(err, RLM_ERR_INVALID, fn, "scratch must be 16-byte aligned");
  Mats ms = {};
  int64_t tiles = 0;
  for (int i = 0; i < k; i++) {
    const rlm_status rc = check_mat(&ws[i], &ws[0], i, fn, err);
    if (rc) return rc;
    if (!ys[i]) return fail(err, RLM_ERR_INVALID, fn, "output %d is NULL", i);
    ms.mat[i] = {reinterpret_cast<const uint8_t *>(ws[i].wq), ws[i].scales, ws[i].biases, ys[i], ws[i].rows,
                 odd_half(ws[i].scales), odd_half(ws[i].biases)};
    ms.tile0[i] = (int)(tiles < INT32_MAX ? tiles : INT32_MAX); /* checked below */
    tiles += (ws[i].rows + kBM - 1) / kBM;
  }
  ms.tile0[k] = (int)(tiles < INT32_MAX ? tiles : INT32_MAX), ms.k = k;
  if ((m + 7) / 8 > 65535 || tiles * kMaxCluster > INT32_MAX)
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "a product of %lld x %lld rows is past the grid's limits", (long long)m,
                (long long)(tiles * kBM));
  const rlm_cuda_qmat *w = &ws[0];
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  __half *xs = static_cast<__half *>(scratch);
  float *back = reinterpret_cast<float *>(static_cast<char *>(scratch) + x_bytes(m, w->cols));
  if (w->bits == 4) /* x in deq4's pair order */
    launch_k(scale_rows_kernel<true>, (unsigned)m, kScaleThreads, 0, st, x, w->cols, xs, back);
  else
    launch_k(scale_rows_kernel<false>, (unsigned)m, kScaleThreads, 0, st, x, w->cols, xs, back);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return fail(err, RLM_ERR_INTERNAL, fn, "%s", cudaGetErrorString(e));
  const Args a = {reinterpret_cast<const uint8_t *>(w->wq), w->scales, w->biases, xs, back, ys[0], m, w->rows,
                  (int)w->cols, w->group_size, w->group_size == 32 ? 5 : w->group_size == 64 ? 6 : 7,
                  odd_half(w->scales), odd_half(w->biases)};
#define RLM_T(T) e = launch_bits<T>(a, k > 1 ? &ms : nullptr, w->bits, st)
  RLM_CUDA_FOR_SDTYPE(w->sdtype, RLM_T)
#undef RLM_T
  return e == cudaSuccess ? RLM_OK : fail(err, RLM_ERR_INTERNAL, fn, "%s", cudaGetErrorString(e));
}

extern "C" rlm_status rlm__cuda_qgemm(const rlm_cuda_qmat *w, const float *x, int64_t m, float *y, void *scratch,
                                      rlm_cuda_stream stream, rlm_error *err) {
  if (!w) return fail(err, RLM_ERR_INVALID, "rlm__cuda_qgemm", "NULL weights");
  return rlm__cuda_qgemm_multi(w, &y, 1, x, m, scratch, stream, err);
}
