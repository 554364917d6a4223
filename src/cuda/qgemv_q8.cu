/* qgemv_q8.cu -- MLX-affine 4- and 8-bit weights (and 6-bit ones, for one
 * row of x) times int8 activations: the CPU's `--act-bits 8` product
 * (src/quant/qdot.c) on the GPU.
 *
 * Why: the f32 product (qgemv.cu) spends about 9 instructions per byte of
 * 4-bit codes (shift, mask, to-float, FMA per code), more than the chip
 * issues at HBM speed. With x quantized to int8 once per product, dp4a
 * multiplies 4 codes by 4 activations in one instruction, and a 16-byte
 * vector of codes costs about 2 instructions a byte.
 *
 * The activations, exactly as rlm__q8act_quantize_ref makes them (same
 * division, same products, round half to even): per block of 32, d =
 * max|x| / 127 and xq = rint(x * (127 / max|x|)) in [-127, 127]; also
 * xsum per weight group from the f32 x, for the bias term. The product:
 *
 *   y[o] = sum_b (d_b * s_g(b)) * sum_{i in b} code_oi * xq_i + sum_g b_og * xsum_g
 *
 * as rlm__qmv_q8_ref computes it; the integer sums are exact, so the two
 * differ only in the order of the f32 additions.
 *
 * The scratch's layout is common.cuh's (q8_row_bytes, q8_group): the
 * norms and gated activations that produce x may write it themselves
 * (ops.cu), and the backend then skips the quantization here.
 */
#include "common.cuh"

#include <cuda_runtime.h>
#include <stdlib.h>

namespace {

/* The shape of the work; RLM_CUDA_Q8_* override them to compare variants
 * (docs/cuda-notes.md). */
#ifndef RLM_CUDA_Q8_ROWS
#define RLM_CUDA_Q8_ROWS 2
#endif
#ifndef RLM_CUDA_Q8_UNROLL
#define RLM_CUDA_Q8_UNROLL 2
#endif
#ifndef RLM_CUDA_Q8_WARPS
#define RLM_CUDA_Q8_WARPS 4
#endif
using namespace rlm_cuda;
constexpr int kWarpsPerBlock = RLM_CUDA_Q8_WARPS;
constexpr int kRowsPerWarp = RLM_CUDA_Q8_ROWS;    /* weight rows sharing each load of x */
constexpr int kUnroll = RLM_CUDA_Q8_UNROLL;       /* vectors per row in flight per lane */
constexpr int kRowsPerBlock = kWarpsPerBlock * kRowsPerWarp;

/* Unsigned code bytes of a times signed activation bytes of b, plus c. */
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

/* One row of x's scratch (common.cuh: q8_row_bytes). */
__host__ __device__ inline size_t row_bytes(int64_t cols, int g) { return q8_row_bytes(cols, g); }

/* THE PRODUCTS OF ONE INPUT. q, k and v (and gate and up) multiply the same
 * x; one launch over their rows in turn saves two launches a layer and
 * gives Llama's k and v (1024 rows) and Gemma's small matrices full
 * grids. Segment i's rows are the blocks [first_block[i],
 * first_block[i+1]) of the grid; same cols, bits, group and scale dtype. */
constexpr int kMaxSegs = 3;
struct Seg {
  const uint4 *wq;
  const void *sc, *bi;
  float *y;
  int64_t rows;
};
struct Segs {
  Seg s[kMaxSegs];
  int64_t first_block[kMaxSegs + 1];
  int n;
};

/* The segment block b falls in, and b's index inside it. */
__device__ __forceinline__ const Seg &seg_of(const Segs &p, int64_t *b) {
  int i = 0;
#pragma unroll
  for (int k = 1; k < kMaxSegs; k++) i += k < p.n && *b >= p.first_block[k];
  *b -= p.first_block[i];
  return p.s[i];
}

/* One warp a weight group of x (g / 32 blocks in turn, lane i taking
 * element i of each: q8_group), so that xsum is one warp's sum, in a
 * fixed order: a replay gives the same bits, and so do the norms and
 * activations that write this scratch themselves (ops.cu). */
template <int G32>
__global__ void quantize_kernel(const float *__restrict__ x, int64_t cols, int bits, int64_t n_groups_all,
                                uint8_t *__restrict__ scratch) {
  pdl_enter();
  const int lane = threadIdx.x % kWarp;
  const int64_t gid = (int64_t)blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp; /* over all rows */
  if (gid >= n_groups_all) return;
  const int64_t per_row = cols / (G32 * 32), r = gid / per_row, grp = gid % per_row;
  float v[G32];
#pragma unroll
  for (int j = 0; j < G32; j++) v[j] = x[r * cols + (grp * G32 + j) * 32 + lane];
  q8_group(v, bits, cols, grp, scratch + (size_t)r * row_bytes(cols, G32 * 32), lane);
}

/* kRowsPerWarp weight rows x M rows of x. Lane l takes 16-byte vectors l,
 * l + 32, ... of each row: 32 4-bit codes (one block of x) or 16 8-bit
 * ones (half a block), with their xq, both coalesced. */
template <int BITS, int M, typename T>
__global__ void __launch_bounds__(kWarp *kWarpsPerBlock)
    qgemv_q8_kernel(const Segs segs, const uint8_t *__restrict__ scratch, int64_t cols, int g) {
  pdl_enter();
  constexpr int kCodes = 128 / BITS;
  const int lane = threadIdx.x % kWarp;
  int64_t blk = blockIdx.x;
  const Seg &sg = seg_of(segs, &blk);
  const uint4 *__restrict__ wq = sg.wq;
  const T *__restrict__ sc = static_cast<const T *>(sg.sc), *__restrict__ bi = static_cast<const T *>(sg.bi);
  float *__restrict__ y = sg.y;
  const int64_t rows = sg.rows, row0 = (blk * kWarpsPerBlock + threadIdx.x / kWarp) * kRowsPerWarp;
  if (row0 >= rows) return;
  const int n_rows = rows - row0 < kRowsPerWarp ? (int)(rows - row0) : kRowsPerWarp;
  const int64_t n_vec = cols / kCodes, n_groups = cols / g;
  const size_t rb = row_bytes(cols, g);
  float acc[kRowsPerWarp][M];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; i++)
#pragma unroll
    for (int r = 0; r < M; r++) acc[i][r] = 0.f;
  for (int64_t v0 = lane; v0 < n_vec; v0 += (int64_t)kWarp * kUnroll) {
    uint4 wvs[kUnroll][kRowsPerWarp];
#pragma unroll
    for (int u = 0; u < kUnroll; u++)
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; i++) {
        const int64_t v = v0 + (int64_t)u * kWarp;
        wvs[u][i] = v < n_vec && i < n_rows ? __ldcs(wq + (row0 + i) * n_vec + v) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
      const int64_t v = v0 + (int64_t)u * kWarp;
      if (v >= n_vec) continue; /* not break: the unrolled loop keeps wvs in registers */
      const uint4 *wv = wvs[u];
      const int64_t c0 = v * kCodes, blk = c0 / 32, grp = c0 / g;
      float s[kRowsPerWarp];
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; i++) s[i] = to_f32(__ldg(sc + (row0 + (i < n_rows ? i : 0)) * n_groups + grp));
#pragma unroll
      for (int r = 0; r < M; r++) {
        const uint8_t *base = scratch + r * rb;
        const float db = __ldg(reinterpret_cast<const float *>(base + cols) + blk);
        const int4 *xv = reinterpret_cast<const int4 *>(base + c0);
        int4 xa = __ldg(xv), xb = BITS == 4 ? __ldg(xv + 1) : make_int4(0, 0, 0, 0);
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; i++) {
          int isum = 0;
          if (BITS == 4) { /* word k: evens (x[8k], x[8k+2], ...) then odds, 8 bytes of xq */
            const uint32_t w4[4] = {wv[i].x, wv[i].y, wv[i].z, wv[i].w};
            const int xe[4] = {xa.x, xa.z, xb.x, xb.z}, xo[4] = {xa.y, xa.w, xb.y, xb.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
              isum = dp4a_us(w4[k] & 0x0F0F0F0Fu, xe[k], isum);
              isum = dp4a_us((w4[k] >> 4) & 0x0F0F0F0Fu, xo[k], isum);
            }
          } else {
            isum = dp4a_us(wv[i].x, xa.x, isum);
            isum = dp4a_us(wv[i].y, xa.y, isum);
            isum = dp4a_us(wv[i].z, xa.z, isum);
            isum = dp4a_us(wv[i].w, xa.w, isum);
          }
          acc[i][r] = fmaf((float)isum, db * s[i], acc[i][r]);
        }
      }
    }
  }
  /* The bias term, by group: lanes take the groups in turn. */
  for (int64_t gi = lane; gi < n_groups; gi += kWarp)
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; i++) {
      const float b = to_f32(__ldg(bi + (row0 + (i < n_rows ? i : 0)) * n_groups + gi));
#pragma unroll
      for (int r = 0; r < M; r++) {
        const float *xs = reinterpret_cast<const float *>(scratch + r * rb + cols) + cols / 32;
        acc[i][r] = fmaf(b, __ldg(xs + gi), acc[i][r]);
      }
    }
  warp_store(acc, lane, n_rows, rows, row0, y);
}

/* The warp's sums of R rows (R a power of two, <= 32), each over all 32
 * lanes, in log2(R) + log2(32 / R) steps instead of R * 5 shuffles: at
 * each step a lane keeps half of its rows and gives the other half to
 * the lane `o` away, which keeps the opposite half; once a lane holds one
 * row, the lanes holding the same row add up. Returns the sum, complete
 * in every lane, of the row *row. A fixed order: a replay gives the same
 * bits. */
template <int R>
__device__ __forceinline__ float fold_rows(float (&a)[R], int lane, int *row) {
  int r0 = 0;
#pragma unroll
  for (int h = R / 2, o = kWarp / 2; h >= 1; h /= 2, o /= 2) {
    const bool up = lane & o;
#pragma unroll
    for (int i = 0; i < h; i++) {
      const float send = up ? a[i] : a[i + h], keep = up ? a[i + h] : a[i];
      a[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
    }
    if (up) r0 += h;
  }
  float v = a[0];
#pragma unroll
  for (int o = kWarp / (2 * R); o >= 1; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  *row = r0;
  return v;
}

/* DECODE'S 4- AND 6-BIT PRODUCT (m = 1): x in registers.
 * qgemv_q8_kernel reads x's codes and scales again for every pair of
 * weight rows: 36 bytes of x side per 32 bytes of codes, loads that the
 * L1 serves but that cost as many instructions as the codes' (ncu: L1TEX
 * stalls, DRAM 45%). Here lane l of warp w owns the 32 columns of x-block
 * (w + p * W) * 32 + l for its PP passes, loads their codes, scale and sum
 * once, and keeps them for every row: per row a lane then reads one unit
 * of 32 codes (BITS words: one 16-byte vector at 4 bits, three 8-byte
 * loads at 6) and one scale and bias. The W warps of a block split the
 * columns (split-K: P = ceil(cols / 1024) passes, W = P / PP) over the
 * same R rows; each warp folds its R sums (fold_rows), and the warps add
 * up in shared memory in a fixed order (a replay gives the same bits).
 * The bias term b_g * xsum_g is added by the one lane whose block starts
 * group g.
 *
 * 6 BITS (Llama's output head, as the anchor's Q6_K): x's codes in column
 * order (q8_group's layout for bits other than 4), and each quad of codes
 * (3 bytes of the unit's LSB-first stream) spread into the 4 bytes of a
 * word for dp4a (six_bytes): 8 dp4a a row a lane, about 3 instructions a
 * byte of codes against 1.2 at 4 bits. A unit is 6 words, so a block
 * takes R = 4 / PP rows (xreg_rows), which keeps the current and next row
 * groups' codes at 24 words each.
 *
 * PERSISTENT: launched one-shot (a block a row group), the blocks each
 * loaded once, waited, summed and exited; Llama-8B's gate (1,792 groups,
 * about 7 blocks resident an SM) ran as two waves whose loads all waited
 * at once, the last wave's tail a whole block's latency. So a grid that
 * fills the card once walks the row groups (blk, blk + gridDim.x, ...),
 * the next group's codes, scales and biases loading while the current
 * one is summed. Every output row is summed the same way whichever block
 * takes it, so the grid changes no bit. RINGLM_CUDA_XREG_LOOP=0 launches
 * a block a group, to compare. */

/* A lane's unit of 32 codes of one row: BITS words, one 16-byte vector
 * at 4 bits, three 8-byte ones at 6 (a unit starts at byte 24 v of its
 * row: 8-byte aligned, not 16). */
template <int BITS>
struct XregUnit {
  uint2 v[3];
};
template <>
struct XregUnit<4> {
  uint4 v;
};

template <int BITS, int PP, int R, typename T>
struct XregRows {
  XregUnit<BITS> w[R][PP];
  float s[R][PP], b[R][PP];
};

/* Loads issued only where `on` holds, as predicated instructions rather
 * than a branch. With the next row group's loads under an if, ptxas laid
 * the branch out after the current group's sums, so the loads meant to
 * be in flight during those sums were issued only after them, and each
 * group waited a whole memory latency (SASS of qgemv_q4_xreg_kernel<1,
 * 8, bf16>, now qgemv_xreg_kernel<4, 1, 8, bf16>, 2026-12-04;
 * docs/cuda-notes.md). */
__device__ __forceinline__ uint4 ldcs_if(const uint4 *p, bool on) {
  uint4 v = make_uint4(0, 0, 0, 0);
  asm volatile(
      "{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %5, 0;\n\t"
      "@q ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
      : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
      : "l"(p), "r"((int)on));
  return v;
}
__device__ __forceinline__ uint2 ldcs_if(const uint2 *p, bool on) {
  uint2 v = make_uint2(0, 0);
  asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %3, 0;\n\t@q ld.global.cs.v2.u32 {%0, %1}, [%2];\n\t}"
               : "+r"(v.x), "+r"(v.y)
               : "l"(p), "r"((int)on));
  return v;
}
__device__ __forceinline__ float ldg_f32_if(const float *p, bool on) {
  float v = 0.f;
  asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %2, 0;\n\t@q ld.global.nc.f32 %0, [%1];\n\t}"
               : "+f"(v)
               : "l"(p), "r"((int)on));
  return v;
}
__device__ __forceinline__ unsigned short ldg_u16_if(const void *p, bool on) {
  unsigned short v = 0;
  asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %2, 0;\n\t@q ld.global.nc.b16 %0, [%1];\n\t}"
               : "+h"(v)
               : "l"(p), "r"((int)on));
  return v;
}
__device__ __forceinline__ float ld_scale_if(const float *p, bool on) { return ldg_f32_if(p, on); }
__device__ __forceinline__ float ld_scale_if(const __half *p, bool on) {
  return __half2float(__ushort_as_half(ldg_u16_if(p, on)));
}
__device__ __forceinline__ float ld_scale_if(const __nv_bfloat16 *p, bool on) {
  return __uint_as_float((uint32_t)ldg_u16_if(p, on) << 16);
}

/* Row group blk's weights as lane `vec` of each pass sees them (rows past
 * the segment's end repeat its last row, weighed by nothing); nothing is
 * read unless `on`. The addresses are one 64-bit base a group and 32-bit
 * offsets from it (R rows of codes, scales or biases are far below 2^31
 * elements): the first version's 64-bit products and clamps per row were
 * a third of the kernel's instructions (SASS of <1, 8, bf16>: 308 IMAD
 * against 64 IDP). `gi` is vec * 32 / g, a lane's group, worked out once.
 * A row is n_vec units: n_vec 16-byte vectors at 4 bits, 3 n_vec 8-byte
 * words at 6 (cols * 6 / 8 bytes, a multiple of 96: unit v at byte 24 v). */
template <int BITS, int PP, int R, typename T>
__device__ __forceinline__ void xreg_load(const Segs &segs, int64_t blk, const int (&vec)[PP], const int (&gi)[PP],
                                          int n_vec, int n_groups, XregRows<BITS, PP, R, T> &o, bool on) {
  const Seg &sg = seg_of(segs, &blk);
  const int64_t row0 = blk * R;
  const int64_t left = sg.rows - 1 - row0; /* rows of the group past its first, may be < R - 1 */
  const int last = left < R - 1 ? (int)(left < 0 ? 0 : left) : R - 1;
  const uint4 *__restrict__ wq = sg.wq + row0 * n_vec;                                      /* 4 bits */
  const uint2 *__restrict__ wq6 = reinterpret_cast<const uint2 *>(sg.wq) + row0 * (3 * n_vec); /* 6 bits */
  const T *__restrict__ sc = static_cast<const T *>(sg.sc) + row0 * n_groups;
  const T *__restrict__ bi = static_cast<const T *>(sg.bi) + row0 * n_groups;
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int rr = r < last ? r : last;
#pragma unroll
    for (int p = 0; p < PP; p++) {
      if constexpr (BITS == 4) {
        o.w[r][p].v = ldcs_if(wq + (rr * n_vec + vec[p]), on);
      } else {
#pragma unroll
        for (int k = 0; k < 3; k++) o.w[r][p].v[k] = ldcs_if(wq6 + (rr * 3 * n_vec + 3 * vec[p] + k), on);
      }
      o.s[r][p] = ld_scale_if(sc + (rr * n_groups + gi[p]), on);
      o.b[r][p] = ld_scale_if(bi + (rr * n_groups + gi[p]), on);
    }
  }
}

/* A lane's x for its PP passes, loaded once and kept for every row: the
 * int8 codes of its 32 columns as 8 words, d of its block (divided by 16
 * at 4 bits: xreg_dot), and the f32 sum of its weight group where its
 * block starts one (else 0, so that one lane adds a group's bias term).
 * At 4 bits words 0-3 hold the even bytes and 4-7 the odd ones (they meet
 * the low and the high nibbles), at 6 bits the codes in column order.
 * Lanes past the last column hold zeros. */
template <int BITS, int PP>
struct XregX {
  int xw[PP][8];
  float dx[PP], xs[PP];
};

template <int BITS, int PP>
__device__ __forceinline__ void xreg_x(XregX<BITS, PP> &o, const uint8_t *__restrict__ scratch, int64_t cols, int g,
                                       int warp, int W, int lane) {
  const int n_vec = (int)(cols / 32);
  const float *dq = reinterpret_cast<const float *>(scratch + cols), *xsum = dq + cols / 32;
#pragma unroll
  for (int p = 0; p < PP; p++) {
    const int v = (warp + p * W) * kWarp + lane, c0 = v * 32;
    const bool in = v < n_vec;
    const int4 *xv = reinterpret_cast<const int4 *>(scratch + (in ? c0 : 0));
    const int4 a = in ? __ldg(xv) : make_int4(0, 0, 0, 0), b = in ? __ldg(xv + 1) : make_int4(0, 0, 0, 0);
    if constexpr (BITS == 4) {
      o.xw[p][0] = a.x, o.xw[p][1] = a.z, o.xw[p][2] = b.x, o.xw[p][3] = b.z;
      o.xw[p][4] = a.y, o.xw[p][5] = a.w, o.xw[p][6] = b.y, o.xw[p][7] = b.w;
      /* d / 16: the sums below are 16 times a block's (exact: |16 isum| <
       * 2^24), and (16 isum) (d / 16 s) is the bits of isum (d s) */
      o.dx[p] = in ? __ldg(dq + v) * 0.0625f : 0.f;
    } else {
      o.xw[p][0] = a.x, o.xw[p][1] = a.y, o.xw[p][2] = a.z, o.xw[p][3] = a.w;
      o.xw[p][4] = b.x, o.xw[p][5] = b.y, o.xw[p][6] = b.z, o.xw[p][7] = b.w;
      o.dx[p] = in ? __ldg(dq + v) : 0.f;
    }
    o.xs[p] = in && c0 % g == 0 ? __ldg(xsum + c0 / g) : 0.f;
  }
}

/* Codes 4j..4j+3 of a unit of 32 6-bit codes (MLX's LSB-first stream of 6
 * words): its bits 24j..24j+23, in the low 24 bits of the result (a
 * funnel shift where they straddle two words: j = 1, 2, 5, 6). With j a
 * constant where it is unrolled, so are k and the shift. */
__device__ __forceinline__ uint32_t six_quad(const uint32_t (&w)[6], int j) {
  const int bit = 24 * j, k = bit >> 5, off = bit & 31;
  if (off + 24 <= 32) return w[k] >> off;
  return __funnelshift_r(w[k], w[k + 1], off);
}

/* Four 6-bit codes (bits 0-5, 6-11, 12-17, 18-23 of r) one a byte, as
 * unsigned bytes for dp4a. */
__device__ __forceinline__ uint32_t six_bytes(uint32_t r) {
  return (r & 0x3Fu) | ((r << 2) & 0x3F00u) | ((r << 4) & 0x3F0000u) | ((r << 6) & 0x3F000000u);
}

/* acc plus one row's unit of 32 codes (w) of pass p times the lane's x,
 * scale s and bias b of their group. At 4 bits the high nibbles stay in
 * place, 16 times the code as an unsigned byte: one LOP3 a word instead
 * of a shift and a LOP3. At 6 bits the integer sum (|isum| <= 32 * 63 *
 * 127 < 2^24) is exact, then d s as the reference has it. */
template <int BITS, int PP>
__device__ __forceinline__ float xreg_dot(const XregUnit<BITS> &u, float s, float b, const XregX<BITS, PP> &x, int p,
                                          float acc) {
  if constexpr (BITS == 4) {
    const uint32_t w[4] = {u.v.x, u.v.y, u.v.z, u.v.w};
    int lo = 0, hi = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
      lo = dp4a_us(w[k] & 0x0F0F0F0Fu, x.xw[p][k], lo);
      hi = dp4a_us(w[k] & 0xF0F0F0F0u, x.xw[p][4 + k], hi);
    }
    acc = fmaf((float)(lo * 16 + hi), x.dx[p] * s, acc);
  } else {
    const uint32_t w[6] = {u.v[0].x, u.v[0].y, u.v[1].x, u.v[1].y, u.v[2].x, u.v[2].y};
    int isum = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) isum = dp4a_us(six_bytes(six_quad(w, j)), x.xw[p][j], isum);
    acc = fmaf((float)isum, x.dx[p] * s, acc);
  }
  return fmaf(b, x.xs[p], acc);
}

/* The lane's unit of each pass (32 columns; past the last, unit 0,
 * weighed by nothing: xreg_x) and its weight group. */
template <int PP>
__device__ __forceinline__ void xreg_lanes(int (&vec)[PP], int (&gi)[PP], int warp, int W, int lane, int n_vec, int g) {
#pragma unroll
  for (int p = 0; p < PP; p++) {
    const int v = (warp + p * W) * kWarp + lane;
    vec[p] = v < n_vec ? v : 0;
    gi[p] = vec[p] * 32 / g;
  }
}

/* The warp's sums of the row group cur over its columns (xreg_dot),
 * folded (fold_rows) into red[warp][row] for the block to add up. */
template <int BITS, int PP, int R, typename T>
__device__ __forceinline__ void xreg_fold(const XregRows<BITS, PP, R, T> &cur, const XregX<BITS, PP> &xr, int lane,
                                          int warp, float (&red)[8][R]) {
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    acc[r] = 0.f;
#pragma unroll
    for (int p = 0; p < PP; p++) acc[r] = xreg_dot(cur.w[r][p], cur.s[r][p], cur.b[r][p], xr, p, acc[r]);
  }
  int row;
  const float part = fold_rows(acc, lane, &row);
  if (lane % (kWarp / R) == 0) red[warp][row] = part;
}

template <int BITS, int PP, int R, typename T>
__global__ void __launch_bounds__(kWarp * 8)
    qgemv_xreg_kernel(const Segs segs, const uint8_t *__restrict__ scratch, int64_t cols, int g) {
  __shared__ float red[8][R];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, W = blockDim.x / kWarp;
  const int n_vec = (int)(cols / 32), n_groups = (int)(cols / g);
  const int64_t total = segs.first_block[segs.n];
  int vec[PP], gi[PP];
  xreg_lanes(vec, gi, warp, W, lane, n_vec, g);
  int64_t blk = blockIdx.x;
  XregRows<BITS, PP, R, T> cur;
  xreg_load(segs, blk, vec, gi, n_vec, n_groups, cur, true); /* before the wait: no kernel writes weights */
  pdl_enter();
  XregX<BITS, PP> xr;
  xreg_x(xr, scratch, cols, g, warp, W, lane);
  for (; blk < total; blk += gridDim.x) {
    XregRows<BITS, PP, R, T> nxt;
    xreg_load(segs, blk + gridDim.x, vec, gi, n_vec, n_groups, nxt, blk + gridDim.x < total);
    xreg_fold(cur, xr, lane, warp, red);
    __syncthreads();
    if (threadIdx.x < R) {
      int64_t b = blk;
      const Seg &sg = seg_of(segs, &b);
      const int64_t o = b * R + threadIdx.x;
      if (o < sg.rows) {
        float sum = 0.f;
        for (int w = 0; w < W; w++) sum += red[w][threadIdx.x];
        sg.y[o] = sum;
      }
    }
    __syncthreads(); /* red is rewritten next group */
    cur = nxt;
  }
}

/* HALF-WIDTH BLOCKS: at 4 bits a product of P = cols / 1024 passes, P
 * even and at least 4 (Llama-8B's 4096 and 14336 columns; not Gemma-1B's
 * 1152 or 6912), takes 2 passes a warp, P / 2 warps a block, and 2 rows a
 * block (xreg_rows): half the warps of the fewest passes, so half the
 * fold across warps in shared memory a row group, and twice the row
 * groups to spread over the persistent grid. H100, tg128, two rounds
 * alternating (docs/cuda-notes.md, 2026-12-06, seventh): Llama-8B 4-bit
 * 479.1 / 481.0 against 475.9 / 475.5 tok/s, its token's products in a
 * graph 1,581 against 1,603 us (92.0 to 93.3% of the floor); 2 passes
 * with 4 rows, 4 passes a warp (whole rows) or 2 rows alone were each
 * slower. RINGLM_CUDA_XREG_HALF=0: the fewest passes and 4 rows, to
 * compare. */
bool xreg_half() {
  static const bool on = env_switch("RINGLM_CUDA_XREG_HALF", true);
  return on;
}

/* Passes a warp of the x-in-registers kernel takes (P = ceil(cols / 1024)
 * of them, split over at most 8 warps), or 0 where it does not apply: one
 * row of x, 4- or 6-bit weights. The fewest that fit, or half-width
 * blocks (xreg_half). */
int xreg_passes(const rlm_cuda_qmat *w, int m) {
  if (m != 1 || (w->bits != 4 && w->bits != 6)) return 0;
  const int64_t P = (w->cols + 1023) / 1024;
  if (w->bits == 4 && xreg_half() && P % 2 == 0 && P >= 4 && P / 2 <= 8) return 2;
  for (int pp = 1; pp <= 4; pp *= 2)
    if (P % pp == 0 && P / pp <= 8) return pp;
  return 0;
}

/* The segments of k products of one x, rows_per_block rows a block. */
Segs make_segs(const rlm_cuda_qmat *ws, float *const *ys, int k, int64_t rows_per_block) {
  Segs p = {};
  p.n = k;
  for (int i = 0; i < k; i++) {
    p.s[i] = {reinterpret_cast<const uint4 *>(ws[i].wq), ws[i].scales, ws[i].biases, ys[i], ws[i].rows};
    p.first_block[i + 1] = p.first_block[i] + (ws[i].rows + rows_per_block - 1) / rows_per_block;
  }
  return p;
}

/* Rows a block of the x-in-registers kernel. At 4 bits 4, or 2 where a
 * warp takes 2 passes under xreg_half, unless RINGLM_CUDA_XREG_ROWS says
 * 1, 2, 8 or 16 (to compare: docs/cuda-notes.md); capped so that R * PP
 * <= 16 (the registers). Once the next group's loads really were issued
 * before the current group's sums (ldcs_if), 4 rows beat 8 in the decode
 * step, 461.6-461.9 against 444.97-447.49 tok/s on Llama-8B 4-bit: at 8
 * rows down's two passes a lane took 168 registers, one block of 7 warps
 * an SM, and every product's blocks fit fewer to an SM beside the kernels
 * that overlap them (PDL). At 6 bits a unit is 6 words, not 4: R * PP = 4
 * (xreg_fits). */
int xreg_rows(int bits, int pp) {
  static const int forced = [] {
    const char *e = getenv("RINGLM_CUDA_XREG_ROWS");
    const int r = e ? atoi(e) : 0;
    return r == 1 || r == 2 || r == 4 || r == 8 || r == 16 ? r : 0;
  }();
  if (bits == 6) return 4 / pp;
  int r = forced ? forced : xreg_half() && pp == 2 ? 2 : 4;
  while (r * pp > 16) r /= 2;
  return r;
}

/* The (R, PP) pairs instantiated: those xreg_rows gives. */
constexpr bool xreg_fits(int bits, int r, int pp) { return bits == 4 ? r * pp <= 16 : r * pp == 4; }

bool xreg_loop_on() {
  static const bool on = env_switch("RINGLM_CUDA_XREG_LOOP", true);
  return on;
}

/* The persistent kernel's grid: as many blocks as fit on the card at
 * once (the occupancy of this instance at this block size), at most one
 * a row group. */
template <int BITS, int PP, int R, typename T>
unsigned loop_grid(int threads, int64_t groups) {
  static std::atomic<int> per_sm[9]; /* by warps a block (1..8); zero-initialised, as statics are */
  return resident_grid(qgemv_xreg_kernel<BITS, PP, R, T>, threads, groups, &per_sm[threads / kWarp]);
}

template <int BITS, int PP, int R, typename T>
void launch_xreg_pp(const Segs &p, const uint8_t *x, int64_t cols, int g, int threads, cudaStream_t st) {
  const int64_t groups = p.first_block[p.n];
  const unsigned grid = xreg_loop_on() ? loop_grid<BITS, PP, R, T>(threads, groups) : (unsigned)groups;
  launch_k(qgemv_xreg_kernel<BITS, PP, R, T>, grid, threads, 0, st, p, x, cols, g);
}

template <int BITS, int R, typename T>
void launch_xreg_r(const rlm_cuda_qmat *ws, float *const *ys, int k, int pp, const uint8_t *x, cudaStream_t st) {
  const Segs p = make_segs(ws, ys, k, R);
  const int64_t cols = ws[0].cols;
  const int g = ws[0].group_size, threads = (int)(kWarp * ((cols + 1023) / 1024 / pp));
  /* only the pairs xreg_rows gives are instantiated */
  if constexpr (xreg_fits(BITS, R, 1))
    if (pp == 1) launch_xreg_pp<BITS, 1, R, T>(p, x, cols, g, threads, st);
  if constexpr (xreg_fits(BITS, R, 2))
    if (pp == 2) launch_xreg_pp<BITS, 2, R, T>(p, x, cols, g, threads, st);
  if constexpr (xreg_fits(BITS, R, 4))
    if (pp == 4) launch_xreg_pp<BITS, 4, R, T>(p, x, cols, g, threads, st);
}

template <int BITS, typename T>
void launch_xreg(const rlm_cuda_qmat *ws, float *const *ys, int k, int pp, const uint8_t *x, cudaStream_t st) {
  const int r = xreg_rows(BITS, pp);
  if constexpr (BITS == 4) {
    if (r == 16) launch_xreg_r<4, 16, T>(ws, ys, k, pp, x, st);
    else if (r == 8) launch_xreg_r<4, 8, T>(ws, ys, k, pp, x, st);
    else if (r == 2) launch_xreg_r<4, 2, T>(ws, ys, k, pp, x, st);
    else if (r == 1) launch_xreg_r<4, 1, T>(ws, ys, k, pp, x, st);
    else launch_xreg_r<4, 4, T>(ws, ys, k, pp, x, st);
  } else {
    if (r == 4) launch_xreg_r<6, 4, T>(ws, ys, k, pp, x, st);
    else if (r == 2) launch_xreg_r<6, 2, T>(ws, ys, k, pp, x, st);
    else launch_xreg_r<6, 1, T>(ws, ys, k, pp, x, st);
  }
}

template <int BITS, int M, typename T>
void launch_one(const Segs &p, const uint8_t *x, int64_t cols, int g, cudaStream_t st) {
  const dim3 block(kWarp * kWarpsPerBlock), grid((unsigned)p.first_block[p.n]);
  launch_k(qgemv_q8_kernel<BITS, M, T>, grid, block, 0, st, p, x, cols, g);
}

template <int BITS, typename T>
void launch_m(const Segs &p, const uint8_t *x, int64_t cols, int g, int m, cudaStream_t st) {
#define RLM_ONE(MM) launch_one<BITS, MM, T>(p, x, cols, g, st)
  RLM_CUDA_FOR_M(m, RLM_ONE)
#undef RLM_ONE
}

template <int BITS>
void launch_bits(const rlm_cuda_qmat *ws, float *const *ys, int k, const uint8_t *x, int m, cudaStream_t st) {
  const Segs p = make_segs(ws, ys, k, kRowsPerBlock);
#define RLM_T(T) launch_m<BITS, T>(p, x, ws[0].cols, ws[0].group_size, m, st)
  RLM_CUDA_FOR_SDTYPE(ws[0].sdtype, RLM_T)
#undef RLM_T
}

/* The shapes the activations' scratch takes (6 bits: column order, as 8),
 * and with check_w the weights' shapes. */
bool shape_ok(int64_t cols, int bits, int g) {
  return (bits == 4 || bits == 6 || bits == 8) && (g == 32 || g == 64 || g == 128) && cols > 0 && cols % 128 == 0 &&
         cols % g == 0;
}

rlm_status cuda_status(cudaError_t e, const char *fn, rlm_error *err) {
  return e == cudaSuccess ? RLM_OK : fail(err, RLM_ERR_INTERNAL, fn, "%s", cudaGetErrorString(e));
}

/* One product's checks at m rows of x; *fn names the caller in the
 * message. 6-bit weights only where the x-in-registers kernel takes them
 * (xreg_passes): the general kernel has no 6-bit decode. */
rlm_status check_w(const rlm_cuda_qmat *w, int m, const char *fn, rlm_error *err) {
  if (!w->wq || !w->scales || !w->biases) return fail(err, RLM_ERR_INVALID, fn, "NULL weight arrays");
  if (!shape_ok(w->cols, w->bits, w->group_size) || w->rows < 1 ||
      (w->sdtype != RLM_DTYPE_F16 && w->sdtype != RLM_DTYPE_BF16 && w->sdtype != RLM_DTYPE_F32))
    return fail(err, w->bits == 4 || w->bits == 8 ? RLM_ERR_INVALID : RLM_ERR_UNSUPPORTED, fn,
                "4- or 8-bit weights (or 6 for one row of x), group 32/64/128, cols a multiple of 128, "
                "f16/bf16/f32 scales are needed");
  if (w->bits == 6 && !xreg_passes(w, m))
    return fail(err, RLM_ERR_UNSUPPORTED, fn,
                "6-bit weights only for one row of x (m %d here) and cols (%lld) whose ceil(cols / 1024) passes "
                "split over at most 8 warps, 1, 2 or 4 a warp",
                m, (long long)w->cols);
  return RLM_OK;
}

} // namespace

extern "C" size_t rlm__cuda_q8act_bytes(int64_t cols, int group_size, int m) {
  return (size_t)m * row_bytes(cols, group_size);
}

extern "C" rlm_status rlm__cuda_q8act_quantize(const float *x, int m, int64_t cols, int bits, int group_size,
                                               void *scratch, rlm_cuda_stream stream, rlm_error *err) {
  const char *fn = "rlm__cuda_q8act_quantize";
  if (!x || !scratch || m < 1) return fail(err, RLM_ERR_INVALID, fn, "NULL argument or m < 1");
  if (!shape_ok(cols, bits, group_size))
    return fail(err, RLM_ERR_INVALID, fn, "bits 4, 6 or 8, group 32/64/128 and cols a multiple of 128 are needed");
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  const int64_t n_groups_all = (int64_t)m * (cols / group_size);
  const int warps = 8;
  const unsigned grid = (unsigned)((n_groups_all + warps - 1) / warps);
  uint8_t *out = static_cast<uint8_t *>(scratch);
#define RLM_Q(G32) launch_k(quantize_kernel<G32>, grid, warps * kWarp, 0, st, x, cols, bits, n_groups_all, out)
  RLM_CUDA_FOR_G32(group_size, RLM_Q)
#undef RLM_Q
  const cudaError_t e = cudaGetLastError();
  return cuda_status(e, fn, err);
}


extern "C" rlm_status rlm__cuda_qgemv_q8_multi(const rlm_cuda_qmat *ws, float *const *ys, int k,
                                              const void *scratch, int m, rlm_cuda_stream stream, rlm_error *err) {
  const char *fn = "rlm__cuda_qgemv_q8";
  if (!ws || !ys || !scratch || m < 1 || m > 8 || k < 1 || k > kMaxSegs)
    return fail(err, RLM_ERR_INVALID, fn, "NULL argument, m outside [1, 8] or k outside [1, %d]", kMaxSegs);
  for (int i = 0; i < k; i++) {
    if (!ys[i]) return fail(err, RLM_ERR_INVALID, fn, "NULL output %d", i);
    rlm_status rc = check_w(&ws[i], m, fn, err);
    if (rc) return rc;
    if (ws[i].cols != ws[0].cols || ws[i].bits != ws[0].bits || ws[i].group_size != ws[0].group_size ||
        ws[i].sdtype != ws[0].sdtype)
      return fail(err, RLM_ERR_INVALID, fn, "product %d differs from the first in cols, bits, group or scales", i);
  }
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  const uint8_t *x = static_cast<const uint8_t *>(scratch);
  /* RINGLM_CUDA_Q8_NO_XREG=1: the general kernel, to compare */
  static const bool no_xreg = env_switch("RINGLM_CUDA_Q8_NO_XREG", false);
  const int pp = no_xreg && ws[0].bits != 6 ? 0 : xreg_passes(&ws[0], m); /* 6 bits: no other kernel */
  if (pp && ws[0].bits == 6) {
#define RLM_T(T) launch_xreg<6, T>(ws, ys, k, pp, x, st)
    RLM_CUDA_FOR_SDTYPE(ws[0].sdtype, RLM_T)
#undef RLM_T
  } else if (pp) {
#define RLM_T(T) launch_xreg<4, T>(ws, ys, k, pp, x, st)
    RLM_CUDA_FOR_SDTYPE(ws[0].sdtype, RLM_T)
#undef RLM_T
  } else if (ws[0].bits == 4) {
    launch_bits<4>(ws, ys, k, x, m, st);
  } else {
    launch_bits<8>(ws, ys, k, x, m, st);
  }
  return cuda_status(cudaGetLastError(), fn, err);
}

extern "C" bool rlm__cuda_q8_takes(const rlm_cuda_qmat *w, int m) {
  return w && m >= 1 && m <= 8 && check_w(w, m, "rlm__cuda_q8_takes", NULL) == RLM_OK;
}

extern "C" rlm_status rlm__cuda_qgemv_q8(const rlm_cuda_qmat *w, const void *scratch, int m, float *y,
                                        rlm_cuda_stream stream, rlm_error *err) {
  if (!w || !y) return fail(err, RLM_ERR_INVALID, "rlm__cuda_qgemv_q8", "NULL argument");
  return rlm__cuda_qgemv_q8_multi(w, &y, 1, scratch, m, stream, err);
}
