/* attn_rows.cuh -- a KV cache's rows as the attention kernels read them
 * (attn.cu's flash-decoding kernel, attn_tc.cu's tensor-core tiles): one
 * vector of a slot's row at a time, widened to floats, for dense rows of
 * f32/f16/bf16 and for MLX-affine rows of 2-8 bits; and what the kernels
 * that write a dense row share (attn.cu's qkv_prep, qgemv_q8.cu's q, k, v
 * product with RoPE): a token's slot, a value in the cache's dtype. */
#ifndef RLM_CUDA_ATTN_ROWS_CUH
#define RLM_CUDA_ATTN_ROWS_CUH

#include "cuda_ops.h"

#include "common.cuh"

namespace rlm_cuda {

/* ---- where a query's keys are ---------------------------------------------- */

/* The slot of position p (attn.cu's top comment). */
__device__ __forceinline__ int64_t slot_of(int64_t p, int64_t ring, int keep) {
  return ring == 0 || p < keep ? p : keep + (p - keep) % ring;
}

/* The slot token j writes in its row (*row), or -1: a negative row or
 * position, or a plain cache's position at or past cap, has no slot, and
 * the token is not written (a padded token of a fixed-size pass). */
__device__ __forceinline__ int64_t token_slot(const rlm_cuda_kv &c, const int32_t *tok_row, const int64_t *tok_pos,
                                              int64_t j, int *row) {
  const int64_t p = tok_pos[j];
  *row = tok_row[j];
  if (p < 0 || *row < 0) return -1;
  const int64_t slot = slot_of(p, c.ring, c.keep);
  return slot < c.cap ? slot : -1;
}

/* *p = v in the cache's dtype, rounded to nearest even (rlm__convert). */
__device__ __forceinline__ void put(float *p, float v) { *p = v; }
/* A NaN keeps the CPU's bits (rlm__f32_to_f16, rlm__f32_to_bf16: quiet,
 * the payload's top bits), so a cache fed an overflow is the CPU's too. */
__device__ __forceinline__ void put(__half *p, float v) {
  const uint32_t u = __float_as_uint(v);
  *p = isnan(v) ? __ushort_as_half((unsigned short)(((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x3ffu)))
                : __float2half_rn(v);
}
__device__ __forceinline__ void put(__nv_bfloat16 *p, float v) {
  const uint32_t u = __float_as_uint(v);
  *p = isnan(v) ? __ushort_as_bfloat16((unsigned short)((u >> 16) | 0x40u)) : __float2bfloat16_rn(v);
}

/* The positions a query at qp sees (none when qp < 0), as the two runs of
 * attn.cu's header. The clamps only matter for a cache that breaks its
 * contract: a plain one never reads past cap, a ring never more than ring
 * window positions (so every slot read is inside the row). */
struct Runs {
  int64_t sink_end, lo, n; /* [0, sink_end) then [lo, lo + n - sink_end) */
  int64_t slot_lo;         /* slot of lo                                 */
};

__device__ __forceinline__ Runs runs_of(const rlm_cuda_kv &c, int64_t qp) {
  Runs r = {0, 0, 0, 0};
  if (qp < 0) return r;
  int64_t hi = qp + 1, lo = c.window > 0 ? qp - (c.window - c.keep) + 1 : 0;
  if (c.ring == 0 && hi > c.cap) hi = c.cap;
  if (c.ring > 0 && lo < hi - c.ring) lo = hi - c.ring;
  lo = lo < 0 ? 0 : lo > hi ? hi : lo;
  r.sink_end = c.keep < lo ? c.keep : lo;
  r.lo = lo;
  r.n = r.sink_end + hi - lo;
  r.slot_lo = slot_of(lo, c.ring, c.keep);
  return r;
}

/* ---- a cache's rows as the attention kernel reads them --------------------- */

/* K or V of one (row, kv head): load(slot, vec) fetches vector `vec` (kVe
 * consecutive elements) of a slot's row, widen() turns it into floats.
 * DenseRows reads 16 bytes of the dtype; Q4Rows and QuantRows a vector
 * of codes with the scale and bias of their group (16 and 8 divide every
 * group size), widened to code * scale + bias (attn.h). */
struct Tensor {
  const void *data, *scales, *biases;
  int bits;
};

/* Slots [s0, s1) of a quantized row array into the L2: its codes (wpr
 * words a slot), scales and biases (spr a slot). */
template <typename T>
__device__ __forceinline__ void prefetch_codes(const uint32_t *w, int wpr, const T *sc, const T *bi, int spr,
                                               int64_t s0, int64_t s1) {
  prefetch_l2(w, s0 * wpr * 4, s1 * wpr * 4);
  prefetch_l2(sc, s0 * spr * (int64_t)sizeof(T), s1 * spr * (int64_t)sizeof(T));
  prefetch_l2(bi, s0 * spr * (int64_t)sizeof(T), s1 * spr * (int64_t)sizeof(T));
}

template <typename T>
struct DenseRows {
  static constexpr int kVe = 16 / (int)sizeof(T);
  static constexpr bool kPrefetch = false; /* see prefetch_part */
  using Raw = uint4;
  const T *p;
  int dim;
  __device__ __forceinline__ DenseRows(const rlm_cuda_kv &c, const Tensor &t, int64_t head)
      : p(static_cast<const T *>(t.data) + head * c.cap * c.dim), dim(c.dim) {}
  __device__ __forceinline__ Raw load(int64_t slot, int vec) const {
    return __ldg(reinterpret_cast<const uint4 *>(p + slot * dim) + vec);
  }
  __device__ __forceinline__ static Raw zero() { return make_uint4(0, 0, 0, 0); }
  __device__ __forceinline__ void widen(const Raw &r, float *f) const { widen16<T>(r, f); }
};

/* Codes to floats without I2F (a quarter-rate conversion on Hopper,
 * which made the widening the largest cost of a quantized key): a code
 * c < 2^23 placed in the mantissa of 2^23 is the float 2^23 + c, and one
 * subtraction gives c exactly. A nibble at bit 4i (i < 4) is OR-ed in
 * place under 2^(23 - 4i), whose mantissa's unit is 2^-4i: the float is
 * 2^(23 - 4i) + c again, without a shift. Then fmaf(c, s, b): the same
 * bits as fmaf((float)c, s, b). */
__device__ __forceinline__ float code_f32(uint32_t code) { return __uint_as_float(code | 0x4B000000u) - 8388608.0f; }

/* Nibbles 0..3 of w (bits 0-15) as c * s + b into f[0..3]. */
__device__ __forceinline__ void nibbles4(uint32_t w, float s, float b, float *f) {
  f[0] = fmaf(__uint_as_float((w & 0x000Fu) | 0x4B000000u) - 0x1p23f, s, b);
  f[1] = fmaf(__uint_as_float((w & 0x00F0u) | 0x49000000u) - 0x1p19f, s, b);
  f[2] = fmaf(__uint_as_float((w & 0x0F00u) | 0x47000000u) - 0x1p15f, s, b);
  f[3] = fmaf(__uint_as_float((w & 0xF000u) | 0x45000000u) - 0x1p11f, s, b);
}

/* 4-bit rows: 16 codes (two words, one 8-byte load) a vector, so a key of
 * 128 elements takes 8 lanes, not 16: half the shuffles and half the
 * lanes repeating each key's softmax step, for twice the registers. */
template <typename T>
struct Q4Rows {
  static constexpr int kVe = 16;
  static constexpr bool kPrefetch = true;
  struct Raw {
    uint32_t lo, hi;
    float s, b;
  };
  const uint32_t *w;
  const T *sc, *bi;
  int wpr, spr, gshift;
  __device__ __forceinline__ Q4Rows(const rlm_cuda_kv &c, const Tensor &t, int64_t head) {
    wpr = c.dim / 8, spr = c.dim / c.group, gshift = __ffs(c.group / kVe) - 1;
    w = static_cast<const uint32_t *>(t.data) + head * c.cap * wpr;
    sc = static_cast<const T *>(t.scales) + head * c.cap * spr;
    bi = static_cast<const T *>(t.biases) + head * c.cap * spr;
  }
  __device__ __forceinline__ Raw load(int64_t slot, int vec) const {
    const uint2 x = __ldg(reinterpret_cast<const uint2 *>(w + slot * wpr) + vec); /* rows are 16-byte multiples */
    const int64_t g = slot * spr + (vec >> gshift);
    return Raw{x.x, x.y, to_f32(sc[g]), to_f32(bi[g])};
  }
  __device__ __forceinline__ static Raw zero() { return Raw{0u, 0u, 0.f, 0.f}; }
  __device__ __forceinline__ void prefetch(int64_t s0, int64_t s1) const { prefetch_codes(w, wpr, sc, bi, spr, s0, s1); }
  __device__ __forceinline__ void widen(const Raw &r, float *f) const {
    const uint32_t w[4] = {r.lo, r.lo >> 16, r.hi, r.hi >> 16};
#pragma unroll
    for (int k = 0; k < 4; k++) nibbles4(w[k], r.s, r.b, f + 4 * k);
  }
};

/* Any bits 2..8 (the cache's, at run time): 8 codes a vector, cut out of
 * up to three words (they start at bit 8 vec bits, a multiple of 8). */
template <typename T>
struct QuantRows {
  static constexpr int kVe = 8;
  static constexpr bool kPrefetch = true;
  struct Raw {
    uint32_t lo, hi; /* the 8 codes from bit 0 */
    float s, b;
  };
  const uint32_t *w;
  const T *sc, *bi;
  int bits, wpr, spr, gshift; /* words, groups a row; log2(vectors a group) */
  __device__ __forceinline__ QuantRows(const rlm_cuda_kv &c, const Tensor &t, int64_t head) : bits(t.bits) {
    wpr = c.dim * bits / 32, spr = c.dim / c.group, gshift = __ffs(c.group / kVe) - 1;
    w = static_cast<const uint32_t *>(t.data) + head * c.cap * wpr;
    sc = static_cast<const T *>(t.scales) + head * c.cap * spr;
    bi = static_cast<const T *>(t.biases) + head * c.cap * spr;
  }
  __device__ __forceinline__ Raw load(int64_t slot, int vec) const {
    const uint32_t *row = w + slot * wpr;
    const int bit = vec * kVe * bits, w0 = bit >> 5, off = bit & 31;
    const uint32_t a = __ldg(row + w0), b = w0 + 1 < wpr ? __ldg(row + w0 + 1) : 0u;
    const uint32_t c = w0 + 2 < wpr ? __ldg(row + w0 + 2) : 0u;
    uint64_t v = ((uint64_t)b << 32 | a) >> off;
    if (off) v |= (uint64_t)c << (64 - off);
    const int64_t g = slot * spr + (vec >> gshift);
    return Raw{(uint32_t)v, (uint32_t)(v >> 32), to_f32(sc[g]), to_f32(bi[g])};
  }
  __device__ __forceinline__ static Raw zero() { return Raw{0u, 0u, 0.f, 0.f}; }
  __device__ __forceinline__ void prefetch(int64_t s0, int64_t s1) const { prefetch_codes(w, wpr, sc, bi, spr, s0, s1); }
  __device__ __forceinline__ void widen(const Raw &r, float *f) const {
    const uint64_t v = (uint64_t)r.hi << 32 | r.lo, mask = (1u << bits) - 1u;
#pragma unroll
    for (int i = 0; i < kVe; i++) f[i] = fmaf(code_f32((uint32_t)((v >> (i * bits)) & mask)), r.s, r.b);
  }
};

} // namespace rlm_cuda

#endif /* RLM_CUDA_ATTN_ROWS_CUH */
