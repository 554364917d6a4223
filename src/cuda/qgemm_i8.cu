/* qgemm_i8.cu -- MLX-affine 4- and 8-bit weights times int8 activations for
 * 9..128 tokens on the tensor cores: batched decode with --act-bits 8.
 *
 * Why: past 8 rows of x the matrix-vector kernels (qgemv_q8.cu) read W
 * once per 8 rows, and qgemm.cu's f16 product spends ~4 f32 instructions
 * dequantizing each weight. With x already int8 (the CPU's --act-bits 8
 * format, rlm__cuda_q8act_quantize), the codes go to the tensor cores as
 * they are: mma.sync m16n8k32 multiplies unsigned 8-bit codes by signed
 * 8-bit activations into exact s32 sums, one block of 32 columns at a
 * time, and a 4-bit word costs two logic ops (the even and odd nibbles).
 *
 * NUMERICS: rlm__qmv_q8_ref's, up to the order of the f32 additions:
 *
 *   y[t][o] = sum_b (d_tb * s_og(b)) * isum_tob + sum_g b_og * xsum_tg
 *
 * with isum the exact integer dot of block b. The activations' bytes are
 * the GEMV's (same scratch), so batched and one-row products agree.
 *
 * FRAGMENTS. m16n8k32 with 8-bit A (row-major 16 x 32) gives lane (g =
 * lane / 4, t = lane % 4) the k quads {4t..4t+3} (a0: row g, a1: row g+8)
 * and {16+4t..} (a2, a3); B (32 x 8) the same quads of token g (b0, b1).
 * The k order inside a block is free as long as A and B agree, so for
 * 4-bit codes lane t takes word t of the block (codes 8t..8t+7): its low
 * nibbles (codes 8t, 8t+2, 8t+4, 8t+6) are a0's quad and its high ones
 * a2's, which is exactly the order of the scratch's 4-bit layout (each 8
 * activations stored evens then odds): b0 and b1 are one 8-byte read.
 * 8-bit codes and activations are both in natural order.
 *
 * TILING. A block (4 warps) computes 64 weight rows (16 a warp) x BN = 8
 * NT tokens (16 or 32; more tokens take more token tiles); K moves in chunks of 128 columns (4 blocks of 32) through a
 * ring of kStages shared-memory stages filled by cp.async: codes, xq,
 * the chunk's 4 block scales d and its group sums of x per token. Rows
 * of codes and of xq are padded so that the fragment reads hit 32
 * distinct banks. The weights' scales and biases are read from global
 * memory a chunk ahead, into registers (chunk c + 1's loads are in
 * flight while chunk c's mmas run): the 4 lanes of a quad share two
 * rows, so each reads one group of the chunk and shuffles hand the
 * values round. SPLIT-K: where row and token tiles are too few to fill
 * the SMs (4096 rows are 64 tiles), S = 2..8 blocks share a tile, each a
 * run of chunks, and write f32 partials that a second kernel adds in a
 * fixed order (a replay gives the same bits). The split count aims at
 * kTarget blocks, or RINGLM_CUDA_I8_TARGET (66..1056) to compare.
 *
 * SEVERAL PRODUCTS OF ONE x (q, k and v) share a launch: the grid's row
 * tiles run through the matrices in turn, each tile in one matrix, so k
 * and v (a quarter of q's rows for Llama-8B) fill the card together
 * with q rather than as launches of a few dozen blocks, and one
 * add_splits launch serves all three.
 *
 * EPILOGUE: no int-to-float conversion (a quarter-rate instruction). The
 * mma adds its s32 sums to the bits of 1.5 * 2^23 (its C operand), and
 * one FADD takes the exact float back out (kMagic below).
 *
 * PDL: the codes of the first stages and the first chunk's scales and
 * biases are requested before the wait for the kernel that quantized x
 * (common.cuh).
 *
 * WHAT BOUNDS IT: the instructions it issues, not latency or bytes. Each
 * chunk of 16 mmas a warp was 1,428 instructions (bench/sass/loop.py on
 * the sm_90 code), most of them copy addresses and a bias loop over a
 * run-time group count; the instances of a compile-time group size (G,
 * ChunkCopies) issue 400-481: batched S_TG on Llama-8B 4-bit, B = 32
 * 4,133 to 5,254 tok/s, B = 64 5,473 to 6,598 (H100, docs/cuda-notes.md).
 */
#include "common.cuh"

#include <cuda_runtime.h>
#include <stdlib.h>

namespace {

using namespace rlm_cuda;

constexpr int kThreads = 128; /* 4 warps */
constexpr int kBM = 64;       /* weight rows per block: 16 a warp */
constexpr int kChunk = 128;   /* columns per stage: 4 blocks of 32 */
constexpr int kStages = 4;
/* Blocks wanted: four per SM of an H200. Batched Llama-8B 4-bit on the
 * H200 (2026-12-05), tg at B = 32 / 64: 3,594-3,615 / 4,861-4,870 tok/s
 * at 264, 3,633 / 5,108 at 528 (docs/cuda-notes.md). */
constexpr int kTarget = 528;
constexpr int kTargetMin = 66, kTargetMax = 1056; /* RINGLM_CUDA_I8_TARGET's range */
constexpr int kMaxSplit = 8;

template <int BITS, int NT>
struct Cfg {
  static constexpr int kBN = 8 * NT;
  static constexpr int kCodeBytes = kChunk * BITS / 8;          /* one row's codes in a chunk */
  static constexpr int kARow = kCodeBytes + 16;                 /* padded: 20 or 36 words, conflict-free */
  static constexpr int kBRow = BITS == 4 ? kChunk + 32 : kChunk + 16; /* 8- or 4-byte reads, conflict-free */
  static constexpr int kA = kBM * kARow, kB = kBN * kBRow, kD = kBN * 16, kS = kBN * 16;
  static constexpr int kStage = kA + kB + kD + kS;
  static constexpr int kSmem = kStages * kStage;
  static_assert(kStage % 16 == 0, "16-byte aligned stages");
};

/* One weight matrix of a launch: k <= kMaxMats products of the same x
 * (q, k, v) share a grid, each row tile belonging to one matrix. */
constexpr int kMaxMats = 3;
struct Mat {
  const uint8_t *wq;   /* codes [rows][cols * bits / 8] */
  const void *sc, *bi; /* [rows][cols / g] */
  float *y;            /* [m][rows] */
  int64_t rows;
};

struct Args {
  Mat mat[kMaxMats];
  int tile0[kMaxMats + 1]; /* matrix i's row tiles are tile0[i] .. tile0[i + 1] - 1 */
  int64_t roff[kMaxMats];  /* matrix i's first row in the partials' rows */
  int k;
  const uint8_t *x;        /* the q8 scratch: per token xq [cols] | d [cols/32] | xsum [cols/g] */
  size_t x_row;            /* bytes per token of the scratch */
  float *part;             /* split-K partials [S][m][R] (S > 1) */
  int64_t R;               /* the matrices' rows together */
  int64_t m;
  int cols, g;
};

/* 4, 8 or 16 bytes: a chunk's group sums at g = 128, 64, 32. */
__device__ __forceinline__ void cp_sums(void *dst, const void *src, int g) {
  if (g == 32) asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src) : "memory");
  else if (g == 64) asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_u32(dst)), "l"(src) : "memory");
  else asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}

/* The mma's accumulator starts at the bits of the float 1.5 * 2^23, whose
 * unit in the last place is 1 and whose mantissa field is 2^22. A block's
 * dot isum of unsigned 8-bit codes and signed 8-bit activations has
 * |isum| <= 32 * 255 * 128 = 1,044,480 < 2^22, so the integer sum
 * kMagic + isum only moves the mantissa field inside (0, 2^23): no carry
 * into the exponent, no s32 overflow, and the bits are those of the float
 * 1.5 * 2^23 + isum exactly. Subtracting kMagicF is then exact too (an
 * integer under 2^22, 0 giving +0), so one FADD yields (float)isum bit
 * for bit, where an I2F (a quarter of the FP32 rate) did before. */
constexpr int kMagic = 0x4B400000;
constexpr float kMagicF = 12582912.0f; /* 1.5 * 2^23, the float of kMagic's bits */

/* d = the bits of 1.5 * 2^23 + a . b over one block of 32 columns:
 * unsigned codes, signed activations (kMagic). */
__device__ __forceinline__ void mma_u8s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%10,%10,%10,%10};\n"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(kMagic));
}

/* (float)isum from the mma's bits (kMagic). */
__device__ __forceinline__ float magic_f32(int bits) { return __int_as_float(bits) - kMagicF; }

/* The codes of chunk c for the block's rows (clamped to the last row). */
template <int BITS, int NT>
__device__ __forceinline__ void load_codes(const Mat &w, int cols, int64_t row0, int c, uint8_t *st) {
  using C = Cfg<BITS, NT>;
  constexpr int kPer = C::kCodeBytes / 16; /* 16-byte pieces a row */
  const size_t wrow = (size_t)cols * BITS / 8;
  for (int i = threadIdx.x; i < kBM * kPer; i += kThreads) {
    const int r = i / kPer, piece = i % kPer;
    const int64_t row = row0 + r < w.rows ? row0 + r : w.rows - 1;
    cp_async16(st + r * C::kARow + piece * 16, w.wq + (size_t)row * wrow + (size_t)c * C::kCodeBytes + piece * 16);
  }
}

/* xq, the block scales and the group sums of chunk c for the block's tokens. */
template <int BITS, int NT>
__device__ __forceinline__ void load_x(const Args &p, int64_t tok0, int c, uint8_t *st) {
  using C = Cfg<BITS, NT>;
  uint8_t *xs = st + C::kA, *ds = xs + C::kB, *ss = ds + C::kD;
  for (int i = threadIdx.x; i < C::kBN * 8; i += kThreads) {
    const int n = i / 8, piece = i % 8;
    const int64_t tok = tok0 + n < p.m ? tok0 + n : p.m - 1;
    cp_async16(xs + n * C::kBRow + piece * 16, p.x + (size_t)tok * p.x_row + (size_t)c * kChunk + piece * 16);
  }
  for (int n = threadIdx.x; n < C::kBN; n += kThreads) {
    const int64_t tok = tok0 + n < p.m ? tok0 + n : p.m - 1;
    const uint8_t *base = p.x + (size_t)tok * p.x_row + p.cols;
    cp_async16(ds + n * 16, base + (size_t)c * 16);
    cp_sums(ss + n * 16, base + (size_t)(p.cols / 32) * 4 + (size_t)c * (kChunk / p.g) * 4, p.g);
  }
}

/* G > 0 (the weights' group size, 32, 64 or 128, known at compile time):
 * a thread's copies of every chunk, worked out once per tile, so that a chunk's
 * producer is its cp.async and one add each. The generic path (load_codes,
 * load_x) recomputed the rows' clamps and 64-bit addresses every chunk in
 * loops of run-time trip counts: with the bias loop over a run-time group
 * count, three quarters of the 1,428 instructions a warp issued per chunk
 * of 16 mmas (sm_90 code of the 4-bit 32-token instance), and the product
 * is bound by issue (ncu: 18-24 SM cycles an mma). */
template <int BITS, int NT, int G>
struct ChunkCopies {
  using C = Cfg<BITS, NT>;
  static constexpr int kPer = C::kCodeBytes / 16;      /* 16-byte pieces of a row's codes */
  static constexpr int kCodeIt = kBM * kPer / kThreads; /* a thread's pieces of codes a chunk */
  static constexpr int kXIt = C::kBN * 8 / kThreads;    /* and of xq (8 pieces a token) */
  static constexpr int kSumBytes = kChunk / G * 4;      /* a token's group sums a chunk */
  static_assert(kBM * kPer % kThreads == 0 && C::kBN * 8 % kThreads == 0 && C::kBN <= kThreads, "whole rounds");
  const uint8_t *code[kCodeIt], *x[kXIt], *d, *sum; /* chunk 0's; d, sum: threads < kBN */

  __device__ __forceinline__ ChunkCopies(const Args &p, const Mat &w, int64_t row0, int64_t tok0) {
    const int tid = threadIdx.x;
    const size_t wrow = (size_t)p.cols * BITS / 8;
#pragma unroll
    for (int k = 0; k < kCodeIt; k++) {
      const int i = tid + k * kThreads, r = i / kPer;
      const int64_t row = row0 + r < w.rows ? row0 + r : w.rows - 1;
      code[k] = w.wq + (size_t)row * wrow + (i % kPer) * 16;
    }
#pragma unroll
    for (int k = 0; k < kXIt; k++) {
      const int i = tid + k * kThreads;
      const int64_t tok = tok0 + i / 8 < p.m ? tok0 + i / 8 : p.m - 1;
      x[k] = p.x + (size_t)tok * p.x_row + (i % 8) * 16;
    }
    const int64_t tok = tok0 + tid < p.m ? tok0 + tid : p.m - 1;
    d = p.x + (size_t)tok * p.x_row + p.cols, sum = d + (size_t)(p.cols / 32) * 4;
  }

  __device__ __forceinline__ void codes(int c, uint8_t *st) const {
    const int tid = threadIdx.x;
#pragma unroll
    for (int k = 0; k < kCodeIt; k++) {
      const int i = tid + k * kThreads;
      cp_async16(st + (i / kPer) * C::kARow + (i % kPer) * 16, code[k] + (size_t)c * C::kCodeBytes);
    }
  }

  __device__ __forceinline__ void xs(int c, uint8_t *st) const {
    const int tid = threadIdx.x;
    uint8_t *xs = st + C::kA, *ds = xs + C::kB, *ss = ds + C::kD;
#pragma unroll
    for (int k = 0; k < kXIt; k++) {
      const int i = tid + k * kThreads;
      cp_async16(xs + (i / 8) * C::kBRow + (i % 8) * 16, x[k] + (size_t)c * kChunk);
    }
    if (tid < C::kBN) {
      cp_async16(ds + tid * 16, d + (size_t)c * 16);
      cp_sums(ss + tid * 16, sum + (size_t)c * kSumBytes, G); /* G constant: one copy */
    }
  }
};

/* G = 0 (the group size read at run time): load_codes and load_x instead. */
template <int BITS, int NT>
struct ChunkCopies<BITS, NT, 0> {
  __device__ __forceinline__ ChunkCopies(const Args &, const Mat &, int64_t, int64_t) {}
  __device__ __forceinline__ void codes(int, uint8_t *) const {}
  __device__ __forceinline__ void xs(int, uint8_t *) const {}
};

/* One lane's share of a chunk's scales and biases: group t % gpc of the
 * quad's two rows a and b (the fragment's rows g and g + 8). The 4 lanes
 * of a quad share the rows, so between them they hold all the chunk's
 * groups, and group q is lane (quad, q)'s (sb_of): 4 registers a chunk
 * rather than 16, which leaves room for the next chunk's in flight. */
template <typename T>
struct ChunkSB {
  T sa, sb; /* scales */
  T ba, bb; /* biases */
};

/* Lane t's share of chunk c's scales and biases for rows ra and rb, as
 * stored: converted once they have landed (sb_f32). */
template <typename T>
__device__ __forceinline__ ChunkSB<T> load_sb(const Mat &w, int64_t ra, int64_t rb, int c, int ng, int gpc, int t) {
  const T *sc = static_cast<const T *>(w.sc), *bi = static_cast<const T *>(w.bi);
  const int q = t & (gpc - 1); /* gpc is 1, 2 or 4 */
  const size_t ga = (size_t)ra * ng + (size_t)c * gpc + q, gb = (size_t)rb * ng + (size_t)c * gpc + q;
  return {__ldg(sc + ga), __ldg(sc + gb), __ldg(bi + ga), __ldg(bi + gb)};
}

/* As f32 (to_f32 is exact). */
template <typename T>
__device__ __forceinline__ ChunkSB<float> sb_f32(const ChunkSB<T> &v) {
  return {to_f32(v.sa), to_f32(v.sb), to_f32(v.ba), to_f32(v.bb)};
}

/* v of group q: lane q of this lane's quad holds it (ChunkSB). */
__device__ __forceinline__ float sb_of(float v, int q) { return __shfl_sync(0xffffffffu, v, q, 4); }

/* Matrix i of a launch of several, by selects: an indexed parameter went
 * through the constant bank in the loop (o and down 5-7% slower). */
__device__ __forceinline__ Mat mat_of(const Args &p, int i) { return i == 0 ? p.mat[0] : i == 1 ? p.mat[1] : p.mat[2]; }

/* Chunks c0 .. c1 - 1 of one tile of matrix w (rows row0 .. row0 + kBM -
 * 1, tokens tok0 .. tok0 + kBN - 1) into acc, through the ring of stages
 * in smem. The codes of the first stages and chunk c0's scales and biases
 * are requested before the PDL wait (a no-op after the block's first
 * call). */
template <int BITS, int NT, typename T, int G>
__device__ __forceinline__ void tile_chunks(const Args &p, const Mat &w, int64_t row0, int64_t tok0, int c0, int c1,
                                            uint8_t *smem, float (&acc)[NT][4]) {
  using C = Cfg<BITS, NT>;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g8 = lane >> 2, t = lane & 3;
  const int g = G ? G : p.g; /* the weights' group size: G, or at run time */

  /* This lane's two weight rows (clamped for the scale reads). */
  const int64_t ra = row0 + warp * 16 + g8, rb = ra + 8;
  const int64_t rac = ra < w.rows ? ra : w.rows - 1, rbc = rb < w.rows ? rb : w.rows - 1;
  const int ng = p.cols / g, gpc = kChunk / g; /* groups a row, groups a chunk (1, 2 or 4) */

  /* The weights of the first stages and chunk c0's scales and biases,
   * then (PDL) x once it is written. */
  const ChunkCopies<BITS, NT, G> cp(p, w, row0, tok0); /* empty for G = 0 */
  for (int s = 0; s < kStages - 1; s++)
    if (c0 + s < c1) {
      if constexpr (G > 0) cp.codes(c0 + s, smem + s * C::kStage);
      else load_codes<BITS, NT>(w, p.cols, row0, c0 + s, smem + s * C::kStage);
    }
  ChunkSB<T> next = {}; /* chunk c's scales and biases, then (in flight) chunk c + 1's */
  if (c0 < c1) next = load_sb<T>(w, rac, rbc, c0, ng, gpc, t);
  pdl_enter();
  for (int s = 0; s < kStages - 1; s++) {
    if (c0 + s < c1) {
      if constexpr (G > 0) cp.xs(c0 + s, smem + s * C::kStage);
      else load_x<BITS, NT>(p, tok0, c0 + s, smem + s * C::kStage);
    }
    cp_commit();
  }

#pragma unroll
  for (int i = 0; i < NT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

  for (int c = c0; c < c1; c++) {
    /* A register double buffer: chunk c's scales and biases landed during
     * chunk c - 1; chunk c + 1's are in flight during chunk c's mmas
     * (clamped to c on the last, so nothing past chunk c1 - 1 is read). */
    const ChunkSB<float> cur = sb_f32(next);
    next = load_sb<T>(w, rac, rbc, c + 1 < c1 ? c + 1 : c, ng, gpc, t);
    cp_wait<kStages - 2>();
    __syncthreads();
    const int nxt = c + kStages - 1; /* into the stage every warp finished with (the barrier above) */
    if (nxt < c1) {
      uint8_t *st = smem + ((nxt - c0) % kStages) * C::kStage;
      if constexpr (G > 0) {
        cp.codes(nxt, st);
        cp.xs(nxt, st);
      } else {
        load_codes<BITS, NT>(w, p.cols, row0, nxt, st);
        load_x<BITS, NT>(p, tok0, nxt, st);
      }
    }
    cp_commit();
    const uint8_t *st = smem + ((c - c0) % kStages) * C::kStage;
    const uint8_t *as = st + (warp * 16 + g8) * C::kARow, *xs = st + C::kA;
    const float *ds = reinterpret_cast<const float *>(st + C::kA + C::kB);
    const float *ss = ds + C::kBN * 4;
#pragma unroll
    for (int j = 0; j < 4; j++) { /* the chunk's blocks of 32 */
      uint32_t a0, a1, a2, a3;
      if (BITS == 4) {
        const uint32_t wa = *reinterpret_cast<const uint32_t *>(as + j * 16 + 4 * t);
        const uint32_t wb = *reinterpret_cast<const uint32_t *>(as + 8 * C::kARow + j * 16 + 4 * t);
        a0 = wa & 0x0F0F0F0Fu, a2 = (wa >> 4) & 0x0F0F0F0Fu;
        a1 = wb & 0x0F0F0F0Fu, a3 = (wb >> 4) & 0x0F0F0F0Fu;
      } else {
        a0 = *reinterpret_cast<const uint32_t *>(as + j * 32 + 4 * t);
        a2 = *reinterpret_cast<const uint32_t *>(as + j * 32 + 16 + 4 * t);
        a1 = *reinterpret_cast<const uint32_t *>(as + 8 * C::kARow + j * 32 + 4 * t);
        a3 = *reinterpret_cast<const uint32_t *>(as + 8 * C::kARow + j * 32 + 16 + 4 * t);
      }
      const int q = j * 32 / g; /* the group of block j inside the chunk */
      const float s_a = sb_of(cur.sa, q), s_b = sb_of(cur.sb, q);
#pragma unroll
      for (int nt = 0; nt < NT; nt++) {
        const uint8_t *xr = xs + (nt * 8 + g8) * C::kBRow + j * 32;
        uint32_t b0, b1;
        if (BITS == 4) {
          const uint2 v = *reinterpret_cast<const uint2 *>(xr + 8 * t);
          b0 = v.x, b1 = v.y;
        } else {
          b0 = *reinterpret_cast<const uint32_t *>(xr + 4 * t);
          b1 = *reinterpret_cast<const uint32_t *>(xr + 16 + 4 * t);
        }
        int d[4];
        mma_u8s8(d, a0, a1, a2, a3, b0, b1);
        const float d0 = ds[(nt * 8 + 2 * t) * 4 + j], d1 = ds[(nt * 8 + 2 * t + 1) * 4 + j];
        acc[nt][0] = fmaf(magic_f32(d[0]), d0 * s_a, acc[nt][0]);
        acc[nt][1] = fmaf(magic_f32(d[1]), d1 * s_a, acc[nt][1]);
        acc[nt][2] = fmaf(magic_f32(d[2]), d0 * s_b, acc[nt][2]);
        acc[nt][3] = fmaf(magic_f32(d[3]), d1 * s_b, acc[nt][3]);
      }
    }
    for (int q = 0; q < gpc; q++) { /* the bias term, once per group (each acc adds q in order) */
      const float b_a = sb_of(cur.ba, q), b_b = sb_of(cur.bb, q);
#pragma unroll
      for (int nt = 0; nt < NT; nt++) {
        const float x0 = ss[(nt * 8 + 2 * t) * 4 + q], x1 = ss[(nt * 8 + 2 * t + 1) * 4 + q];
        acc[nt][0] = fmaf(b_a, x0, acc[nt][0]), acc[nt][1] = fmaf(b_a, x1, acc[nt][1]);
        acc[nt][2] = fmaf(b_b, x0, acc[nt][2]), acc[nt][3] = fmaf(b_b, x1, acc[nt][3]);
      }
    }
  }
}

/* Row tile rt of all the matrices: which matrix (constant indices), and
 * its first row there. */
__device__ __forceinline__ int mat_at(const Args &p, int rt) {
  return rt >= p.tile0[2] && p.k > 2 ? 2 : rt >= p.tile0[1] && p.k > 1 ? 1 : 0;
}
__device__ __forceinline__ int64_t row_at(const Args &p, int rt, int mi) {
  return (int64_t)(rt - (mi == 0 ? 0 : mi == 1 ? p.tile0[1] : p.tile0[2])) * kBM;
}

/* Block (token tile, row tile of all the matrices, split z). MULTI: k > 1
 * (else matrix 0's fields stay kernel parameters, as before there were
 * several). */
template <int BITS, int NT, typename T, bool MULTI, int G>
__device__ __forceinline__ void qgemm_i8_block(const Args p) {
  using C = Cfg<BITS, NT>;
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g8 = lane >> 2, t = lane & 3;
  /* token tiles vary fastest: the blocks reading a row tile's codes run
   * together, so all but the first read them from the L2 */
  const int by = (int)blockIdx.y;
  const int mi = MULTI ? mat_at(p, by) : 0;
  const Mat w = MULTI ? mat_of(p, mi) : p.mat[0];
  const int64_t row0 = MULTI ? row_at(p, by, mi) : (int64_t)by * kBM, tok0 = (int64_t)blockIdx.x * C::kBN;
  const int n_chunks = p.cols / kChunk, S = (int)gridDim.z, z = (int)blockIdx.z;
  const int c0 = z * n_chunks / S, c1 = (z + 1) * n_chunks / S;

  float acc[NT][4];
  tile_chunks<BITS, NT, T, G>(p, w, row0, tok0, c0, c1, smem, acc);

  /* S = 1: y itself; else split z's partials, this matrix's rows at roff */
  const int64_t ra = row0 + warp * 16 + g8, rb = ra + 8;
  const bool whole = gridDim.z == 1;
  float *out = whole ? w.y : p.part + (size_t)z * (size_t)p.m * (size_t)p.R +
               (size_t)(mi == 0 ? 0 : mi == 1 ? p.roff[1] : p.roff[2]);
  const int64_t ld = whole ? w.rows : p.R;
#pragma unroll
  for (int nt = 0; nt < NT; nt++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int64_t tok = tok0 + nt * 8 + 2 * t + (e & 1), row = e < 2 ? ra : rb;
      if (tok < p.m && row < w.rows) out[tok * ld + row] = acc[nt][e];
    }
}

/* G: the weights' group size when known at compile time (32, 64 or 128:
 * ChunkCopies and the chunk's group loops unrolled), or 0 (read from p). */
template <int BITS, int NT, typename T, bool MULTI, int G>
__global__ void __launch_bounds__(kThreads) qgemm_i8_kernel(const Args p) {
  qgemm_i8_block<BITS, NT, T, MULTI, G>(p);
}

/* The same for four blocks an SM (128 registers, a few spilled, where the
 * 4-bit instances at 32 tokens take 144: three blocks), to compare:
 * ncu had the product latency-bound with 12 warps an SM. */
template <int BITS, int NT, typename T, bool MULTI, int G>
__global__ void __launch_bounds__(kThreads, 4) qgemm_i8_occ4_kernel(const Args p) {
  qgemm_i8_block<BITS, NT, T, MULTI, G>(p);
}

/* Where add_splits_kernel puts each matrix's sums. */
struct SplitOut {
  float *y[kMaxMats];
  int64_t roff[kMaxMats + 1]; /* roff[k] = R */
  int k;
};

/* y_i = the sum of S partials [S][m][R], in split order; block row
 * blockIdx.y is token blockIdx.y. */
__global__ void add_splits_kernel(const float *__restrict__ part, int S, int64_t m, int64_t R, const SplitOut o) {
  pdl_enter();
  const int64_t tok = blockIdx.y, n = m * R;
  for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < R; c += (int64_t)gridDim.x * blockDim.x) {
    const size_t i = (size_t)(tok * R + c);
    float s = part[i];
    for (int z = 1; z < S; z++) s += part[(size_t)z * (size_t)n + i];
    /* constant indices only: an indexed o put it in local memory (a
     * stack frame, 2x this kernel's time) */
    float *y = o.y[0];
    int64_t lo = 0, hi = o.roff[1];
    if (o.k > 1 && c >= o.roff[1]) y = o.y[1], lo = o.roff[1], hi = o.roff[2];
    if (o.k > 2 && c >= o.roff[2]) y = o.y[2], lo = o.roff[2], hi = o.roff[3];
    y[tok * (hi - lo) + c - lo] = s;
  }
}

/* Blocks pick_splits aims for: kTarget, or RINGLM_CUDA_I8_TARGET in
 * kTargetMin..kTargetMax, to compare (more blocks, more split-K
 * partials). Read once: the partials' size depends on it. */
int target_blocks() {
  static const int target = env_int("RINGLM_CUDA_I8_TARGET", kTarget, kTargetMin, kTargetMax);
  return target;
}

/* pick_splits by whole waves (below); RINGLM_CUDA_I8_WAVES=0: by the
 * target rule alone, to compare. With the G instances, batched S_TG on
 * Llama-8B 4-bit B = 32 5,254 to 5,361 tok/s, B = 64 6,598 to 6,787
 * (H100, two rounds, docs/cuda-notes.md). */
bool by_waves() {
  static const bool on = env_switch("RINGLM_CUDA_I8_WAVES", true);
  return on;
}

/* The partials hold S R <= part_rows() rows (rlm__cuda_qgemm_i8_part_bytes):
 * what the target rule can ask (S tiles < 2 target), and with the wave
 * rule, which may split a grid past the target, twice that. */
int64_t part_rows() { return (int64_t)(by_waves() ? 4 : 2) * target_blocks() * kBM; }

/* Splits of K for `blocks` blocks of n_chunks chunks (R rows in all).
 * The target rule: doubled while the grid is under target_blocks() blocks
 * and each split keeps 2 chunks at least. The wave rule (slots: blocks
 * the card holds at once, > 0): the S whose grid takes the least time in
 * whole waves, ceil(blocks S / slots) waves of n_chunks / S chunks, the
 * smaller S on a tie (fewer partials to add). The 8B's gate and up at 32
 * tokens are 448 tiles of 32 chunks on 396 places (an H100 at 3 blocks an
 * SM): S = 2 (the target rule) is 3 waves of 16 chunks, S = 4 5 of 8. */
int pick_splits(int64_t blocks, int n_chunks, int64_t R, int slots) {
  int s = 1;
  if (!by_waves() || slots < 1) {
    const int target = target_blocks();
    while (s < kMaxSplit && blocks * s < target && n_chunks / (2 * s) >= 2) s *= 2;
    return s;
  }
  int64_t best = -1;
  for (int t = 1; t <= kMaxSplit && n_chunks / t >= 2 && t * R <= part_rows(); t *= 2) {
    const int64_t cost = (blocks * t + slots - 1) / slots * ((n_chunks + t - 1) / t);
    if (best < 0 || cost < best) best = cost, s = t;
  }
  return s;
}

/* RINGLM_CUDA_I8_OCC4=1: the 32-token instances (NT = 4) built for four
 * blocks an SM (qgemm_i8_occ4_kernel), to compare; off until it has run
 * on a GPU. */
bool occ4() {
  static const bool on = env_switch("RINGLM_CUDA_I8_OCC4", false);
  return on;
}

/* Weights take the instances of their group size G (ChunkCopies) where
 * one is built (32, 64, 128); RINGLM_CUDA_I8_FAST=0: the run-time group
 * instances (G = 0) for all, to compare (with RINGLM_CUDA_I8_WIDE=32, the
 * limit they were measured best at). */
bool i8_fast() {
  static const bool on = env_switch("RINGLM_CUDA_I8_FAST", true);
  return on;
}

/* The kernel an instance launches. */
template <int BITS, int NT, typename T, bool MULTI, int G>
auto kernel_of() -> void (*)(const Args) {
  if constexpr (NT == 4)
    if (occ4()) return qgemm_i8_occ4_kernel<BITS, NT, T, MULTI, G>;
  return qgemm_i8_kernel<BITS, NT, T, MULTI, G>;
}

/* Blocks of this instance the card holds at once (0: the query failed),
 * asked once. */
template <int BITS, int NT, typename T, bool MULTI, int G>
int resident_blocks() {
  static const int n = [] {
    int per_sm = 0;
    if (cudaFuncSetAttribute(kernel_of<BITS, NT, T, MULTI, G>(), cudaFuncAttributeMaxDynamicSharedMemorySize,
                             Cfg<BITS, NT>::kSmem) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel_of<BITS, NT, T, MULTI, G>(), kThreads,
                                                      Cfg<BITS, NT>::kSmem) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return per_sm * sm_count();
  }();
  return n;
}

/* The G an Args takes: its group size under i8_fast, else 0. */
int g_of(const Args &a) { return i8_fast() ? a.g : 0; }

template <int BITS, int NT, typename T, bool MULTI>
int slots_of(const Args &a) {
  switch (g_of(a)) {
  case 32: return resident_blocks<BITS, NT, T, MULTI, 32>();
  case 64: return resident_blocks<BITS, NT, T, MULTI, 64>();
  case 128: return resident_blocks<BITS, NT, T, MULTI, 128>();
  default: return resident_blocks<BITS, NT, T, MULTI, 0>();
  }
}

template <int BITS, int NT, typename T>
int slots_nt(const Args &a) {
  return a.k > 1 ? slots_of<BITS, NT, T, true>(a) : slots_of<BITS, NT, T, false>(a);
}

template <typename T>
int slots_bits(const Args &a, int bits, int nt) {
  return bits == 4 ? (nt == 2 ? slots_nt<4, 2, T>(a) : slots_nt<4, 4, T>(a))
                   : (nt == 2 ? slots_nt<8, 2, T>(a) : slots_nt<8, 4, T>(a));
}

template <int BITS, int NT, typename T, bool MULTI, int G>
cudaError_t launch_g(const Args &a, int S, cudaStream_t st) {
  using C = Cfg<BITS, NT>;
  static const cudaError_t attr = cudaFuncSetAttribute(kernel_of<BITS, NT, T, MULTI, G>(),
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem);
  if (attr != cudaSuccess) return attr;
  const dim3 grid((unsigned)((a.m + C::kBN - 1) / C::kBN), (unsigned)a.tile0[a.k], (unsigned)S);
  return launch_k(kernel_of<BITS, NT, T, MULTI, G>(), grid, dim3(kThreads), C::kSmem, st, a);
}

template <int BITS, int NT, typename T, bool MULTI>
cudaError_t launch_one(const Args &a, int S, cudaStream_t st) {
  switch (g_of(a)) {
  case 32: return launch_g<BITS, NT, T, MULTI, 32>(a, S, st);
  case 64: return launch_g<BITS, NT, T, MULTI, 64>(a, S, st);
  case 128: return launch_g<BITS, NT, T, MULTI, 128>(a, S, st);
  default: return launch_g<BITS, NT, T, MULTI, 0>(a, S, st);
  }
}

template <int BITS, int NT, typename T>
cudaError_t launch(const Args &a, int S, cudaStream_t st) {
  return a.k > 1 ? launch_one<BITS, NT, T, true>(a, S, st) : launch_one<BITS, NT, T, false>(a, S, st);
}

template <int BITS, typename T>
cudaError_t launch_nt(const Args &a, int nt, int S, cudaStream_t st) {
  return nt == 2 ? launch<BITS, 2, T>(a, S, st) : launch<BITS, 4, T>(a, S, st);
}

template <typename T>
cudaError_t launch_bits(const Args &a, int bits, int nt, int S, cudaStream_t st) {
  return bits == 4 ? launch_nt<4, T>(a, nt, S, st) : launch_nt<8, T>(a, nt, S, st);
}

/* Tokens per block (8 NT) for m tokens: more token tiles rather than
 * wider ones past 32 (8 n-tiles a warp took 186 registers a thread and
 * ran at half the speed per token of 4). The backend sends up to 64
 * tokens here (two token tiles): with the G instances that beat qgemm.cu
 * at 64 (docs/cuda-notes.md, 2026-12-05, eighth). */
int pick_nt(int64_t m) { return m <= 16 ? 2 : 4; }

} // namespace

extern "C" size_t rlm__cuda_qgemm_i8_part_bytes(int64_t m) {
  return (size_t)part_rows() * (size_t)m * sizeof(float); /* pick_splits keeps S R under part_rows() */
}

/* The checks of one matrix (the first) or of one that must agree with it. */
static rlm_status check_mat(const rlm_cuda_qmat *w, const rlm_cuda_qmat *w0, int i, rlm_error *err) {
  const char *fn = "rlm__cuda_qgemm_i8";
  if (w->rows < 1 || !w->wq || !w->scales || !w->biases)
    return fail(err, RLM_ERR_INVALID, fn, "weights %d: NULL codes, scales or biases, or rows < 1", i);
  if (w->bits != 4 && w->bits != 8)
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "%d-bit weights are not supported (4 and 8 are)", w->bits);
  if ((w->group_size != 32 && w->group_size != 64 && w->group_size != 128) || w->cols % kChunk || w->cols > INT32_MAX)
    return fail(err, RLM_ERR_INVALID, fn, "group %d for %lld columns (32, 64, 128; cols a multiple of %d)",
                w->group_size, (long long)w->cols, kChunk);
  if (w->sdtype != RLM_DTYPE_F16 && w->sdtype != RLM_DTYPE_BF16 && w->sdtype != RLM_DTYPE_F32)
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "scale dtype %d (f16, bf16 and f32 are supported)", (int)w->sdtype);
  if (reinterpret_cast<uintptr_t>(w->wq) & 15)
    return fail(err, RLM_ERR_INVALID, fn, "weights %d: codes must be 16-byte aligned", i);
  if (w != w0 && (w->cols != w0->cols || w->bits != w0->bits || w->group_size != w0->group_size ||
                  w->sdtype != w0->sdtype))
    return fail(err, RLM_ERR_INVALID, fn, "weights %d differ from weights 0 in cols, bits, group or scale dtype", i);
  return RLM_OK;
}

extern "C" rlm_status rlm__cuda_qgemm_i8_multi_late(const rlm_cuda_qmat *ws, float *const *ys, int k,
                                                   const void *xq8, int64_t m, float *part, rlm_cuda_sum *sums,
                                                   rlm_cuda_stream stream, rlm_error *err) {
  const char *fn = "rlm__cuda_qgemm_i8";
  if (!ws || !ys || k < 1 || k > kMaxMats || !xq8 || !part || m < 1)
    return fail(err, RLM_ERR_INVALID, fn, "NULL argument, m < 1, or %d products (1 to %d)", k, kMaxMats);
  if (reinterpret_cast<uintptr_t>(xq8) & 15)
    return fail(err, RLM_ERR_INVALID, fn, "codes and the activations' scratch must be 16-byte aligned");
  Args a = {};
  int64_t tiles = 0, R = 0;
  for (int i = 0; i < k; i++) {
    const rlm_status rc = check_mat(&ws[i], &ws[0], i, err);
    if (rc) return rc;
    if (!ys[i]) return fail(err, RLM_ERR_INVALID, fn, "output %d is NULL", i);
    a.mat[i] = {reinterpret_cast<const uint8_t *>(ws[i].wq), ws[i].scales, ws[i].biases, ys[i], ws[i].rows};
    a.tile0[i] = (int)(tiles < 65536 ? tiles : 65536), a.roff[i] = R; /* checked below */
    tiles += (ws[i].rows + kBM - 1) / kBM, R += ws[i].rows;
  }
  a.tile0[k] = (int)(tiles < 65536 ? tiles : 65536);
  const int nt = pick_nt(m);
  const int64_t tok_tiles = (m + 8 * nt - 1) / (8 * nt);
  if (tiles > 65535 || tok_tiles > INT32_MAX)
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "a product of %lld x %lld rows is past the grid's limits", (long long)m,
                (long long)R);
  a.k = k, a.x = static_cast<const uint8_t *>(xq8), a.x_row = rlm__cuda_q8act_bytes(ws[0].cols, ws[0].group_size, 1);
  a.part = part, a.R = R, a.m = m, a.cols = (int)ws[0].cols, a.g = ws[0].group_size;
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  cudaError_t e = cudaSuccess;
  int slots = 0;
  if (by_waves()) {
#define RLM_T(T) slots = slots_bits<T>(a, ws[0].bits, nt)
    RLM_CUDA_FOR_SDTYPE(ws[0].sdtype, RLM_T)
#undef RLM_T
  }
  const int S = pick_splits(tiles * tok_tiles, (int)(ws[0].cols / kChunk), R, slots);
  if ((size_t)S * (size_t)m * (size_t)R * sizeof(float) > rlm__cuda_qgemm_i8_part_bytes(m) && S > 1)
    return fail(err, RLM_ERR_INTERNAL, fn, "partials of %d splits past the scratch", S);
#define RLM_T(T) e = launch_bits<T>(a, ws[0].bits, nt, S, st)
  RLM_CUDA_FOR_SDTYPE(ws[0].sdtype, RLM_T)
#undef RLM_T
  if (e != cudaSuccess) return fail(err, RLM_ERR_INTERNAL, fn, "%s", cudaGetErrorString(e));
  if (sums) sums[0].S = 0;
  if (S == 1) return RLM_OK;
  rlm_cuda_sum d[kMaxMats];
  for (int i = 0; i < k; i++) d[i] = {part, S, m * R, R, a.roff[i]};
  if (!sums) return rlm__cuda_sums_write(d, ys, k, m, stream, err);
  for (int i = 0; i < k; i++) sums[i] = d[i];
  return RLM_OK;
}

extern "C" rlm_status rlm__cuda_qgemm_i8_multi(const rlm_cuda_qmat *ws, float *const *ys, int k, const void *xq8,
                                              int64_t m, float *part, rlm_cuda_stream stream, rlm_error *err) {
  return rlm__cuda_qgemm_i8_multi_late(ws, ys, k, xq8, m, part, NULL, stream, err);
}

/* All the products of one launch (sum 0 at offset 0): their rows follow
 * one another in the partials, product i's from roff[i] to the next
 * one's offset (or R), which is how add_splits_kernel tells them apart. */
extern "C" rlm_status rlm__cuda_sums_write(const rlm_cuda_sum *sums, float *const *ys, int k, int64_t m,
                                           rlm_cuda_stream stream, rlm_error *err) {
  const char *fn = "rlm__cuda_sums_write";
  if (!sums || !ys || k < 1 || k > kMaxMats || m < 1 || sums[0].S < 2 || !sums[0].part)
    return fail(err, RLM_ERR_INVALID, fn, "NULL argument, m < 1, %d sums (1 to %d), or nothing split", k, kMaxMats);
  SplitOut o = {};
  const int64_t R = sums[0].R;
  for (int i = 0; i < k; i++) {
    if (!ys[i] || sums[i].part != sums[0].part || sums[i].S != sums[0].S || sums[i].R != R || sums[i].mR != m * R ||
        (i == 0 ? sums[i].roff != 0 : sums[i].roff <= sums[i - 1].roff) || sums[i].roff >= R)
      return fail(err, RLM_ERR_INVALID, fn, "sum %d is not of the launch sum 0 describes, or not all of its products (or its output is NULL)", i);
    o.y[i] = ys[i], o.roff[i] = sums[i].roff;
  }
  o.roff[k] = R, o.k = k;
  const unsigned bx = (unsigned)((R + 255) / 256 < 1024 ? (R + 255) / 256 : 1024);
  const cudaError_t e = launch_k(add_splits_kernel, dim3(bx, (unsigned)m), dim3(256), 0,
                                 reinterpret_cast<cudaStream_t>(stream), sums[0].part, sums[0].S, m, R, o);
  return e == cudaSuccess ? RLM_OK : fail(err, RLM_ERR_INTERNAL, fn, "%s", cudaGetErrorString(e));
}

extern "C" rlm_status rlm__cuda_qgemm_i8(const rlm_cuda_qmat *w, const void *xq8, int64_t m, float *y, float *part,
                                        rlm_cuda_stream stream, rlm_error *err) {
  if (!w) return fail(err, RLM_ERR_INVALID, "rlm__cuda_qgemm_i8", "NULL weights");
  return rlm__cuda_qgemm_i8_multi(w, &y, 1, xq8, m, part, stream, err);
}
