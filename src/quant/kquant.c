/* kquant.c -- GGUF block products: the scalar definitions (dequantization,
 * the f32 product, the int8 activations and their product) and the
 * dispatch over a pool. kquant.h has the block layouts, the scratch layout
 * and the error contract; kquant_x86.c the SIMD kernels tested against
 * these. Written from ggml's block descriptions (ggml-common.h), not
 * copied.
 */
#include "quant/kquant.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kquant.c reads ggml blocks in place: little-endian hosts only"
#endif

int rlm__kq_block(rlm_kq_type t) { return t == RLM_KQ_Q8_0 || t == RLM_KQ_Q5_0 ? 32 : 256; }

int rlm__kq_block_bytes(rlm_kq_type t) {
  switch (t) {
  case RLM_KQ_Q4_K: return (int)sizeof(rlm_block_q4_k);
  case RLM_KQ_Q6_K: return (int)sizeof(rlm_block_q6_k);
  case RLM_KQ_Q5_0: return (int)sizeof(rlm_block_q5_0);
  case RLM_KQ_Q5_K: return (int)sizeof(rlm_block_q5_k);
  default: return (int)sizeof(rlm_block_q8_0);
  }
}

size_t rlm__kq_row_bytes(rlm_kq_type t, int64_t cols) {
  return (size_t)(cols / rlm__kq_block(t)) * (size_t)rlm__kq_block_bytes(t);
}

/* ---- dequantization: the definition of the values ------------------------- */

/* Q4_K block -> 256 floats: (d sc_j) q - (dmin m_j), ggml's two products
 * and one subtraction (no FMA: the build has -ffp-contract=off). */
static void dequant_q4_k(const uint8_t *blk, float *out) {
  const float d = rlm__kq_f16(blk), dmin = rlm__kq_f16(blk + 2);
  const uint8_t *qs = blk + 16;
  for (int j = 0; j < 8; j++) {
    int sc, mn;
    rlm__kq_scale_min(blk + 4, j, &sc, &mn);
    const float d1 = d * (float)sc, m1 = dmin * (float)mn;
    for (int l = 0; l < 32; l++) {
      const int q = qs[32 * (j / 2) + l] >> (4 * (j & 1)) & 15;
      out[32 * j + l] = d1 * (float)q - m1;
    }
  }
}

/* Q5_K's 5-bit code of element e (0..255): Q4_K's nibble, bit j of qh[l]. */
static int q5_k_code(const uint8_t *blk, int e) {
  const int j = e / 32, l = e % 32;
  return (blk[48 + 32 * (j / 2) + l] >> (4 * (j & 1)) & 15) | (blk[16 + l] >> j & 1) << 4;
}

/* Q5_K block -> 256 floats: (d sc_j) q - (dmin m_j), as Q4_K. */
static void dequant_q5_k(const uint8_t *blk, float *out) {
  const float d = rlm__kq_f16(blk), dmin = rlm__kq_f16(blk + 2);
  for (int j = 0; j < 8; j++) {
    int sc, mn;
    rlm__kq_scale_min(blk + 4, j, &sc, &mn);
    const float d1 = d * (float)sc, m1 = dmin * (float)mn;
    for (int l = 0; l < 32; l++) out[32 * j + l] = d1 * (float)q5_k_code(blk, 32 * j + l) - m1;
  }
}

/* Q6_K's 6-bit code of element e (0..255) of a block. */
static int q6_code(const uint8_t *blk, int e) {
  const int h = e / 128, i = e % 128 / 32, l = e % 32;
  const int lo = blk[64 * h + 32 * (i & 1) + l] >> (4 * (i >> 1)) & 15;
  const int hi = blk[128 + 32 * h + l] >> (2 * i) & 3;
  return lo | hi << 4;
}

/* Q6_K block -> 256 floats: (d sc_k) (q - 32). */
static void dequant_q6_k(const uint8_t *blk, float *out) {
  const float d = rlm__kq_f16(blk + 208);
  const int8_t *sc = (const int8_t *)(blk + 192);
  for (int e = 0; e < 256; e++) out[e] = d * (float)sc[e / 16] * (float)(q6_code(blk, e) - 32);
}

/* Q8_0 block -> 32 floats: d q. */
static void dequant_q8_0(const uint8_t *blk, float *out) {
  const float d = rlm__kq_f16(blk);
  for (int e = 0; e < 32; e++) out[e] = (float)(int8_t)blk[2 + e] * d;
}

/* Q5_0's 5-bit code of element l (0..31) of a block. */
static int q5_0_code(const uint8_t *blk, int l) {
  const uint32_t qh = (uint32_t)blk[2] | (uint32_t)blk[3] << 8 | (uint32_t)blk[4] << 16 | (uint32_t)blk[5] << 24;
  return (blk[6 + l % 16] >> (4 * (l / 16)) & 15) | (int)(qh >> l & 1) << 4;
}

/* Q5_0 block -> 32 floats: (q - 16) d (exact: 5 bits times an f16). */
static void dequant_q5_0(const uint8_t *blk, float *out) {
  const float d = rlm__kq_f16(blk);
  for (int l = 0; l < 32; l++) out[l] = (float)(q5_0_code(blk, l) - 16) * d;
}

static void dequant_block(rlm_kq_type t, const uint8_t *blk, float *out) {
  switch (t) {
  case RLM_KQ_Q4_K: dequant_q4_k(blk, out); break;
  case RLM_KQ_Q6_K: dequant_q6_k(blk, out); break;
  case RLM_KQ_Q5_0: dequant_q5_0(blk, out); break;
  case RLM_KQ_Q5_K: dequant_q5_k(blk, out); break;
  default: dequant_q8_0(blk, out); break;
  }
}

void rlm__kq_dequant_row(const rlm_kqmat *w, int64_t row, float *out) {
  const int bl = rlm__kq_block(w->type), bb = rlm__kq_block_bytes(w->type);
  const uint8_t *p = (const uint8_t *)w->blocks + (size_t)row * rlm__kq_row_bytes(w->type, w->cols);
  for (int64_t b = 0; b < w->cols / bl; b++) dequant_block(w->type, p + b * bb, out + b * bl);
}

/* ---- the f32 product ------------------------------------------------------- */

/* Rows [o0, o1): each block dequantized, then y[i][o] += w x in element
 * order for every input (f32, no FMA). */
static void mm_ref(const rlm_kqmat *w, const float *x, int64_t m, int64_t o0, int64_t o1, float *y) {
  const int bl = rlm__kq_block(w->type), bb = rlm__kq_block_bytes(w->type);
  const size_t rb = rlm__kq_row_bytes(w->type, w->cols);
  float buf[256];
  for (int64_t o = o0; o < o1; o++) {
    const uint8_t *p = (const uint8_t *)w->blocks + (size_t)o * rb;
    for (int64_t i = 0; i < m; i++) y[i * w->rows + o] = 0;
    for (int64_t b = 0; b < w->cols / bl; b++) {
      dequant_block(w->type, p + b * bb, buf);
      for (int64_t i = 0; i < m; i++) {
        const float *xi = x + i * w->cols + b * bl;
        float acc = y[i * w->rows + o];
        for (int e = 0; e < bl; e++) acc += buf[e] * xi[e];
        y[i * w->rows + o] = acc;
      }
    }
  }
}

void rlm__kq_matmul_ref(const rlm_kqmat *w, const float *x, int64_t m, float *y) {
  mm_ref(w, x, m, 0, w->rows, y);
}

/* ---- int8 activations -------------------------------------------------- */

size_t rlm__kq_q8_stride(int64_t cols) {
  const size_t n = 3 * (size_t)cols + (size_t)(cols / 32) * sizeof(float);
  return (n + 63) & ~(size_t)63;
}

size_t rlm__kq_matmul_q8_bytes(int64_t m, int64_t cols) { return (size_t)m * rlm__kq_q8_stride(cols); }

/* x[i] + x[i + 16], then halves of 8, 4, 2, 1: a tree one 512-bit (or two
 * 256-bit) register adds reproduce. */
float rlm__kq_block_sum(const float *x) {
  float v[16];
  for (int i = 0; i < 16; i++) v[i] = x[i] + x[i + 16];
  for (int n = 8; n >= 1; n /= 2)
    for (int i = 0; i < n; i++) v[i] = v[i] + v[i + n];
  return v[0];
}

void rlm__kq_quantize_ref(rlm_kq_type t, const float *x, int64_t cols, void *row) {
  int8_t *xq = row;
  float *dx16 = rlm__kq_dx16(row, cols), *aux = rlm__kq_aux(row, cols), *dd = rlm__kq_d(row, cols);
  for (int64_t b = 0; b < cols / 32; b++) {
    const float *p = x + b * 32;
    float amax = 0;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(p[i]));
    const float d = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
    const int64_t s = rlm__kq_xblock(t, b);
    int isum[2] = {0, 0}; /* per half of 16 */
    int q[32];
    for (int i = 0; i < 32; i++) {
      q[i] = (int)lrintf(p[i] * inv);
      xq[rlm__kq_xpos(t, cols, 32 * b + i)] = (int8_t)q[i];
      isum[i / 16] += q[i];
    }
    dd[b] = d;
    if (t == RLM_KQ_Q5_0) {
      const int32_t corr = -16 * (isum[0] + isum[1]);
      dx16[b] = d;
      memcpy(aux + b, &corr, 4);
      continue;
    }
    for (int l = 0; l < 8; l++) dx16[s / 2 * 16 + s % 2 * 8 + l] = d;
    float *a = aux + b / 8 * 16;
    if (t == RLM_KQ_Q4_K || t == RLM_KQ_Q5_K) {
      if (b % 8 == 0) memset(a, 0, 8 * sizeof *a);
      a[8 + b % 8] = -rlm__kq_block_sum(p);
    } else if (t == RLM_KQ_Q6_K) {
      for (int k = 0; k < 2; k++) a[2 * (b % 8) + k] = d * (float)(-32 * isum[k]);
    } else {
      for (int l = 0; l < 8; l++) aux[b / 2 * 16 + b % 2 * 8 + l] = d * (float)(-16 * (isum[0] + isum[1]));
    }
  }
}

/* Element e's code in a scratch row for weights of type t. */
static int xcode(rlm_kq_type t, const void *row, int64_t cols, int64_t e) {
  return ((const int8_t *)row)[rlm__kq_xpos(t, cols, e)];
}

/* One output of the int8 product (the formulas of kquant.h), in order. */
static float dot_q4_k(const uint8_t *p, int64_t cols, const void *xr) {
  const float *dd = rlm__kq_d((void *)xr, cols), *aux = rlm__kq_aux((void *)xr, cols);
  float acc = 0;
  for (int64_t sb = 0; sb < cols / 256; sb++) {
    const uint8_t *blk = p + sb * 144;
    const float d = rlm__kq_f16(blk), dmin = rlm__kq_f16(blk + 2);
    for (int j = 0; j < 8; j++) {
      int sc, mn;
      rlm__kq_scale_min(blk + 4, j, &sc, &mn);
      int32_t isum = 0;
      for (int l = 0; l < 32; l++)
        isum += (blk[16 + 32 * (j / 2) + l] >> (4 * (j & 1)) & 15) * xcode(RLM_KQ_Q4_K, xr, cols, sb * 256 + 32 * j + l);
      acc += d * (float)sc * (dd[sb * 8 + j] * (float)isum);
      acc += dmin * (float)mn * aux[sb * 16 + 8 + j];
    }
  }
  return acc;
}

static float dot_q5_k(const uint8_t *p, int64_t cols, const void *xr) {
  const float *dd = rlm__kq_d((void *)xr, cols), *aux = rlm__kq_aux((void *)xr, cols);
  float acc = 0;
  for (int64_t sb = 0; sb < cols / 256; sb++) {
    const uint8_t *blk = p + sb * 176;
    const float d = rlm__kq_f16(blk), dmin = rlm__kq_f16(blk + 2);
    for (int j = 0; j < 8; j++) {
      int sc, mn;
      rlm__kq_scale_min(blk + 4, j, &sc, &mn);
      int32_t isum = 0;
      for (int l = 0; l < 32; l++) isum += q5_k_code(blk, 32 * j + l) * xcode(RLM_KQ_Q5_K, xr, cols, sb * 256 + 32 * j + l);
      acc += d * (float)sc * (dd[sb * 8 + j] * (float)isum);
      acc += dmin * (float)mn * aux[sb * 16 + 8 + j];
    }
  }
  return acc;
}

static float dot_q6_k(const uint8_t *p, int64_t cols, const void *xr) {
  const float *dd = rlm__kq_d((void *)xr, cols);
  float acc = 0;
  for (int64_t sb = 0; sb < cols / 256; sb++) {
    const uint8_t *blk = p + sb * 210;
    const float d = rlm__kq_f16(blk + 208);
    for (int k = 0; k < 16; k++) {
      int32_t isum = 0;
      for (int l = 0; l < 16; l++)
        isum += (q6_code(blk, 16 * k + l) - 32) * xcode(RLM_KQ_Q6_K, xr, cols, sb * 256 + 16 * k + l);
      acc += d * (float)((const int8_t *)blk)[192 + k] * (dd[sb * 8 + k / 2] * (float)isum);
    }
  }
  return acc;
}

static float dot_q8_0(const uint8_t *p, int64_t cols, const void *xr) {
  const float *dd = rlm__kq_d((void *)xr, cols);
  float acc = 0;
  for (int64_t b = 0; b < cols / 32; b++) {
    const uint8_t *blk = p + b * 34;
    int32_t isum = 0;
    for (int l = 0; l < 32; l++) isum += (int8_t)blk[2 + l] * xcode(RLM_KQ_Q8_0, xr, cols, b * 32 + l);
    acc += rlm__kq_f16(blk) * (dd[b] * (float)isum);
  }
  return acc;
}

static float dot_q5_0(const uint8_t *p, int64_t cols, const void *xr) {
  const float *dd = rlm__kq_d((void *)xr, cols);
  float acc = 0;
  for (int64_t b = 0; b < cols / 32; b++) {
    const uint8_t *blk = p + b * 22;
    int32_t isum = 0;
    for (int l = 0; l < 32; l++) isum += (q5_0_code(blk, l) - 16) * xcode(RLM_KQ_Q5_0, xr, cols, b * 32 + l);
    acc += rlm__kq_f16(blk) * (dd[b] * (float)isum);
  }
  return acc;
}

static void mm_q8_ref(const rlm_kqmat *w, const void *scratch, size_t stride, int64_t m, int64_t o0, int64_t o1,
                      float *y) {
  const size_t rb = rlm__kq_row_bytes(w->type, w->cols);
  for (int64_t o = o0; o < o1; o++) {
    const uint8_t *p = (const uint8_t *)w->blocks + (size_t)o * rb;
    for (int64_t i = 0; i < m; i++) {
      const void *xr = (const char *)scratch + (size_t)i * stride;
      float v;
      switch (w->type) {
      case RLM_KQ_Q4_K: v = dot_q4_k(p, w->cols, xr); break;
      case RLM_KQ_Q6_K: v = dot_q6_k(p, w->cols, xr); break;
      case RLM_KQ_Q5_0: v = dot_q5_0(p, w->cols, xr); break;
      case RLM_KQ_Q5_K: v = dot_q5_k(p, w->cols, xr); break;
      default: v = dot_q8_0(p, w->cols, xr); break;
      }
      y[i * w->rows + o] = v;
    }
  }
}

void rlm__kq_matmul_q8_ref(const rlm_kqmat *w, const float *x, int64_t m, void *scratch, float *y) {
  const size_t stride = rlm__kq_q8_stride(w->cols);
  for (int64_t i = 0; i < m; i++) rlm__kq_quantize_ref(w->type, x + i * w->cols, w->cols, (char *)scratch + i * stride);
  mm_q8_ref(w, scratch, stride, m, 0, w->rows, y);
}

const rlm_kq_kernels rlm__kq_kernels_ref = {"ref", rlm__kq_quantize_ref, mm_ref, mm_q8_ref};

/* ---- dispatch ---------------------------------------------------------- */

const rlm_kq_kernels *rlm__kq_kernels(void) {
  static _Atomic(const rlm_kq_kernels *) chosen = NULL;
  const rlm_kq_kernels *k = atomic_load(&chosen);
  if (!k) {
    k = rlm__kq_kernels_avx512();
    if (!k) k = rlm__kq_kernels_avx2();
    if (!k) k = &rlm__kq_kernels_ref;
    atomic_store(&chosen, k);
  }
  return k;
}

typedef struct kq_job {
  const rlm_kq_kernels *k;
  const rlm_kqmat *w;
  const float *x;
  void *scratch;
  size_t stride;
  int64_t m;
  float *y;
} kq_job;

static void mm_range(void *ctx, int64_t o0, int64_t o1, int ith, int nth) {
  const kq_job *j = ctx;
  j->k->mm(j->w, j->x, j->m, o0, o1, j->y);
}

static void mm_q8_range(void *ctx, int64_t o0, int64_t o1, int ith, int nth) {
  const kq_job *j = ctx;
  j->k->mm_q8(j->w, j->scratch, j->stride, j->m, o0, o1, j->y);
}

/* Inputs [i0, i1) quantized into their scratch rows. */
static void quantize_range(void *ctx, int64_t i0, int64_t i1, int ith, int nth) {
  const kq_job *j = ctx;
  const int64_t cols = j->w->cols;
  for (int64_t i = i0; i < i1; i++) j->k->quantize(j->w->type, j->x + i * cols, cols, (char *)j->scratch + i * j->stride);
}

void rlm__kq_matmul_with(const rlm_kq_kernels *k, rlm_pool *pool, const rlm_kqmat *w, const float *x,
                         int64_t m, float *y) {
  kq_job j = {k, w, x, NULL, 0, m, y};
  rlm__pool_for(pool, w->rows, 16, (double)w->cols * (double)m, mm_range, &j);
}

void rlm__kq_matmul_q8_with(const rlm_kq_kernels *k, rlm_pool *pool, const rlm_kqmat *w, const float *x,
                            int64_t m, void *scratch, float *y) {
  kq_job j = {k, w, x, scratch, rlm__kq_q8_stride(w->cols), m, y};
  if (m == 1) quantize_range(&j, 0, 1, 0, 1);
  else rlm__pool_for(pool, m, 1, (double)w->cols, quantize_range, &j);
  rlm__pool_for(pool, w->rows, 16, (double)w->cols * (double)m, mm_q8_range, &j);
}

void rlm__kq_matmul(rlm_pool *pool, const rlm_kqmat *w, const float *x, int64_t m, float *y) {
  rlm__kq_matmul_with(rlm__kq_kernels(), pool, w, x, m, y);
}

void rlm__kq_matmul_q8(rlm_pool *pool, const rlm_kqmat *w, const float *x, int64_t m, void *scratch, float *y) {
  rlm__kq_matmul_q8_with(rlm__kq_kernels(), pool, w, x, m, scratch, y);
}
