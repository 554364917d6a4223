/* attn.cu -- the KV cache's write and attention over it (cuda_ops.h):
 * rlm__cuda_kv_write, rlm__cuda_attend, and rlm__cuda_qkv_prep (a layer's
 * q, k, v norms and RoPE, with the dense write, in one launch).
 *
 * The cache is cuda_ops.h's rlm_cuda_kv: [n_rows][n_kv][cap][dim] for K
 * and for V, position p of a row in slot p (plain, or p < keep) or
 * keep + (p - keep) % ring, a query at qp seeing kp <= qp with window == 0,
 * kp < keep or qp - kp < window - keep (attn.h's rlm__attn_visible).
 *
 * WHAT A QUERY SEES, in position order, is at most two runs:
 *
 *     sinks [0, sink_end)   then   window [lo, qp]
 *     lo = window ? max(0, qp - (window - keep) + 1) : 0,  sink_end = min(keep, lo)
 *
 * numbered t = 0 .. N-1 (N = sink_end + qp + 1 - lo). Window positions map
 * to consecutive slots that wrap once from cap to keep, so slot(t) is one
 * add and one compare from slot(lo), no division per key.
 *
 * FLASH-DECODING, two kernels:
 *   1. attend_kernel, a block per (token j, kv head, up to GQ of its query
 *      heads, part s of S): part s is t in [N s / S, N (s+1) / S), from
 *      tok_pos on the device, so the launch is the same every step. Each
 *      K and V row is read once for all the block's query heads (GQA).
 *      A key's row (dim elements) is read as 16-byte vectors by a group of
 *      lanes (`kLanes`, up to the warp); the groups of the block take keys
 *      in turn, kUnroll at once (the next step's loads in flight during
 *      this one's arithmetic), each keeping its own running max m, sum
 *      l and o[dim] (online softmax, scores in log2 units so exp2f does
 *      the exponentials). The groups merge in shared memory; the block
 *      writes its part's m, l and unnormalised o per head to scratch. An
 *      empty part writes m = -inf, l = 0, o = 0.
 *   2. merge_kernel, a block per (token, head): out = sum_s o_s 2^(m_s - M)
 *      / sum_s l_s 2^(m_s - M), M = max m_s; a query that sees nothing
 *      (every m_s = -inf) gets zeros.
 * S depends only on the launch's n and n_heads (n_splits), never on the
 * positions; scratch is n * n_heads * S * (dim + 2) floats. A query uses
 * only its first ceil(N / min_keys) parts (parts_used, from tok_pos, so
 * still the same launch every step): the others return at once and the
 * merge reads only the used ones, so a short context pays for few parts.
 *
 * 4-BIT K AND V of f16/bf16 scales at head dims 64, 128 and 256 take a
 * kernel of their own in step 1, attend_q4_lanekey_kernel (a key a lane,
 * then the lanes over dim for P x V; its comment says why), writing the
 * same parts for the same merge.
 *
 * QUANTIZED CACHES (k_bits, v_bits): the write quantizes each head's row
 * in the block (kv_write_q_kernel, bit for bit the CPU's quantizer), and
 * attend_kernel reads rows through a policy (DenseRows, QuantRows) that
 * loads a lane's vector of 8 codes with its group's scale and bias and
 * widens it to floats in registers: the kernel is otherwise the same, and
 * a 4-bit row is under a third of a bf16 row's bytes.
 */
#include "cuda_ops.h"

#include "attn_rows.cuh"
#include "common.cuh"

#include <type_traits>

#include <cuda_runtime.h>
#include <float.h>
#include <stdlib.h>

namespace {

using namespace rlm_cuda;

/* The shape of the work; RLM_CUDA_ATTN_* override them to compare variants. */
#ifndef RLM_CUDA_ATTN_WARPS
#define RLM_CUDA_ATTN_WARPS 4
#endif
#ifndef RLM_CUDA_ATTN_UNROLL
#define RLM_CUDA_ATTN_UNROLL 2
#endif
constexpr int kAttnWarps = RLM_CUDA_ATTN_WARPS; /* warps per block                          */
constexpr int kUnroll = RLM_CUDA_ATTN_UNROLL;   /* keys per lane group in flight            */
/* A short context's whole attention in one block a query head
 * (attend_kernel's WHOLE, ATTN_WHOLE below): wider blocks, more keys in
 * flight a lane group. */
constexpr int kWholeWarps = 16, kWholeUnroll = 4;
constexpr int kMaxDim = 512;
constexpr int kMaxSplits = 128;
/* (token, head, part) triples to aim for: with one token of 32 heads,
 * 128 parts, 1024 blocks of Llama-8B's 8 kv heads; prefill chunks of
 * hundreds of tokens get 1 part, nothing to merge. */
constexpr int64_t kSplitTarget = 4096;
constexpr int kMergeThreads = 128;
/* Keys a part takes (min_keys below), but for short contexts cut finer
 * (PartRule): a query that sees few positions uses fewer parts than the
 * launch has (the rest exit at once, and the merge reads only the parts
 * used), so a short context costs little beyond one pass. */
constexpr int kMinKeys = 64;
/* Parts a short context is cut into at least, where the kernel's step
 * allows (PartRule). */
constexpr int kShortParts = 16;
constexpr float kLog2e = 1.4426950408889634f;

int n_splits(int n, int n_heads) {
  const int64_t th = (int64_t)n * n_heads;
  int s = 1;
  while (s < kMaxSplits && th * s < kSplitTarget) s *= 2;
  return s;
}

/* Passes of at most kEarlyMaxRows tokens: qkv_prep and the attention
 * merge read the pass plan's rows and positions before their PDL wait
 * (qkv_prep_row, merge_kernel's EARLY); RINGLM_CUDA_EARLY_POS=0 after it
 * for every pass, to compare. Llama-8B 4-bit (H100, two rounds,
 * docs/cuda-notes.md): tg128 441 to 449 tok/s, batched S_TG B = 8 +0.5%,
 * B = 32 level, B = 64 -1.3% (6,598 to 6,515), hence the limit. */
constexpr int kEarlyMaxRows = 32;

bool early_pos(int n) {
  static const bool on = env_switch("RINGLM_CUDA_EARLY_POS", true);
  return on && n <= kEarlyMaxRows;
}

/* HOW MANY PARTS A QUERY OF N POSITIONS USES (before the launch's cap):
 * ceil(N / min_keys), but for a kernel whose block takes `step` keys a
 * round (attend_kernel: its lane groups x kUnroll) at least
 * min(ceil(N / step), short_parts). A part is latency-bound (see
 * prefetch_part), each round a trip to memory, so at tg128's depths a
 * few parts of 64 keys (4 rounds of Llama-8B's 128-wide rows, 8 of
 * Gemma's 256-wide) kept the decode step waiting; more parts of one round
 * each cost the merge little more. Past short_parts x min_keys positions
 * the first term rules, as before: measured on the H200
 * (docs/cuda-notes.md), 16 keys a part everywhere took Llama-8B tg128
 * from 539 to 554 tok/s but at depth 4096 from 425 to 404, with 128
 * parts where 64 did better. This rule (H100): Gemma-1B 4-bit tg128 977
 * to 1,089 tok/s (its 512-position windows gain at every depth), the 8B
 * 456 to 464, depths 4096 and 16384 level or better. step 0: min_keys
 * alone (quantized caches; the 4-bit lane-a-key kernel takes 128 keys a
 * round). The merge uses the same rule. */
struct PartRule {
  int min_keys, step, short_parts;
};

__host__ __device__ __forceinline__ int64_t rule_parts(int64_t n, PartRule pr) {
  int64_t want = (n + pr.min_keys - 1) / pr.min_keys;
  if (pr.step > 0) {
    int64_t s = (n + pr.step - 1) / pr.step;
    s = s < pr.short_parts ? s : pr.short_parts;
    want = want > s ? want : s;
  }
  return want;
}

/* kMinKeys and kShortParts, or to compare RINGLM_CUDA_ATTN_MIN_KEYS=k (1
 * to 4096) and RINGLM_CUDA_ATTN_SHORT_PARTS=k (0: min_keys alone). A
 * launch of n tokens shares the short parts: short_parts / n each (none
 * below one), so batched decode keeps min_keys' parts. With 16 parts at
 * every n, Llama-8B 4-bit batched S_TG lost 1.5% at B = 8 and 1% at B =
 * 32 against min_keys alone (1,700-1,705 against 1,729-1,730 tok/s, H100,
 * docs/cuda-notes.md), where a query had 3-4 parts of 64 keys already. */
PartRule part_rule(int step, int n) {
  static const int mk = env_int("RINGLM_CUDA_ATTN_MIN_KEYS", kMinKeys, 1, 4096);
  static const int sp = env_int("RINGLM_CUDA_ATTN_SHORT_PARTS", kShortParts, 0, 128);
  const int share = n > 0 ? sp / n : 0;
  return PartRule{mk, share > 0 ? step : 0, share};
}

/* launch_parts below; RINGLM_CUDA_ATTN_CAP_PARTS=0: n_splits alone, to
 * compare (tg128 441 to 442 tok/s, 449 to 450.5 with EARLY_POS; H100). */
bool cap_parts() {
  static const bool on = env_switch("RINGLM_CUDA_ATTN_CAP_PARTS", true);
  return on;
}

/* The parts a launch has: n_splits, or (cap_parts) at most those a query
 * of this cache can use. A query sees at most cap positions (runs_of), so
 * it uses at most rule_parts(cap) parts (parts_used), and with no
 * more in the launch its parts and their bounds are the same: the same
 * bits. Decode's one token of Llama-8B launched 128 parts for each of its
 * 8 kv heads, 1,024 blocks, where a cache of tg128's 129 positions lets
 * at most 3 parts of a head do any work; the rest read the token's row
 * and position and exit. */
int launch_parts(int n, int n_heads, int64_t cap, PartRule pr) {
  const int s = n_splits(n, n_heads);
  if (!cap_parts()) return s;
  const int64_t most = rule_parts(cap, pr);
  return most < 1 ? 1 : most < s ? (int)most : s;
}

/* ---- the write ------------------------------------------------------------ */

/* Block (token j, kv head h), threads over dim. */
template <typename T>
__global__ void kv_write_kernel(rlm_cuda_kv c, const float *__restrict__ k, const float *__restrict__ v,
                                const int32_t *__restrict__ tok_row, const int64_t *__restrict__ tok_pos) {
  pdl_enter();
  const int64_t j = blockIdx.x;
  const int h = blockIdx.y;
  int row;
  const int64_t slot = token_slot(c, tok_row, tok_pos, j, &row);
  if (slot < 0) return;
  const int64_t dst = (((int64_t)row * c.n_kv + h) * c.cap + slot) * c.dim, src = (j * c.n_kv + h) * c.dim;
  T *kd = static_cast<T *>(c.k) + dst, *vd = static_cast<T *>(c.v) + dst;
  for (int d = threadIdx.x; d < c.dim; d += blockDim.x) {
    put(kd + d, k[src + d]);
    put(vd + d, v[src + d]);
  }
}

/* THE LAYER'S Q, K AND V AFTER THEIR PROJECTIONS, in one launch (the
 * decode step's norms, RoPE and KV write: four to seven small kernels a
 * layer in one): a warp a head row of a token, KN = hd / 32 elements a
 * lane (lane + 32 i), so that the RoPE pair of element i (i + hd/2) is
 * the same lane's element i + KN/2. Rows of token j: q's hq heads (normed
 * by qw when given, then rotated), k's nk (kw, rotated), v's nv (normed
 * without a weight when vnorm). Each step is rmsnorm_kernel's and
 * rope_kernel's arithmetic (ops.cu); only the order of the norm's double
 * adds differs (a warp's tree instead of the block's). T (not void): k
 * and v rows are also written into the dense cache c, as kv_write_kernel
 * writes them. */
/* QKV_LATE: q, k and v are the sums one split product left (rlm_cuda_sum,
 * their rows at the offsets qs.roff, rk and rv of the partials), added
 * here in split order as they are loaded; the rows are written as
 * before, so v is processed (and written) even where nothing else is done
 * to it. */
struct QkvSums {
  rlm_cuda_sum qs;
  int64_t rk, rv;
};

/* EARLY: the k and v rows' cache slots found before the PDL wait, which
 * this function then does itself (tok_row and tok_pos are the pass plan,
 * copied before the pass and written by no kernel): the wait is followed
 * by the rows' loads only, not by a second round trip for the slot. */
template <int KN, typename T, bool LATE, bool EARLY>
__device__ __forceinline__ void qkv_prep_row(float *q, float *k, float *v, int n, int hq, int nk, int nv,
                                             const float *qw, const float *kw, bool vnorm, double eps, const float *cs,
                                             int64_t stride, const rlm_cuda_kv &c, const int32_t *__restrict__ tok_row,
                                             const int64_t *__restrict__ tok_pos, const QkvSums &ls) {
  constexpr int hd = KN * kWarp, half = KN / 2;
  const int lane = threadIdx.x % kWarp, per_tok = hq + nk + nv;
  const int64_t t = (int64_t)blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  int early_row = 0;
  int64_t early_slot = -1;
  if constexpr (EARLY) {
    if (!std::is_void<T>::value && t < (int64_t)n * per_tok && t % per_tok >= hq)
      early_slot = token_slot(c, tok_row, tok_pos, t / per_tok, &early_row);
    pdl_enter();
  }
  if (t >= (int64_t)n * per_tok) return;
  const int64_t j = t / per_tok;
  const int i = (int)(t % per_tok), kind = i < hq ? 0 : i < hq + nk ? 1 : 2, h = kind == 0 ? i : kind == 1 ? i - hq : i - hq - nk;
  float *p = kind == 0 ? q + (j * hq + h) * hd : kind == 1 ? k + (j * nk + h) * hd : v + (j * nv + h) * hd;
  const float *w = kind == 0 ? qw : kind == 1 ? kw : NULL;
  const bool norm = w || (kind == 2 && vnorm), rope = kind < 2;
  float e[KN];
  if (LATE) {
    rlm_cuda_sum src = ls.qs;
    src.roff = (kind == 0 ? ls.qs.roff : kind == 1 ? ls.rk : ls.rv) + (int64_t)h * hd;
#pragma unroll
    for (int u = 0; u < KN; u++) e[u] = sum_at(src, j, lane + kWarp * u);
  } else {
#pragma unroll
    for (int u = 0; u < KN; u++) e[u] = p[lane + kWarp * u];
  }
  if (norm) {
    double ss = 0;
#pragma unroll
    for (int u = 0; u < KN; u++) ss += (double)e[u] * (double)e[u];
#pragma unroll
    for (int o = kWarp / 2; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = (float)(1.0 / sqrt(ss / hd + eps));
#pragma unroll
    for (int u = 0; u < KN; u++) {
      const float t1 = __fmul_rn(e[u], r);
      e[u] = w ? __fmul_rn(w[lane + kWarp * u], t1) : t1;
    }
  }
  if (rope) {
    const float *cj = cs + j * stride;
#pragma unroll
    for (int u = 0; u < half; u++) {
      const int d = lane + kWarp * u;
      rope_rotate(e[u], e[u + half], cj[2 * d], cj[2 * d + 1]);
    }
  }
#pragma unroll
  for (int u = 0; u < KN; u++) p[lane + kWarp * u] = e[u];
  if constexpr (!std::is_void<T>::value) {
    int row = early_row;
    const int64_t slot = EARLY ? early_slot : kind ? token_slot(c, tok_row, tok_pos, j, &row) : -1;
    if (slot < 0) return;
    T *dst = static_cast<T *>(kind == 1 ? c.k : c.v) + (((int64_t)row * c.n_kv + h) * c.cap + slot) * c.dim;
#pragma unroll
    for (int u = 0; u < KN; u++) put(dst + lane + kWarp * u, e[u]);
  }
}

template <int KN, typename T, bool EARLY>
__global__ void qkv_prep_kernel(float *q, float *k, float *v, int n, int hq, int nk, int nv, const float *qw,
                                const float *kw, bool vnorm, double eps, const float *cs, int64_t stride,
                                rlm_cuda_kv c, const int32_t *__restrict__ tok_row,
                                const int64_t *__restrict__ tok_pos) {
  if constexpr (!EARLY) pdl_enter();
  qkv_prep_row<KN, T, false, EARLY>(q, k, v, n, hq, nk, nv, qw, kw, vnorm, eps, cs, stride, c, tok_row, tok_pos,
                                    QkvSums{});
}

template <int KN, typename T, bool EARLY>
__global__ void qkv_prep_late_kernel(float *q, float *k, float *v, int n, int hq, int nk, int nv, const float *qw,
                                     const float *kw, bool vnorm, double eps, const float *cs, int64_t stride,
                                     rlm_cuda_kv c, const int32_t *__restrict__ tok_row,
                                     const int64_t *__restrict__ tok_pos, const QkvSums ls) {
  if constexpr (!EARLY) pdl_enter();
  qkv_prep_row<KN, T, true, EARLY>(q, k, v, n, hq, nk, nv, qw, kw, vnorm, eps, cs, stride, c, tok_row, tok_pos, ls);
}

/* The quantized write: MLX's affine quantization of one head's row, as
 * rlm__quantize_rows_ref computes it (quant_ref.c), every step rounded as
 * there (the divisions correctly rounded, no contraction): the row rounded
 * to the dtype first, each group's min (from FLT_MAX) and max (from 0),
 * the scale and bias of rlm__quant_group_params, codes by rlm__quant_code
 * from the unrounded f32 scale and bias, which are then stored rounded to
 * the dtype. A block of dim threads (rounded up to a warp) does K, then V. */
constexpr int kMaxWarpsRow = kMaxDim / kWarp;

template <typename T>
__device__ __forceinline__ float rounded(float x) {
  T t;
  put(&t, x);
  return to_f32(t);
}

__device__ __forceinline__ void group_params(float wmin, float wmax, int bits, float *scale, float *bias) {
  const float n_bins = (float)((1 << bits) - 1);
  float s = fmaxf(__fdiv_rn(__fsub_rn(wmax, wmin), n_bins), 1e-7f);
  const bool side = fabsf(wmin) > fabsf(wmax);
  s = side ? s : -s;
  const float edge = side ? wmin : wmax;
  const float q0 = roundf(__fdiv_rn(edge, s));
  *scale = q0 == 0.0f ? s : __fdiv_rn(edge, q0);
  *bias = q0 == 0.0f ? 0.0f : edge;
  /* A group holding an infinity (an f16 cache fed values past 65504) gets
   * inf / inf here: a NaN scale. The GPU makes that NaN as 0x7fffffff,
   * x86's SSE and AVX (the CPU quantizer) as 0xffc00000, and since the
   * inputs' NaNs never reach the scale (min and max skip them), that is
   * the only NaN the CPU stores: write its bits (H200 run, 2026-12-02). */
  if (isnan(*scale)) *scale = __uint_as_float(0xffc00000u);
}

__device__ __forceinline__ uint32_t quant_code(float x, float scale, float bias, float n_bins) {
  float v = roundf(__fdiv_rn(__fsub_rn(x, bias), scale));
  v = v < n_bins ? v : n_bins; /* NaN: the top code, as the CPU */
  return v > 0.f ? (uint32_t)v : 0u;
}

/* Row x (this thread's element xd, d = threadIdx.x < dim) quantized into
 * codes (dim * bits / 32 words) and sc, bi (dim / group each). */
template <typename T>
__device__ void quantize_row(float xd, int dim, int bits, int group, uint32_t *__restrict__ codes, T *__restrict__ sc,
                             T *__restrict__ bi) {
  __shared__ float w_min[kMaxWarpsRow], w_max[kMaxWarpsRow];
  __shared__ uint8_t code[kMaxDim];
  const int d = threadIdx.x, lane = d % kWarp, warp = d / kWarp;
  const bool in = d < dim;
  /* fminf and fmaxf drop a NaN, as the CPU's compares do */
  float mn = in ? xd : FLT_MAX, mx = in ? fmaxf(xd, 0.f) : 0.f;
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) {
    mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  }
  if (lane == 0) w_min[warp] = mn, w_max[warp] = mx;
  __syncthreads();
  if (in) {
    const int g = d / group, w0 = g * group / kWarp;
    float gmin = FLT_MAX, gmax = 0.f, s, b;
    for (int w = w0; w < w0 + group / kWarp; w++) gmin = fminf(gmin, w_min[w]), gmax = fmaxf(gmax, w_max[w]);
    group_params(gmin, gmax, bits, &s, &b);
    code[d] = (uint8_t)quant_code(xd, s, b, (float)((1 << bits) - 1));
    if (d % group == 0) put(sc + g, s), put(bi + g, b);
  }
  __syncthreads();
  for (int w = d; w < dim * bits / 32; w += blockDim.x) { /* the codes overlapping bits [32 w, 32 w + 32) */
    uint32_t word = 0;
    const int e1 = min(dim - 1, (32 * w + 31) / bits);
    for (int e = 32 * w / bits; e <= e1; e++) {
      const int sh = e * bits - 32 * w;
      word |= sh >= 0 ? (uint32_t)code[e] << sh : (uint32_t)code[e] >> -sh;
    }
    codes[w] = word;
  }
  __syncthreads(); /* the shared arrays are the next row's */
}

template <typename T>
__global__ void kv_write_q_kernel(rlm_cuda_kv c, const float *__restrict__ k, const float *__restrict__ v,
                                  const int32_t *__restrict__ tok_row, const int64_t *__restrict__ tok_pos) {
  pdl_enter();
  const int64_t j = blockIdx.x;
  const int h = blockIdx.y;
  int row;
  const int64_t slot = token_slot(c, tok_row, tok_pos, j, &row);
  if (slot < 0) return; /* the whole block: no barrier is left waiting */
  const int64_t at = ((int64_t)row * c.n_kv + h) * c.cap + slot, src = (j * c.n_kv + h) * c.dim;
  const int d = threadIdx.x, spr = c.dim / c.group;
  const float kd = d < c.dim ? rounded<T>(k[src + d]) : 0.f, vd = d < c.dim ? rounded<T>(v[src + d]) : 0.f;
  quantize_row<T>(kd, c.dim, c.k_bits, c.group, static_cast<uint32_t *>(c.k) + at * (c.dim * c.k_bits / 32),
                  static_cast<T *>(c.ks) + at * spr, static_cast<T *>(c.kb) + at * spr);
  quantize_row<T>(vd, c.dim, c.v_bits, c.group, static_cast<uint32_t *>(c.v) + at * (c.dim * c.v_bits / 32),
                  static_cast<T *>(c.vs) + at * spr, static_cast<T *>(c.vb) + at * spr);
}

/* ---- attention: the parts ------------------------------------------------- */

/* Parts a query seeing n positions uses, of the launch's n_parts (>= 1). */
__device__ __forceinline__ int parts_used(int64_t n, int n_parts, PartRule pr) {
  const int64_t want = rule_parts(n, pr);
  return want < 1 ? 1 : want < n_parts ? (int)want : n_parts;
}

/* Slot of the t-th visible position. */
__device__ __forceinline__ int64_t slot_at(const Runs &r, const rlm_cuda_kv &c, int64_t t) {
  if (t < r.sink_end) return t;
  const int64_t s = r.slot_lo + (t - r.sink_end);
  return c.ring > 0 && s >= c.cap ? s - c.ring : s;
}

/* DECODE'S PARTS ARE LATENCY-BOUND, not bandwidth-bound: a block's lane
 * groups hold two steps of keys in registers, so a 128-key part takes
 * its bytes in several dependent rounds from HBM (at 16k the kernel read
 * bf16 rows at 27% of the copy bandwidth and 4-bit ones at 8%). At its
 * start a block therefore asks the L2 for the whole of its part, K and V,
 * codes, scales and biases (at most three runs of slots: the sinks, the
 * window up to the ring's end, the rest after it wraps), so that its
 * rounds wait on the L2 rather than on HBM. Quantized rows only: a
 * lane's vector of them is 4 or 8 bytes, a bf16 row's 16, and measured
 * (Llama-8B at 16k, RINGLM_CUDA_ATTN_PREFETCH=1|0) the prefetch took
 * 4-bit KV decode from 227 to 237 tok/s but bf16 KV from 249 to 244.
 * Parts of more keys than kPrefetchKeys (prefill's, one part a query)
 * are left alone: the queries of a chunk see the same keys, and would
 * ask for them again and again. */
constexpr int64_t kPrefetchKeys = 1024;

template <typename KP, typename VP>
__device__ __forceinline__ void prefetch_part(const KP &kp, const VP &vp, const Runs &r, const rlm_cuda_kv &c,
                                              int64_t t0, int64_t t1) {
  /* run 0: sinks; 1: the window to its wrap (or end); 2: after the wrap.
   * Selected, not indexed: an array indexed by the thread would live in
   * local memory. */
  const int i = threadIdx.x;
  if (i > 2) return;
  int64_t lo = 0, hi = 0;
  const int64_t a = t0 > r.sink_end ? t0 : r.sink_end;
  if (i == 0) {
    lo = t0, hi = t1 < r.sink_end ? t1 : r.sink_end;
  } else if (a < t1) {
    const int64_t sa = slot_at(r, c, a), sb = slot_at(r, c, t1 - 1) + 1;
    if (sb > sa) lo = i == 1 ? sa : 0, hi = i == 1 ? sb : 0;
    else lo = i == 1 ? sa : c.keep, hi = i == 1 ? c.cap : sb;
  }
  if (hi > lo) kp.prefetch(lo, hi), vp.prefetch(lo, hi);
}

/* A block's keys: part `part` of what token j's query sees, [t0, t1) of
 * the runs r, in the cache of (its row, kv head kvh) = `head`; false
 * when the query uses fewer parts. */
struct Span {
  Runs r;
  int64_t t0, t1, head;
};

__device__ __forceinline__ bool part_span(const rlm_cuda_kv &c, const int32_t *tok_row, const int64_t *tok_pos,
                                          int64_t j, int part, int n_parts, PartRule pr, int kvh, Span *sp) {
  const int row = tok_row[j];
  sp->r = runs_of(c, row < 0 ? -1 : tok_pos[j]);
  const int used = parts_used(sp->r.n, n_parts, pr);
  if (part >= used) return false;
  sp->t0 = sp->r.n * part / used, sp->t1 = sp->r.n * (part + 1) / used;
  sp->head = (int64_t)(row < 0 ? 0 : row) * c.n_kv + kvh;
  return true;
}

/* Head g's weights of the block's NG partial states (exp2 of m less
 * their max, 0 where nothing was seen) into sm_w; *mx their max. Returns
 * the sum of l times weight. */
template <int NG, int GQ>
__device__ __forceinline__ float state_weights(const float (&sm_m)[NG][GQ], const float (&sm_l)[NG][GQ],
                                               float (&sm_w)[NG][GQ], int g, float *mx) {
  float m = -INFINITY, ls = 0.f;
  for (int i = 0; i < NG; i++) m = fmaxf(m, sm_m[i][g]);
  for (int i = 0; i < NG; i++) {
    const float w = m == -INFINITY ? 0.f : exp2f(sm_m[i][g] - m);
    sm_w[i][g] = w;
    ls = fmaf(sm_l[i][g], w, ls);
  }
  *mx = m;
  return ls;
}

/* state_weights by a warp, with the same bits: lane i takes states i, i
 * + 32, ..., so the max (which no order changes) and each state's weight
 * come in parallel, and lane 0 then adds the weighted sums in state
 * order, the loads unrolled ahead of the chain of FMAs. One thread
 * walking the whole block's 32 states (the one-block attention's lane
 * groups) took a shared-memory trip and an exp2f a state in series: the
 * merge's two loops cost Llama-8B's tg128 1.2% on an H100, measured by
 * leaving them out (docs/cuda-notes.md). The sum is lane 0's. */
template <int NG, int GQ>
__device__ __forceinline__ float state_weights_warp(const float (&sm_m)[NG][GQ], const float (&sm_l)[NG][GQ],
                                                    float (&sm_w)[NG][GQ], int g, int lane) {
  float m = -INFINITY;
  for (int i = lane; i < NG; i += kWarp) m = fmaxf(m, sm_m[i][g]);
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  for (int i = lane; i < NG; i += kWarp) sm_w[i][g] = m == -INFINITY ? 0.f : exp2f(sm_m[i][g] - m);
  __syncwarp();
  float ls = 0.f;
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < NG; i++) ls = fmaf(sm_l[i][g], sm_w[i][g], ls);
  }
  return ls;
}

/* Element d of head g's states' outputs, weighed by sm_w, in state order
 * (unrolled: the loads go out ahead of the FMAs). */
template <int NG, int GQ, int DIM>
__device__ __forceinline__ float weighted_o(const float (&sm_o)[NG][GQ][DIM], const float (&sm_w)[NG][GQ], int g,
                                            int d) {
  float a = 0.f;
#pragma unroll
  for (int i = 0; i < NG; i++) a = fmaf(sm_o[i][g][d], sm_w[i][g], a);
  return a;
}

/* The block's NG partial states (a lane group's or a warp's m, l and
 * unnormalised o per head, in shared memory) merged into the part's
 * entry of scratch: (token j, head h0 + g, part), heads n_parts apart. */
template <int NG, int GQ, int DIM>
__device__ __forceinline__ void write_part(const float (&sm_m)[NG][GQ], const float (&sm_l)[NG][GQ],
                                           float (&sm_w)[NG][GQ], const float (&sm_o)[NG][GQ][DIM], int ng, int dim,
                                           int64_t first, int n_parts, float *part_o, float *part_ml) {
  if (threadIdx.x < GQ) {
    const int g = threadIdx.x;
    float mx;
    const float ls = state_weights(sm_m, sm_l, sm_w, g, &mx);
    if (g < ng) part_ml[(first + (int64_t)g * n_parts) * 2] = mx, part_ml[(first + (int64_t)g * n_parts) * 2 + 1] = ls;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < GQ * DIM; idx += blockDim.x) {
    const int g = idx / DIM, d = idx % DIM;
    if (g >= ng || d >= dim) continue;
    part_o[(first + (int64_t)g * n_parts) * dim + d] = weighted_o(sm_o, sm_w, g, d);
  }
}

/* WHOLE's end (the block saw all of its query's keys): the NG partial
 * states merged as write_part merges them, then divided by the sum and
 * written to out (token j, heads h0 + g), as merge_kernel writes a query
 * of one part, and with G32 > 0 their int8 activations (the o
 * projection's x), a warp a weight group of G32 x 32 elements. */
template <int G32, int NG, int GQ, int DIM>
__device__ __forceinline__ void write_whole(const float (&sm_m)[NG][GQ], const float (&sm_l)[NG][GQ],
                                            float (&sm_w)[NG][GQ], float (&sm_o)[NG][GQ][DIM], int ng, int dim,
                                            int64_t j, int n_heads, int h0, float *out, uint8_t *q8, int q8_bits) {
  __shared__ float l_sh[GQ];
  static_assert(GQ <= kWholeWarps, "a warp a head");
  if (threadIdx.x / kWarp < GQ) {
    const int g = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const float ls = state_weights_warp(sm_m, sm_l, sm_w, g, lane);
    if (lane == 0) l_sh[g] = ls;
  }
  __syncthreads();
  /* each (g, d) is read and then rewritten by one thread: row 0 of sm_o
   * ends holding the outputs */
  for (int idx = threadIdx.x; idx < GQ * DIM; idx += blockDim.x) {
    const int g = idx / DIM, d = idx % DIM;
    if (g >= ng || d >= dim) continue;
    const float a = weighted_o(sm_o, sm_w, g, d);
    const float o = l_sh[g] > 0.f ? __fdiv_rn(a, l_sh[g]) : 0.f; /* sees nothing: zeros */
    out[(j * n_heads + h0 + g) * dim + d] = o;
    sm_o[0][g][d] = o;
  }
  if constexpr (G32 > 0) {
    __syncthreads();
    const int lane = threadIdx.x % kWarp, per = dim / (G32 * 32), cols = n_heads * dim;
    for (int u = threadIdx.x / kWarp; u < ng * per; u += blockDim.x / kWarp) {
      const int g = u / per, gi = u % per;
      float v[G32];
#pragma unroll
      for (int jj = 0; jj < G32; jj++) v[jj] = sm_o[0][g][(gi * G32 + jj) * 32 + lane];
      q8_group(v, q8_bits, cols, (int64_t)(h0 + g) * per + gi, q8 + j * q8_row_bytes(cols, G32 * 32), lane);
    }
  }
}

/* Rows of keys t = tb + u * kGroups (u < U) of this lane's group
 * (K's or V's, by P), as vectors sub + k * kLanes of each row; zeros past
 * t1 (no load) and past the row's nv vectors. */
template <typename P, int kPer, int kLanes, int kGroups, int U = kUnroll>
__device__ __forceinline__ void load_rows(typename P::Raw (&x)[U][kPer], const P &rows, const Runs &r,
                                          const rlm_cuda_kv &c, int64_t tb, int64_t t1, int sub, int nv) {
#pragma unroll
  for (int u = 0; u < U; u++) {
    const int64_t t = tb + (int64_t)u * kGroups;
    const int64_t slot = t < t1 ? slot_at(r, c, t) : 0;
#pragma unroll
    for (int k = 0; k < kPer; k++) {
      const int vec = sub + k * kLanes;
      x[u][k] = t < t1 && vec < nv ? rows.load(slot, vec) : P::zero();
    }
  }
}

/* The per-shape constants of attend_kernel: a key row of DIM (the bucket;
 * the cache's dim <= DIM, the vectors past it masked) in vectors of VE
 * elements (16 bytes dense, 8 codes quantized). */
template <int VE, int DIM, int WARPS = kAttnWarps, int U = kUnroll>
struct Shape {
  static constexpr int kU = U;                                 /* keys a lane group has in flight */
  static constexpr int kVe = VE;                               /* elements per vector   */
  static constexpr int kVecs = DIM / kVe;                      /* vectors per key row   */
  static constexpr int kLanes = kVecs < kWarp ? kVecs : kWarp; /* lanes per key         */
  static constexpr int kPer = kVecs / kLanes;                  /* vectors per lane      */
  static constexpr int kEl = kPer * kVe;                       /* elements per lane     */
  static constexpr int kGroups = kWarp / kLanes * WARPS;       /* lane groups per block */
  /* q and o of GQ heads stay in registers: 2 * GQ * kEl floats, so the
   * widest rows (16 elements a lane) take at most 4 heads a block. */
  static constexpr int kMaxGq = kEl >= 16 ? 4 : 8;
  static constexpr int kStepKeys = kGroups * U;                /* keys a block takes a round */
};

/* The row width a kernel instance is built for, the smallest of 32, 64,
 * 128, 256 and 512 that holds d: f(std::integral_constant<int, DIM>).
 * One place for launch_dim and dense_step, so that the step PartRule
 * counts is the launched kernel's. */
template <typename F>
void with_dim_bucket(int d, F &&f) {
  if (d <= 32) f(std::integral_constant<int, 32>{});
  else if (d <= 64) f(std::integral_constant<int, 64>{});
  else if (d <= 128) f(std::integral_constant<int, 128>{});
  else if (d <= 256) f(std::integral_constant<int, 256>{});
  else f(std::integral_constant<int, 512>{});
}

/* Shape's keys a round for a dense cache, or 0: quantized caches keep
 * min_keys alone (PartRule). */
template <int VE>
int dense_step(int d) {
  int step = 0;
  with_dim_bucket(d, [&](auto dim) { step = Shape<VE, decltype(dim)::value>::kStepKeys; });
  return step;
}

int step_keys(const rlm_cuda_kv &c) {
  if (c.k_bits || c.v_bits) return 0;
  return c.dtype == RLM_DTYPE_F32 ? dense_step<4>(c.dim) : dense_step<8>(c.dim);
}

/* See the header. q_per_kv query heads share a kv head; `chunks` blocks of
 * up to GQ of them cover it (blockIdx.y = kv head * chunks + chunk). */
template <typename KP, typename VP, int DIM, int GQ, int MINB, bool EARLY, int G32 = 0, bool WHOLE = false>
__global__ void __launch_bounds__(kWarp *(WHOLE ? kWholeWarps : kAttnWarps), MINB)
    attend_kernel(rlm_cuda_kv c, const float *__restrict__ q, int n_heads, int q_per_kv, int chunks, float scale2,
                  const int32_t *__restrict__ tok_row, const int64_t *__restrict__ tok_pos, int n_parts,
                  PartRule pr, int64_t prefetch_keys, float *__restrict__ part_o, float *__restrict__ part_ml,
                  float *__restrict__ out, uint8_t *__restrict__ q8, int q8_bits) {
  Span early_sp;
  bool early_live = true;
  if constexpr (EARLY) /* the pass plan: written by no kernel (merge_kernel's EARLY) */
    early_live = part_span(c, tok_row, tok_pos, blockIdx.x, blockIdx.z, n_parts, pr, blockIdx.y / chunks,
                           &early_sp);
  pdl_enter();
  static_assert(KP::kVe == VP::kVe, "K and V vectors of one width");
  using S = Shape<KP::kVe, DIM, WHOLE ? kWholeWarps : kAttnWarps, WHOLE ? kWholeUnroll : kUnroll>;
  constexpr int kU = S::kU, kVe = S::kVe, kLanes = S::kLanes, kPer = S::kPer, kEl = S::kEl, kGroups = S::kGroups;
  __shared__ float sm_o[kGroups][GQ][DIM];
  __shared__ float sm_m[kGroups][GQ], sm_l[kGroups][GQ], sm_w[kGroups][GQ];
  const int64_t j = blockIdx.x;
  const int part = blockIdx.z, kvh = blockIdx.y / chunks, g0 = (blockIdx.y % chunks) * GQ;
  const int h0 = kvh * q_per_kv + g0, ng = q_per_kv - g0 < GQ ? q_per_kv - g0 : GQ;
  const int sub = threadIdx.x % kLanes, grp = threadIdx.x / kLanes, dim = c.dim, nv = dim / kVe;

  Span sp;
  if constexpr (EARLY) {
    if (!early_live) return;
    sp = early_sp;
  } else if (!part_span(c, tok_row, tok_pos, j, part, n_parts, pr, kvh, &sp)) {
    return; /* the whole block: the merge does not read it */
  }
  const Runs &r = sp.r;
  const int64_t t0 = sp.t0, t1 = sp.t1, head = sp.head;
  const KP kp(c, Tensor{c.k, c.ks, c.kb, c.k_bits}, head);
  const VP vp(c, Tensor{c.v, c.vs, c.vb, c.v_bits}, head);
  if constexpr (KP::kPrefetch)
    if (t1 - t0 <= prefetch_keys) prefetch_part(kp, vp, r, c, t0, t1);

  /* This lane's elements: vectors sub + k * kLanes of the row. */
  float qf[GQ][kEl], o[GQ][kEl], m[GQ], l[GQ];
#pragma unroll
  for (int g = 0; g < GQ; g++) {
    m[g] = -INFINITY, l[g] = 0.f;
#pragma unroll
    for (int k = 0; k < kPer; k++)
#pragma unroll
      for (int e = 0; e < kVe; e++) {
        const int vec = sub + k * kLanes;
        qf[g][k * kVe + e] = g < ng && vec < nv ? q[(j * n_heads + h0 + g) * dim + vec * kVe + e] : 0.f;
        o[g][k * kVe + e] = 0.f;
      }
  }

  /* The trip count is the block's, not the group's: the shuffles below
   * need every lane of the warp; keys past t1 are masked. Each step's
   * loads are issued before the previous step's arithmetic (two steps of
   * K and V in registers), so the lanes always have bytes in flight. */
  constexpr int64_t kStep = S::kStepKeys; /* the step PartRule counts */
  typename KP::Raw kr[kU][kPer];
  typename VP::Raw vr[kU][kPer];
  load_rows<KP, kPer, kLanes, kGroups, kU>(kr, kp, r, c, t0 + grp, t1, sub, nv);
  load_rows<VP, kPer, kLanes, kGroups, kU>(vr, vp, r, c, t0 + grp, t1, sub, nv);
  for (int64_t base = t0; base < t1; base += kStep) {
    const int64_t tb = base + grp;
    typename KP::Raw kn[kU][kPer];
    typename VP::Raw vn[kU][kPer];
    load_rows<KP, kPer, kLanes, kGroups, kU>(kn, kp, r, c, tb + kStep, t1, sub, nv);
    load_rows<VP, kPer, kLanes, kGroups, kU>(vn, vp, r, c, tb + kStep, t1, sub, nv);
    /* Scores: this lane's part of each dot, summed over the key's lanes
     * (xor offsets below kLanes stay inside the lane group). */
    float sc[kU][GQ];
#pragma unroll
    for (int u = 0; u < kU; u++) {
      float kf[kEl];
#pragma unroll
      for (int k = 0; k < kPer; k++) kp.widen(kr[u][k], kf + k * kVe);
#pragma unroll
      for (int g = 0; g < GQ; g++) {
        float d = 0.f;
#pragma unroll
        for (int e = 0; e < kEl; e++) d = fmaf(qf[g][e], kf[e], d);
        sc[u][g] = d;
      }
    }
#pragma unroll
    for (int off = kLanes / 2; off > 0; off /= 2)
#pragma unroll
      for (int u = 0; u < kU; u++)
#pragma unroll
        for (int g = 0; g < GQ; g++) sc[u][g] += __shfl_xor_sync(0xffffffffu, sc[u][g], off);
    float vf[kU][kEl];
#pragma unroll
    for (int u = 0; u < kU; u++) {
      const bool live = tb + (int64_t)u * kGroups < t1;
#pragma unroll
      for (int g = 0; g < GQ; g++) sc[u][g] = live ? sc[u][g] * scale2 : -INFINITY;
#pragma unroll
      for (int k = 0; k < kPer; k++) vp.widen(vr[u][k], vf[u] + k * kVe);
    }
#pragma unroll
    for (int g = 0; g < GQ; g++) {
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < kU; u++) mx = fmaxf(mx, sc[u][g]);
      if (mx == -INFINITY) continue; /* nothing live yet: keep -inf, 0, 0 (no inf - inf) */
      float p[kU], ps = 0.f;
#pragma unroll
      for (int u = 0; u < kU; u++) p[u] = exp2f(sc[u][g] - mx), ps += p[u];
      /* A new running max rescales what was summed under the old one. The
       * max rarely moves after the first keys, and when it does not the
       * factor is exp2f(0) = 1: skipping the multiplies changes no bit. */
      if (mx != m[g]) {
        const float corr = exp2f(m[g] - mx);
        l[g] = fmaf(l[g], corr, ps);
#pragma unroll
        for (int e = 0; e < kEl; e++) o[g][e] *= corr;
      } else {
        l[g] += ps;
      }
      m[g] = mx;
#pragma unroll
      for (int e = 0; e < kEl; e++) {
        float a = o[g][e];
#pragma unroll
        for (int u = 0; u < kU; u++) a = fmaf(p[u], vf[u][e], a);
        o[g][e] = a;
      }
    }
#pragma unroll
    for (int u = 0; u < kU; u++)
#pragma unroll
      for (int k = 0; k < kPer; k++) kr[u][k] = kn[u][k], vr[u][k] = vn[u][k];
  }

  /* Merge the lane groups: every lane of a group holds the same m and l. */
#pragma unroll
  for (int g = 0; g < GQ; g++) {
    if (sub == 0) sm_m[grp][g] = m[g], sm_l[grp][g] = l[g];
#pragma unroll
    for (int k = 0; k < kPer; k++)
#pragma unroll
      for (int e = 0; e < kVe; e++) sm_o[grp][g][(sub + k * kLanes) * kVe + e] = o[g][k * kVe + e];
  }
  __syncthreads();
  if constexpr (WHOLE)
    write_whole<G32>(sm_m, sm_l, sm_w, sm_o, ng, dim, j, n_heads, h0, out, q8, q8_bits);
  else
    write_part(sm_m, sm_l, sm_w, sm_o, ng, dim, (j * n_heads + h0) * n_parts + part, n_parts, part_o, part_ml);
}

/* ---- attention over 4-bit K and V: a key a lane ----------------------------- */

/* WHY A SECOND KERNEL FOR 4-BIT KV. attend_kernel gives a key to a group
 * of lanes, each holding q and o of the block's heads for its slice of
 * the row (128 of its 235 registers at four heads): two blocks an SM,
 * and every lane of the group repeats the key's softmax step after three
 * shuffles of its scores. At 16k it read 4-bit rows at a few per cent of
 * the copy bandwidth, slower than bf16 rows for a third of the bytes
 * (docs/cuda-notes.md). Here lane i of a warp owns key i of the warp's
 * 32, whole:
 *
 *   1. it loads all of its key's K and V codes, scales and biases at once
 *      (a 128-element row: 4 + 4 16-byte loads, the part's bytes in one
 *      round);
 *   2. its scores for the block's GQ heads, with q read from shared memory
 *      (the same address for every lane: a broadcast), no shuffle;
 *   3. the warp's online-softmax step over its 32 keys (a max and the
 *      correction per head; each lane keeps its own sum of p);
 *   4. P x V with the lanes over dim instead: the keys' V rows and p go
 *      through the warp's tile in shared memory, lane l taking elements
 *      [l E, l E + E) (E = DIM / 32) of every key.
 *
 * The block's warps then merge in shared memory and write the part's m,
 * l and o in attend_kernel's format, so merge_kernel is unchanged. Taken
 * for 4-bit K and V of f16/bf16 scales and head dims 64, 128 and 256
 * (RINGLM_CUDA_ATTN_LANEKEY=0: attend_kernel, to compare). */
constexpr int kLkWarps = 4;

template <int DIM, int GQ, typename T>
struct alignas(16) LaneKeyTile {
  static constexpr int kV = DIM / 32;          /* 16-byte vectors of codes a row; a lane's elements in P x V */
  static constexpr int kRowW = DIM / 8 + 4;    /* words a V row takes: 16 bytes of padding, no bank conflicts */
  uint32_t v[kWarp][kRowW];                    /* codes of the warp's keys' V rows                          */
  T sb[kWarp][kV + 1][2];                      /* scale and bias of each 32-element vector (padded row)     */
  float p[kWarp][GQ];                          /* the keys' softmax weights, by head                        */
};

template <int DIM, int GQ, typename T>
union alignas(16) LaneKeyShared {
  LaneKeyTile<DIM, GQ, T> tile[kLkWarps];
  struct {
    float o[kLkWarps][GQ][DIM];
    float m[kLkWarps][GQ], l[kLkWarps][GQ], w[kLkWarps][GQ];
  } fin;
};

/* E nibbles from bit 0 of w as code * s + b. */
template <int E>
__device__ __forceinline__ void nibbles_n(uint32_t w, float s, float b, float *f) {
  if constexpr (E == 2) {
    f[0] = fmaf(code_f32(w & 0xFu), s, b);
    f[1] = fmaf(code_f32((w >> 4) & 0xFu), s, b);
  } else if constexpr (E == 4) {
    nibbles4(w, s, b, f);
  } else {
#pragma unroll
    for (int h = 0; h < E / 4; h++) nibbles4(w >> (16 * h), s, b, f + 4 * h);
  }
}

/* The E / 2 bytes of codes at byte `at` of a V row in the tile. */
template <int E>
__device__ __forceinline__ uint32_t tile_codes(const uint32_t *row, int at) {
  if constexpr (E == 8) return row[at / 4];
  else if constexpr (E == 4) return reinterpret_cast<const uint16_t *>(row)[at / 2];
  else return reinterpret_cast<const uint8_t *>(row)[at];
}

template <typename T, int DIM, int GQ, bool EARLY>
__global__ void __launch_bounds__(kWarp *kLkWarps)
    attend_q4_lanekey_kernel(rlm_cuda_kv c, const float *__restrict__ q, int n_heads, int q_per_kv, int chunks,
                             float scale2, const int32_t *__restrict__ tok_row, const int64_t *__restrict__ tok_pos,
                             int n_parts, PartRule pr, float *__restrict__ part_o,
                             float *__restrict__ part_ml) {
  Span early_sp;
  bool early_live = true;
  if constexpr (EARLY) /* the pass plan: written by no kernel (merge_kernel's EARLY) */
    early_live = part_span(c, tok_row, tok_pos, blockIdx.x, blockIdx.z, n_parts, pr, blockIdx.y / chunks,
                           &early_sp);
  pdl_enter();
  using Tile = LaneKeyTile<DIM, GQ, T>;
  constexpr int kV = Tile::kV, kE = DIM / kWarp;
  __shared__ float q_s[GQ][DIM];
  __shared__ LaneKeyShared<DIM, GQ, T> sm;
  const int64_t j = blockIdx.x;
  const int part = blockIdx.z, kvh = blockIdx.y / chunks, g0 = (blockIdx.y % chunks) * GQ;
  const int h0 = kvh * q_per_kv + g0, ng = q_per_kv - g0 < GQ ? q_per_kv - g0 : GQ;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;

  Span sp;
  if constexpr (EARLY) {
    if (!early_live) return;
    sp = early_sp;
  } else if (!part_span(c, tok_row, tok_pos, j, part, n_parts, pr, kvh, &sp)) {
    return; /* the whole block: the merge does not read it */
  }
  const Runs &r = sp.r;
  const int64_t t0 = sp.t0, t1 = sp.t1, head = sp.head;
  const int spr = DIM / c.group, gshift = __ffs(c.group / 32) - 1; /* groups a row; log2(vectors a group) */
  const uint4 *kq = static_cast<const uint4 *>(c.k) + head * c.cap * kV;
  const uint4 *vq = static_cast<const uint4 *>(c.v) + head * c.cap * kV;
  const T *ks = static_cast<const T *>(c.ks) + head * c.cap * spr, *kb = static_cast<const T *>(c.kb) + head * c.cap * spr;
  const T *vs = static_cast<const T *>(c.vs) + head * c.cap * spr, *vb = static_cast<const T *>(c.vb) + head * c.cap * spr;

  for (int i = threadIdx.x; i < GQ * DIM; i += blockDim.x) {
    const int g = i / DIM, d = i % DIM;
    q_s[g][d] = g < ng ? q[(j * n_heads + h0 + g) * DIM + d] : 0.f;
  }
  __syncthreads();

  float m[GQ], l[GQ], o[GQ][kE];
#pragma unroll
  for (int g = 0; g < GQ; g++) {
    m[g] = -INFINITY, l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < kE; e++) o[g][e] = 0.f;
  }
  Tile &tl = sm.tile[warp];
  /* The trip count is the block's; keys past t1 are masked (p = 0, zeros
   * loaded), and a warp's P x V stops at its last live key. */
  for (int64_t base = t0; base < t1; base += kLkWarps * kWarp) {
    const int64_t wb = base + (int64_t)warp * kWarp, t = wb + lane;
    const bool live = t < t1;
    const int64_t slot = live ? slot_at(r, c, t) : 0;
    uint4 kw[kV], vw[kV];
    T kss[kV], kbs[kV], vss[kV], vbs[kV];
#pragma unroll
    for (int v = 0; v < kV; v++) {
      const int64_t gi = slot * spr + (v >> gshift);
      kw[v] = live ? __ldg(kq + slot * kV + v) : make_uint4(0, 0, 0, 0);
      vw[v] = live ? __ldg(vq + slot * kV + v) : make_uint4(0, 0, 0, 0);
      kss[v] = live ? ks[gi] : T(0.f), kbs[v] = live ? kb[gi] : T(0.f);
      vss[v] = live ? vs[gi] : T(0.f), vbs[v] = live ? vb[gi] : T(0.f);
    }
    /* 2. scores */
    float s[GQ];
#pragma unroll
    for (int g = 0; g < GQ; g++) s[g] = 0.f;
#pragma unroll
    for (int v = 0; v < kV; v++) {
      const uint32_t w4[4] = {kw[v].x, kw[v].y, kw[v].z, kw[v].w};
      const float sc = to_f32(kss[v]), bi = to_f32(kbs[v]);
#pragma unroll
      for (int k = 0; k < 4; k++) {
        float f[8];
        nibbles4(w4[k], sc, bi, f);
        nibbles4(w4[k] >> 16, sc, bi, f + 4);
        const int d0 = v * 32 + k * 8;
#pragma unroll
        for (int g = 0; g < GQ; g++) {
          const float4 qa = *reinterpret_cast<const float4 *>(&q_s[g][d0]);
          const float4 qb = *reinterpret_cast<const float4 *>(&q_s[g][d0 + 4]);
          float a = s[g];
          a = fmaf(qa.x, f[0], a), a = fmaf(qa.y, f[1], a), a = fmaf(qa.z, f[2], a), a = fmaf(qa.w, f[3], a);
          a = fmaf(qb.x, f[4], a), a = fmaf(qb.y, f[5], a), a = fmaf(qb.z, f[6], a), a = fmaf(qb.w, f[7], a);
          s[g] = a;
        }
      }
    }
    /* 3. the warp's softmax step; V rows, scales and p into the tile */
#pragma unroll
    for (int v = 0; v < kV; v++) {
      *reinterpret_cast<uint4 *>(&tl.v[lane][v * 4]) = vw[v];
      tl.sb[lane][v][0] = vss[v], tl.sb[lane][v][1] = vbs[v];
    }
#pragma unroll
    for (int g = 0; g < GQ; g++) {
      const float sg = live ? s[g] * scale2 : -INFINITY;
      float mx = sg;
#pragma unroll
      for (int off = kWarp / 2; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float mn = fmaxf(m[g], mx);
      float p = 0.f;
      if (mn != -INFINITY) { /* warp-uniform */
        p = exp2f(sg - mn);
        if (mn != m[g]) { /* a new running max rescales what was summed (exp2f(-inf) = 0 at the start) */
          const float corr = exp2f(m[g] - mn);
          l[g] *= corr;
#pragma unroll
          for (int e = 0; e < kE; e++) o[g][e] *= corr;
        }
        m[g] = mn;
        l[g] += p;
      }
      tl.p[lane][g] = p;
    }
    __syncwarp();
    /* 4. P x V: lane over dim, key by key */
    const int64_t left = t1 - wb;
    const int nk = left <= 0 ? 0 : left < kWarp ? (int)left : kWarp;
    const int vec = lane * kE / 32, at = lane * kE / 2;
    for (int kk = 0; kk < nk; kk++) {
      float vf[kE];
      nibbles_n<kE>(tile_codes<kE>(tl.v[kk], at), to_f32(tl.sb[kk][vec][0]), to_f32(tl.sb[kk][vec][1]), vf);
      float p[GQ];
#pragma unroll
      for (int g = 0; g < GQ; g++) p[g] = tl.p[kk][g];
#pragma unroll
      for (int g = 0; g < GQ; g++)
#pragma unroll
        for (int e = 0; e < kE; e++) o[g][e] = fmaf(p[g], vf[e], o[g][e]);
    }
    __syncwarp(); /* the tile is rewritten next round */
  }

  /* The warps' states merged as attend_kernel merges its lane groups. */
#pragma unroll
  for (int g = 0; g < GQ; g++)
#pragma unroll
    for (int off = kWarp / 2; off > 0; off /= 2) l[g] += __shfl_xor_sync(0xffffffffu, l[g], off);
  __syncthreads(); /* every warp is done with its tile: fin reuses the bytes */
#pragma unroll
  for (int g = 0; g < GQ; g++) {
    if (lane == 0) sm.fin.m[warp][g] = m[g], sm.fin.l[warp][g] = l[g];
#pragma unroll
    for (int e = 0; e < kE; e++) sm.fin.o[warp][g][lane * kE + e] = o[g][e];
  }
  __syncthreads();
  write_part(sm.fin.m, sm.fin.l, sm.fin.w, sm.fin.o, ng, DIM, (j * n_heads + h0) * n_parts + part, n_parts, part_o,
             part_ml);
}

/* ---- attention: the merge ------------------------------------------------- */

constexpr int kMergeKeep = 16, kMergeKeepD = 2;

/* The merge's paths forced by rlm__cuda_attend_merge_paths (-1: none). */
int g_merge_keep = -1;

/* merge_kernel's KEEP, or with RINGLM_CUDA_MERGE_KEEP=0 the outputs loaded
 * after m and l for every merge, to compare. */
bool merge_keep() {
  static const bool on = env_switch("RINGLM_CUDA_MERGE_KEEP", true);
  return g_merge_keep >= 0 ? g_merge_keep != 0 : on;
}

/* The parts' outputs of this thread's dims (d = threadIdx.x + kd x
 * kMergeThreads), all loads issued at once; zeros past used and dim. */
__device__ __forceinline__ void merge_keep_load(float (&pk)[kMergeKeepD][kMergeKeep], const float *__restrict__ po,
                                                int used, int dim) {
#pragma unroll
  for (int kd = 0; kd < kMergeKeepD; kd++) {
    const int d = threadIdx.x + kd * kMergeThreads;
#pragma unroll
    for (int s = 0; s < kMergeKeep; s++) pk[kd][s] = s < used && d < dim ? po[(int64_t)s * dim + d] : 0.f;
  }
}

/* Block (token, head): the weights of the parts by one warp, then threads
 * over dim. G32 > 0: then also the head's int8 activations (the o
 * projection's x: cuda_ops.h's rlm_cuda_q8out), a warp a weight group of
 * G32 * 32 elements, from the outputs the block just wrote. */
/* EARLY: the parts used found before the PDL wait (tok_row and tok_pos
 * are the pass plan, written by no kernel), and the head's outputs handed
 * to the int8 step through shared memory rather than read back from out:
 * two round trips to memory fewer after the wait. The same bits. keep_on
 * (merge_keep): when the parts' outputs are read, the same bits again. */
template <int G32, bool EARLY>
__global__ void __launch_bounds__(kMergeThreads)
    merge_kernel(rlm_cuda_kv c, const int32_t *__restrict__ tok_row, const int64_t *__restrict__ tok_pos, int n_heads,
                 const float *__restrict__ part_o, const float *__restrict__ part_ml, int n_parts, PartRule pr,
                 int dim, bool keep_on, float *__restrict__ out, uint8_t *__restrict__ q8, int q8_bits) {
  int early_used = 0;
  if constexpr (EARLY) {
    const int64_t jj = blockIdx.x / n_heads;
    early_used = parts_used(runs_of(c, tok_row[jj] < 0 ? -1 : tok_pos[jj]).n, n_parts, pr);
  }
  pdl_enter();
  __shared__ float w[kMaxSplits];
  __shared__ float l_sh;
  __shared__ float o_sh[EARLY && G32 > 0 ? kMaxDim : 1];
  const int64_t th = blockIdx.x, j = th / n_heads;
  const int used =
      EARLY ? early_used : parts_used(runs_of(c, tok_row[j] < 0 ? -1 : tok_pos[j]).n, n_parts, pr);
  const float *ml = part_ml + th * n_parts * 2;
  const float *po = part_o + th * n_parts * dim;
  /* KEEP: the parts' outputs loaded with m and l, not after them (one
   * round trip to memory fewer after the wait), where they fit: up to
   * kMergeKeep parts (tg128's with the short-context rule), up to
   * kMergeKeepD dims a thread. tg128 on an H100: Gemma-1B 4-bit 1,087-
   * 1,094 to 1,147-1,151 tok/s, Llama-8B 4-bit 461-462 to 473-476;
   * batched S_TG level to +1% (docs/cuda-notes.md). The same bits. */
  const bool keep = keep_on && used <= kMergeKeep && dim <= kMergeKeepD * kMergeThreads;
  float pk[kMergeKeepD][kMergeKeep];
  if (keep) merge_keep_load(pk, po, used, dim);
  if (threadIdx.x < kWarp) {
    const int lane = threadIdx.x;
    float mx = -INFINITY, ls = 0.f;
    for (int s = lane; s < used; s += kWarp) mx = fmaxf(mx, ml[2 * s]);
#pragma unroll
    for (int o = kWarp / 2; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    for (int s = lane; s < used; s += kWarp) {
      const float ws = mx == -INFINITY ? 0.f : exp2f(ml[2 * s] - mx);
      w[s] = ws;
      ls = fmaf(ml[2 * s + 1], ws, ls);
    }
#pragma unroll
    for (int o = kWarp / 2; o > 0; o /= 2) ls += __shfl_xor_sync(0xffffffffu, ls, o);
    if (lane == 0) l_sh = ls;
  }
  __syncthreads();
  const float ls = l_sh;
  for (int d = threadIdx.x, di = 0; d < dim; d += kMergeThreads, di++) {
    /* eight loads in flight, not one: at 16k a head merges 128 parts, and
     * with four the merge took 32 rounds of L2 latency (32 in flight,
     * measured at depth on an H100: 1-2% slower, docs/cuda-notes.md).
     * Part s adds into a[s % 8], in the order of s, kept or loaded here. */
    float a[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (keep) {
#pragma unroll
      for (int kd = 0; kd < kMergeKeepD; kd++)
        if (kd == di)
#pragma unroll
          for (int s = 0; s < kMergeKeep; s++)
            if (s < used) a[s & 7] = fmaf(pk[kd][s], w[s], a[s & 7]);
    } else {
      int s = 0;
      for (; s + 8 <= used; s += 8)
#pragma unroll
        for (int u = 0; u < 8; u++) a[u] = fmaf(po[(int64_t)(s + u) * dim + d], w[s + u], a[u]);
      for (; s < used; s++) a[s & 7] = fmaf(po[(int64_t)s * dim + d], w[s], a[s & 7]);
    }
    const float sum = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    const float o = ls > 0.f ? __fdiv_rn(sum, ls) : 0.f; /* sees nothing: zeros */
    out[th * dim + d] = o;
    if constexpr (EARLY && G32 > 0) o_sh[d] = o;
  }
  if constexpr (G32 > 0) {
    __syncthreads(); /* the head's outputs, written by every thread */
    const int lane = threadIdx.x % kWarp, cols = n_heads * dim, h = (int)(th % n_heads);
    for (int gi = threadIdx.x / kWarp; gi < dim / (G32 * 32); gi += kMergeThreads / kWarp) {
      float v[G32];
#pragma unroll
      for (int jj = 0; jj < G32; jj++)
        v[jj] = EARLY ? o_sh[(gi * G32 + jj) * 32 + lane] : out[th * dim + (gi * G32 + jj) * 32 + lane];
      q8_group(v, q8_bits, cols, (int64_t)h * (dim / (G32 * 32)) + gi, q8 + j * q8_row_bytes(cols, G32 * 32), lane);
    }
  }
}

/* ---- dispatch ------------------------------------------------------------- */

struct AttendArgs {
  rlm_cuda_kv c;
  const float *q;
  int n_heads, q_per_kv, n;
  float scale2;
  const int32_t *tok_row;
  const int64_t *tok_pos;
  int n_parts;
  PartRule pr;
  float *part_o, *part_ml;
};

/* kPrefetchKeys, or 0 (no prefetch) with RINGLM_CUDA_ATTN_PREFETCH=0, to
 * compare (docs/cuda-notes.md). */
int64_t prefetch_keys() {
  static const int64_t keys = env_switch("RINGLM_CUDA_ATTN_PREFETCH", true) ? kPrefetchKeys : 0;
  return keys;
}

/* Blocks an SM the 4-bit kernel is compiled for: 1 (the registers it
 * wants: 235 at 4 heads, two blocks fit), or 3 with
 * RINGLM_CUDA_ATTN_Q4_BLOCKS=3 (168 registers, a few spilled), to
 * compare (docs/cuda-notes.md). */
int q4_blocks() {
  static const int b = [] {
    const char *e = getenv("RINGLM_CUDA_ATTN_Q4_BLOCKS");
    return e && atoi(e) == 3 ? 3 : 1;
  }();
  return b;
}

/* The attend_kernel instances built with EARLY too: decode's dense f16
 * and bf16 caches (4-bit ones take attend_q4_lanekey_kernel). */
template <typename KP>
constexpr bool kEarlyRows =
    std::is_same<KP, DenseRows<__half>>::value || std::is_same<KP, DenseRows<__nv_bfloat16>>::value;

template <typename KP, typename VP, int DIM, int GQ>
void launch_attend(const AttendArgs &a, cudaStream_t st) {
  const int chunks = (a.q_per_kv + GQ - 1) / GQ;
  const dim3 grid((unsigned)a.n, (unsigned)(a.c.n_kv * chunks), (unsigned)a.n_parts);
#define RLM_ATTEND(MINB, E)                                                                                         \
  launch_k(attend_kernel<KP, VP, DIM, GQ, MINB, E>, grid, kWarp * kAttnWarps, 0, st, a.c, a.q, a.n_heads,            \
           a.q_per_kv, chunks, a.scale2, a.tok_row, a.tok_pos, a.n_parts, a.pr, prefetch_keys(),         \
           a.part_o, a.part_ml, (float *)nullptr, (uint8_t *)nullptr, 0)
  if constexpr (KP::kVe == 16)
    if (q4_blocks() == 3) {
      RLM_ATTEND(3, false);
      return;
    }
  if constexpr (kEarlyRows<KP>)
    if (early_pos(a.n)) {
      RLM_ATTEND(1, true);
      return;
    }
  RLM_ATTEND(1, false);
#undef RLM_ATTEND
}

/* ---- a short context's whole attention in one block ---------------------------
 * WHY. At tg128's depths a decode token's attention is a few parts of one
 * round each, and merge_kernel after them costs a kernel boundary and a
 * round trip (3.0 us a layer of Llama-8B 4-bit on an H100, by leaving it
 * out: docs/cuda-notes.md); the merge done inside a thread-block cluster
 * instead cost as much (a barrier across SMs and reads of other blocks'
 * shared memory). Here, where the backend promises that no query of a
 * one-token pass sees more than RINGLM_CUDA_ATTN_WHOLE positions (128 by
 * default; 0: never), each query head is one block
 * of kWholeWarps warps whose lane groups hold kWholeUnroll keys each in
 * flight (128 keys a round at head dim 128, 64 at 256): its lane groups'
 * states merge in its own shared memory, and it writes the outputs and
 * their int8 activations itself; no parts, no merge kernel. Dense f16 and
 * bf16 caches, head dims 33 to 256. The sums are added in another order
 * than the two-kernel path's, so the bits differ from it. */
int64_t g_whole = -1; /* rlm__cuda_attend_whole_force's limit; -1: the variable's */

int64_t whole_positions() {
  /* 128: one round of the block's keys at head dim 128. Timed on an H100
   * (docs/cuda-notes.md, 2026-12-06, eighth): Llama-8B 4-bit +2% a step
   * while positions stay below 128 and -1% to -4.5% past them (a second,
   * third... round runs on 32 blocks where the parts had several times
   * more); Gemma-1B (head dim 256, 64 keys a round) +4% below 64, level
   * at 64-128, slower past. On an H200 the 8B's steps gain +1.9% too, but
   * a session that outgrows the limit captures its step's graph again
   * (about 3.8 ms there), which 128 faster steps about repay. */
  static const int64_t env = env_int("RINGLM_CUDA_ATTN_WHOLE", 128, 0, 1 << 20);
  return g_whole >= 0 ? g_whole : env;
}

bool whole_ok(const rlm_cuda_kv &c, int n, int64_t seen) {
  return seen > 0 && seen <= whole_positions() && n == 1 && !c.k_bits && !c.v_bits &&
         (c.dtype == RLM_DTYPE_F16 || c.dtype == RLM_DTYPE_BF16) && c.dim > 32 && c.dim <= 256;
}

template <typename T, int DIM, int G32>
void launch_whole_g(const AttendArgs &a, float *out, uint8_t *q8, int bits, cudaStream_t st) {
  using S = Shape<DenseRows<T>::kVe, DIM, kWholeWarps, kWholeUnroll>;
  static_assert(S::kMaxGq >= 1 && S::kPer == 1, "one head a block, a vector a lane (the registers)");
  const dim3 grid((unsigned)a.n, (unsigned)a.n_heads, 1u); /* GQ 1: q_per_kv chunks a kv head */
  launch_k(attend_kernel<DenseRows<T>, DenseRows<T>, DIM, 1, 1, true, G32, true>, grid, kWarp * kWholeWarps, 0, st,
           a.c, a.q, a.n_heads, a.q_per_kv, a.q_per_kv, a.scale2, a.tok_row, a.tok_pos, 1, a.pr, (int64_t)0,
           a.part_o, a.part_ml, out, q8, bits);
}

template <typename T>
void launch_whole(const AttendArgs &a, float *out, const rlm_cuda_q8out *q8, cudaStream_t st) {
  uint8_t *q = q8_scratch(q8);
  const int bits = q8 ? q8->bits : 0;
  with_dim_bucket(a.c.dim, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    if constexpr (D >= 64 && D <= 256) {
#define RLM_W(G32) launch_whole_g<T, D, G32>(a, out, q, bits, st)
      if (!q8) RLM_W(0);
      else RLM_CUDA_FOR_G32(q8->group_size, RLM_W)
#undef RLM_W
    }
  });
}

/* Query heads per block: the kv head's q_per_kv rounded up to a power of
 * two, at most the shape's kMaxGq (8, or 4 for 16 elements a lane); wider
 * groups take several blocks. */
int gq_for(int max_gq, int q_per_kv) {
  int gq = 1;
  while (gq < q_per_kv && gq < max_gq) gq *= 2;
  return gq;
}

template <typename KP, typename VP, int DIM>
void launch_gq(const AttendArgs &a, cudaStream_t st) {
  constexpr int kMax = Shape<KP::kVe, DIM>::kMaxGq;
  switch (gq_for(kMax, a.q_per_kv)) {
  case 1: launch_attend<KP, VP, DIM, 1>(a, st); break;
  case 2: launch_attend<KP, VP, DIM, 2>(a, st); break;
  case 4: launch_attend<KP, VP, DIM, 4>(a, st); break;
  default:
    if constexpr (kMax >= 8) launch_attend<KP, VP, DIM, 8>(a, st);
    break;
  }
}

template <typename KP, typename VP>
void launch_dim(const AttendArgs &a, cudaStream_t st) {
  with_dim_bucket(a.c.dim, [&](auto dim) { launch_gq<KP, VP, decltype(dim)::value>(a, st); });
}

/* attend_q4_lanekey_kernel for GQ heads a block. */
template <typename T, int DIM, int GQ>
void launch_lanekey_gq(const AttendArgs &a, cudaStream_t st) {
  const int chunks = (a.q_per_kv + GQ - 1) / GQ;
  const dim3 grid((unsigned)a.n, (unsigned)(a.c.n_kv * chunks), (unsigned)a.n_parts);
  if (early_pos(a.n))
    launch_k(attend_q4_lanekey_kernel<T, DIM, GQ, true>, grid, kWarp * kLkWarps, 0, st, a.c, a.q, a.n_heads,
             a.q_per_kv, chunks, a.scale2, a.tok_row, a.tok_pos, a.n_parts, a.pr, a.part_o, a.part_ml);
  else
    launch_k(attend_q4_lanekey_kernel<T, DIM, GQ, false>, grid, kWarp * kLkWarps, 0, st, a.c, a.q, a.n_heads,
             a.q_per_kv, chunks, a.scale2, a.tok_row, a.tok_pos, a.n_parts, a.pr, a.part_o, a.part_ml);
}

/* Up to 8 heads a block (4 at dim 256: the shared memory's 48 KB). */
template <typename T, int DIM>
void launch_lanekey(const AttendArgs &a, cudaStream_t st) {
  constexpr int kMax = DIM >= 256 ? 4 : 8;
  switch (gq_for(kMax, a.q_per_kv)) {
  case 1: launch_lanekey_gq<T, DIM, 1>(a, st); break;
  case 2: launch_lanekey_gq<T, DIM, 2>(a, st); break;
  case 4: launch_lanekey_gq<T, DIM, 4>(a, st); break;
  default:
    if constexpr (kMax >= 8) launch_lanekey_gq<T, DIM, 8>(a, st);
    break;
  }
}

/* The key-a-lane kernel for 4-bit KV, unless RINGLM_CUDA_ATTN_LANEKEY=0
 * (attend_kernel's Q4Rows, to compare: docs/cuda-notes.md). */
bool lanekey_on() {
  static const bool on = env_switch("RINGLM_CUDA_ATTN_LANEKEY", true);
  return on;
}

/* Dense caches read 16-byte vectors of their dtype; 4-bit K and V of f16
 * or bf16 scales (decode's quantized KV) a word of codes a vector; every
 * other quantized cache the generic cut at the cache's bits. */
template <typename T>
void launch_cache(const AttendArgs &a, cudaStream_t st) {
  if (!a.c.k_bits) return launch_dim<DenseRows<T>, DenseRows<T>>(a, st);
  if constexpr (sizeof(T) == 2)
    if (a.c.k_bits == 4 && a.c.v_bits == 4) {
      if (lanekey_on()) switch (a.c.dim) {
        case 64: return launch_lanekey<T, 64>(a, st);
        case 128: return launch_lanekey<T, 128>(a, st);
        case 256: return launch_lanekey<T, 256>(a, st);
        default: break;
        }
      return launch_dim<Q4Rows<T>, Q4Rows<T>>(a, st);
    }
  launch_dim<QuantRows<T>, QuantRows<T>>(a, st);
}

bool bits_ok(int b) { return b >= 2 && b <= 8 && b != 7; }

/* The geometry, and for a quantized cache its format: K and V both
 * quantized (the sessions' caches are), bits the CPU's, a group that
 * divides dim, the scale and bias arrays. */
bool cache_ok(const rlm_cuda_kv *c) {
  const bool quant = c->k_bits || c->v_bits;
  return c->k && c->v && c->n_kv >= 1 && c->dim >= 1 && c->cap >= 1 && c->keep >= 0 && c->window >= 0 &&
         (c->ring == 0 || (c->ring == c->cap - c->keep && c->ring > 0)) &&
         (!quant || (bits_ok(c->k_bits) && bits_ok(c->v_bits) && (c->group == 32 || c->group == 64 || c->group == 128) &&
                     c->dim % c->group == 0 && c->dim <= kMaxDim && c->ks && c->kb && c->vs && c->vb));
}

size_t el_size(rlm_dtype t) { return t == RLM_DTYPE_F32 ? 4 : 2; }

bool dtype_ok(rlm_dtype t) { return t == RLM_DTYPE_F32 || t == RLM_DTYPE_F16 || t == RLM_DTYPE_BF16; }

rlm_status launched(const char *fn, rlm_error *err) {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? RLM_OK : fail(err, RLM_ERR_INTERNAL, fn, "%s", cudaGetErrorString(e));
}

} // namespace

extern "C" rlm_status rlm__cuda_kv_write(const rlm_cuda_kv *c, const float *k, const float *v, const int32_t *tok_row,
                                         const int64_t *tok_pos, int n, rlm_cuda_stream st, rlm_error *err) {
  const char *fn = "rlm__cuda_kv_write";
  if (!c || !k || !v || !tok_row || !tok_pos || n < 0 || !cache_ok(c))
    return fail(err, RLM_ERR_INVALID, fn, "NULL argument, n < 0 or a bad cache (cap, ring, keep, window, bits, group)");
  if (!dtype_ok(c->dtype))
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "a cache of dtype %d is not supported (f32, f16, bf16 are)",
                (int)c->dtype);
  if (c->n_kv > 65535) return fail(err, RLM_ERR_UNSUPPORTED, fn, "%d kv heads: at most 65535", c->n_kv);
  if (n == 0) return RLM_OK;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(st);
  const dim3 grid((unsigned)n, (unsigned)c->n_kv);
  const int threads = c->dim >= 128 ? 128 : (c->dim + kWarp - 1) / kWarp * kWarp;
  if (c->k_bits) {
    const unsigned qt = (unsigned)((c->dim + kWarp - 1) / kWarp * kWarp);
    switch (c->dtype) {
    case RLM_DTYPE_F16: launch_k(kv_write_q_kernel<__half>, grid, qt, 0, s, *c, k, v, tok_row, tok_pos); break;
    case RLM_DTYPE_BF16: launch_k(kv_write_q_kernel<__nv_bfloat16>, grid, qt, 0, s, *c, k, v, tok_row, tok_pos); break;
    default: launch_k(kv_write_q_kernel<float>, grid, qt, 0, s, *c, k, v, tok_row, tok_pos); break;
    }
    return launched(fn, err);
  }
  switch (c->dtype) {
  case RLM_DTYPE_F16: launch_k(kv_write_kernel<__half>, grid, threads, 0, s, *c, k, v, tok_row, tok_pos); break;
  case RLM_DTYPE_BF16: launch_k(kv_write_kernel<__nv_bfloat16>, grid, threads, 0, s, *c, k, v, tok_row, tok_pos); break;
  default: launch_k(kv_write_kernel<float>, grid, threads, 0, s, *c, k, v, tok_row, tok_pos); break;
  }
  return launched(fn, err);
}

/* rlm__cuda_qkv_prep, or with sums (q's, then k's and v's where k is
 * given) qkv_prep_late_kernel. */
static rlm_status qkv_prep_of(float *q, float *k, float *v, int n, int hq, int hkv, int hd, const float *qw,
                              const float *kw, bool vnorm, double eps, const float *cs, int64_t stride,
                              const rlm_cuda_kv *c, const int32_t *tok_row, const int64_t *tok_pos,
                              const rlm_cuda_sum *sums, rlm_cuda_stream st, const char *fn, rlm_error *err) {
  if (!q || !cs || ((vnorm || c || (sums && k)) && (!k || !v)) || n < 0 || hq < 0 || hkv < 0 || (n > 1 && stride < hd))
    return fail(err, RLM_ERR_INVALID, fn, "NULL argument, a negative shape or stride < head dim");
  if (hd < 64 || hd > 512 || hd % 64)
    return fail(err, RLM_ERR_INVALID, fn, "head dim %d: a multiple of 64 up to 512 is needed", hd);
  if (c && (!cache_ok(c) || c->k_bits || c->v_bits || c->dim != hd || c->n_kv != hkv || !dtype_ok(c->dtype) ||
            !tok_row || !tok_pos))
    return fail(err, RLM_ERR_INVALID, fn, "the cache written must be dense, of %d heads x %d, with the pass's rows "
                "and positions", hkv, hd);
  /* late sums: v is written here too, whatever else is done to it */
  const int nk = k ? hkv : 0, nv = c || vnorm || (sums && k) ? hkv : 0;
  QkvSums ls = {};
  if (sums) {
    rlm_status rc = sum_check(&sums[0], n, hq * hd, fn, "q", err);
    for (int i = 1; !rc && k && i < 3; i++) {
      rc = sum_check(&sums[i], n, hkv * hd, fn, i == 1 ? "k" : "v", err);
      if (!rc && (sums[i].part != sums[0].part || sums[i].S != sums[0].S || sums[i].R != sums[0].R ||
                  sums[i].mR != sums[0].mR))
        rc = fail(err, RLM_ERR_INVALID, fn, "the sums of q, k and v must be of one launch");
    }
    if (rc) return rc;
    ls = {sums[0], k ? sums[1].roff : 0, k ? sums[2].roff : 0};
  }
  const int64_t rows = (int64_t)n * (hq + nk + nv);
  if (rows == 0) return RLM_OK;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(st);
  const unsigned grid = (unsigned)((rows + 3) / 4);
  const rlm_cuda_kv none = {};
  const rlm_cuda_kv &cc = c ? *c : none;
#define RLM_E(KN, T, E)                                                                                              \
  (sums ? launch_k(qkv_prep_late_kernel<KN, T, E>, grid, 4 * kWarp, 0, s, q, k, v, n, hq, nk, nv, qw, kw, vnorm,    \
                   eps, cs, stride, cc, tok_row, tok_pos, ls)                                                        \
        : launch_k(qkv_prep_kernel<KN, T, E>, grid, 4 * kWarp, 0, s, q, k, v, n, hq, nk, nv, qw, kw, vnorm, eps, cs, \
                   stride, cc, tok_row, tok_pos))
#define RLM_L(KN, T) (early_pos(n) ? RLM_E(KN, T, true) : RLM_E(KN, T, false))
#define RLM_K(KN)                                                                                                   \
  case KN:                                                                                                          \
    if (!c) RLM_L(KN, void);                                                                                        \
    else if (c->dtype == RLM_DTYPE_BF16) RLM_L(KN, __nv_bfloat16);                                                  \
    else if (c->dtype == RLM_DTYPE_F16) RLM_L(KN, __half);                                                          \
    else RLM_L(KN, float);                                                                                          \
    break;
  switch (hd / kWarp) { RLM_K(2) RLM_K(4) RLM_K(6) RLM_K(8) RLM_K(10) RLM_K(12) RLM_K(14) RLM_K(16) }
#undef RLM_K
#undef RLM_L
#undef RLM_E
  return launched(fn, err);
}

extern "C" rlm_status rlm__cuda_qkv_prep(float *q, float *k, float *v, int n, int hq, int hkv, int hd,
                                         const float *qw, const float *kw, bool vnorm, double eps, const float *cs,
                                         int64_t stride, const rlm_cuda_kv *c, const int32_t *tok_row,
                                         const int64_t *tok_pos, rlm_cuda_stream st, rlm_error *err) {
  return qkv_prep_of(q, k, v, n, hq, hkv, hd, qw, kw, vnorm, eps, cs, stride, c, tok_row, tok_pos, NULL, st,
                     "rlm__cuda_qkv_prep", err);
}

extern "C" rlm_status rlm__cuda_qkv_prep_sum(float *q, float *k, float *v, const rlm_cuda_sum *sums, int n, int hq,
                                             int hkv, int hd, const float *qw, const float *kw, bool vnorm,
                                             double eps, const float *cs, int64_t stride, const rlm_cuda_kv *c,
                                             const int32_t *tok_row, const int64_t *tok_pos, rlm_cuda_stream st,
                                             rlm_error *err) {
  const char *fn = "rlm__cuda_qkv_prep_sum";
  if (!sums) return fail(err, RLM_ERR_INVALID, fn, "NULL sums");
  return qkv_prep_of(q, k, v, n, hq, hkv, hd, qw, kw, vnorm, eps, cs, stride, c, tok_row, tok_pos, sums, st, fn, err);
}

extern "C" size_t rlm__cuda_kv_row_bytes(const rlm_cuda_kv *c, int bits) {
  return bits ? (size_t)c->dim * (size_t)bits / 8 : (size_t)c->dim * el_size(c->dtype);
}

extern "C" size_t rlm__cuda_kv_sb_bytes(const rlm_cuda_kv *c, int bits) {
  return bits && c->group > 0 ? (size_t)(c->dim / c->group) * el_size(c->dtype) : 0;
}

extern "C" void rlm__cuda_attend_merge_paths(int keep) { g_merge_keep = keep < 0 ? -1 : keep != 0; }

extern "C" size_t rlm__cuda_attend_scratch_bytes(int n, int n_heads, int dim) {
  if (n < 1 || n_heads < 1 || dim < 1) return 0;
  return (size_t)n * (size_t)n_heads * (size_t)n_splits(n, n_heads) * ((size_t)dim + 2) * sizeof(float);
}

extern "C" int64_t rlm__cuda_attend_whole_positions(void) { return whole_positions(); }

extern "C" void rlm__cuda_attend_whole_force(int64_t limit) { g_whole = limit < 0 ? -1 : limit; }

extern "C" rlm_status rlm__cuda_attend(const rlm_cuda_kv *c, const float *q, int n_heads, float scale,
                                       const int32_t *tok_row, const int64_t *tok_pos, int n, float *out, void *scratch,
                                       const rlm_cuda_q8out *q8, rlm_cuda_stream st, rlm_error *err) {
  return rlm__cuda_attend_seen(c, q, n_heads, scale, tok_row, tok_pos, n, 0, out, scratch, q8, st, err);
}

extern "C" rlm_status rlm__cuda_attend_seen(const rlm_cuda_kv *c, const float *q, int n_heads, float scale,
                                            const int32_t *tok_row, const int64_t *tok_pos, int n, int64_t seen,
                                            float *out, void *scratch, const rlm_cuda_q8out *q8, rlm_cuda_stream st,
                                            rlm_error *err) {
  const char *fn = "rlm__cuda_attend";
  if (!c || !q || !tok_row || !tok_pos || !out || !scratch || n < 0 || !cache_ok(c))
    return fail(err, RLM_ERR_INVALID, fn, "NULL argument, n < 0 or a bad cache (cap, ring, keep, window, bits, group)");
  rlm_status q8rc = q8_check(q8, (int64_t)n_heads * c->dim, fn, err);
  if (q8rc) return q8rc;
  if (q8 && c->dim % q8->group_size)
    return fail(err, RLM_ERR_INVALID, fn, "int8 activations: group %d does not divide the head dim %d",
                q8->group_size, c->dim);
  if (!dtype_ok(c->dtype))
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "a cache of dtype %d is not supported (f32, f16, bf16 are)",
                (int)c->dtype);
  if (c->dim > kMaxDim || c->dim % 8) /* 16-byte vectors of any dtype */
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "head dim %d: a multiple of 8 up to %d is needed", c->dim, kMaxDim);
  if (n_heads < c->n_kv || n_heads % c->n_kv)
    return fail(err, RLM_ERR_INVALID, fn, "%d query heads over %d kv heads", n_heads, c->n_kv);
  const int q_per_kv = n_heads / c->n_kv;
  if ((int64_t)c->n_kv * q_per_kv > 65535) /* a block per kv head and 1 or more of its query heads */
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "%d query heads: too many for one launch", n_heads);
  if ((reinterpret_cast<uintptr_t>(c->k) | reinterpret_cast<uintptr_t>(c->v)) & 15u)
    return fail(err, RLM_ERR_INVALID, fn, "K and V must be 16-byte aligned");
  if (n == 0) return RLM_OK;
  const PartRule pr = part_rule(step_keys(*c), n);
  const int parts = launch_parts(n, n_heads, c->cap, pr);
  float *part_o = static_cast<float *>(scratch);
  float *part_ml = part_o + (size_t)n * (size_t)n_heads * (size_t)parts * (size_t)c->dim;
  const AttendArgs a = {*c, q, n_heads, q_per_kv, n, scale * kLog2e, tok_row, tok_pos, parts, pr, part_o, part_ml};
  cudaStream_t s = reinterpret_cast<cudaStream_t>(st);
  if (whole_ok(*c, n, seen)) {
    if (c->dtype == RLM_DTYPE_F16) launch_whole<__half>(a, out, q8, s);
    else launch_whole<__nv_bfloat16>(a, out, q8, s);
    return launched("rlm__cuda_attend (attend_kernel, whole)", err);
  }
  switch (c->dtype) {
  case RLM_DTYPE_F16: launch_cache<__half>(a, s); break;
  case RLM_DTYPE_BF16: launch_cache<__nv_bfloat16>(a, s); break;
  default: launch_cache<float>(a, s); break;
  }
  rlm_status rc = launched("rlm__cuda_attend (attend_kernel)", err);
  if (rc) return rc;
  const unsigned blocks = (unsigned)((int64_t)n * n_heads);
  uint8_t *q8s = q8_scratch(q8);
  const int q8b = q8 ? q8->bits : 0;
#define RLM_ME(G32, E)                                                                                              \
  launch_k(merge_kernel<G32, E>, blocks, kMergeThreads, 0, s, *c, tok_row, tok_pos, n_heads, part_o, part_ml, parts, \
           pr, c->dim, merge_keep(), out, q8s, q8b)
#define RLM_M(G32) (early_pos(n) ? RLM_ME(G32, true) : RLM_ME(G32, false))
  if (!q8) RLM_M(0);
  else RLM_CUDA_FOR_G32(q8->group_size, RLM_M)
#undef RLM_M
#undef RLM_ME
  return launched("rlm__cuda_attend (merge_kernel)", err);
}
