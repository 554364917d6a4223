/* dense.c -- y = x W^T for dense weights: the linear layers of a model
 * stored in f32, f16 or bf16. W is [out][in] row-major (one row per
 * output, as safetensors stores nn.Linear), x is [m][in] and y [m][out],
 * both f32. Threaded over output rows (rlm__pool_for).
 *
 * VARIANTS. A scalar reference (portable C, the code ops.c had before),
 * AVX2+FMA+F16C and AVX-512 (F/BW/VL/DQ). The library is built for
 * baseline x86-64, so the vector functions carry target attributes and
 * are only reached after __builtin_cpu_supports (and CPUID for F16C) said
 * the CPU has the ISA; other architectures compile only the reference.
 * rlm__dense_matmul picks the widest once; rlm__dense_matmul_isa hands
 * each variant to tests/test_dense.c, which checks them all.
 *
 * DECODE (m = 1) reads every weight byte once and uses it once, so the
 * product can go no faster than memory. MV_ROWS = 8 rows at a time share
 * each load of x (8 independent FMA chains, one accumulator per row).
 * The tile's rows are adjacent in memory, but read side by side they are
 * 8 short streams that restart every tile, which the hardware
 * prefetchers follow badly (measured on Zen 4: about half the bandwidth
 * of one linear read). So while a tile computes, the region one tile (at
 * least PF_MIN bytes) further on is prefetched linearly into L2, spread
 * evenly over the tile's steps; that brings one core to about 90% of a
 * plain linear read (prefetching each row ahead, or into L1, did not).
 *
 * PREFILL (m > 1) must reuse each weight many times instead. For a block
 * of MM_MC input rows (x block in L2) and of MM_KC columns, the weights
 * are widened MM_ROWS rows at a time into an f32 stack buffer (8 KiB, L1)
 * and a register tile of MM_INS inputs x MM_ROWS rows (AVX2, with half
 * the registers: 2 rows at a time) runs over it: each widened weight
 * register is used for MM_INS inputs, each x register for every row of
 * the tile. The next rows' piece is prefetched while the tile computes.
 * Column blocks add into y.
 *
 * NUMERICS. Activations stay f32 (never rounded to the weights' dtype).
 * Weights widen exactly (bf16 by a 16-bit shift, f16 by vcvtph2ps, the
 * same values rlm__convert gives). The vector variants accumulate in f32
 * with FMA, one partial sum per lane, lanes summed at the end of a row
 * (prefill: of a column block); the reference keeps 8 partial sums per
 * 512-column piece, without FMA (-ffp-contract=off). So variants differ
 * by rounding only; tests/test_dense.c holds each within
 * 1e-5 sum_j |x_j w_j| of the product in double.
 */
#include "model/model.h"

#include <stdatomic.h>
#include <string.h>

enum {
  GRAIN = 16,     /* pool grain in rows: a multiple of every row tile    */
  REF_COLS = 512, /* reference: weights widened per piece of a row       */
  REF_ROWS = 16,  /* reference: inputs sharing one widened piece         */
};

/* One call: the pool's ranges read it from the caller's stack. */
typedef struct dense_job {
  const char *w;      /* [out][in] elements of dtype                     */
  rlm_dtype dtype;    /* f32, f16 or bf16                                */
  size_t row_bytes;   /* in * element size                               */
  int64_t out, in, m;
  const float *x;     /* [m][in]                                         */
  float *y;           /* [m][out]                                        */
} dense_job;

/* ========================================================================
 * The scalar reference.
 * ====================================================================== */

/* 8 independent partial sums: the compiler can keep them in one vector
 * register (the order is fixed, so results do not depend on the ISA). */
static float dot8(const float *x, const float *w, int64_t n) {
  float a[8] = {0};
  int64_t c = 0;
  for (; c + 8 <= n; c += 8)
    for (int k = 0; k < 8; k++) a[k] += x[c + k] * w[c + k];
  float s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  for (; c < n; c++) s += x[c] * w[c];
  return s;
}

/* Output rows [o0, o1). Each piece of a weight row is widened to f32 once
 * and used for up to REF_ROWS inputs. */
static void ref_rows(void *ctx, int64_t o0, int64_t o1, int ith, int nth) {
  const dense_job *j = ctx;
  const size_t es = rlm_dtype_size(j->dtype);
  float wf[REF_COLS];
  for (int64_t o = o0; o < o1; o++) {
    const char *w = j->w + (size_t)o * j->row_bytes;
    for (int64_t i0 = 0; i0 < j->m; i0 += REF_ROWS) {
      const int64_t ni = RLM_MIN(REF_ROWS, j->m - i0);
      float acc[REF_ROWS] = {0};
      for (int64_t c0 = 0; c0 < j->in; c0 += REF_COLS) {
        const int64_t nc = RLM_MIN(REF_COLS, j->in - c0);
        const float *wp = wf;
        if (j->dtype == RLM_DTYPE_F32) wp = (const float *)w + c0;
        else rlm__convert(w + (size_t)c0 * es, j->dtype, wf, RLM_DTYPE_F32, nc);
        for (int64_t i = 0; i < ni; i++) acc[i] += dot8(j->x + (i0 + i) * j->in + c0, wp, nc);
      }
      for (int64_t i = 0; i < ni; i++) j->y[(i0 + i) * j->out + o] = acc[i];
    }
  }
}

/* The common entry of every variant: one pool pass of `rows`. */
static void dense_run(rlm_pool *pool, rlm_range_fn rows, const void *w, rlm_dtype dtype,
                      int64_t out, int64_t in, const float *x, int64_t m, float *y) {
  if (in == 0) { /* empty sums; the blocked kernels would never store */
    memset(y, 0, (size_t)m * (size_t)out * sizeof *y);
    return;
  }
  dense_job j = {w, dtype, (size_t)in * rlm_dtype_size(dtype), out, in, m, x, y};
  rlm__pool_for(pool, out, GRAIN, (double)in * (double)m, rows, &j);
}

static void dense_scalar(rlm_pool *pool, const void *w, rlm_dtype dtype, int64_t out, int64_t in,
                         const float *x, int64_t m, float *y) {
  dense_run(pool, ref_rows, w, dtype, out, in, x, m, y);
}

#if defined(__x86_64__)

/* ========================================================================
 * Shared by the vector variants: tiles and their edges.
 * ====================================================================== */

#include <immintrin.h>

#define RLM_AVX2 __attribute__((target("avx2,fma,f16c")))
#define RLM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")))
#define RLM_INLINE inline __attribute__((always_inline))

enum {
  MV_ROWS = 8,       /* decode: weight rows sharing each x load            */
  PF_MIN = 16384,    /* decode: prefetch at least this many bytes ahead    */
  MM_ROWS = 4,       /* prefill: weight rows widened together              */
  MM_INS = 4,        /* prefill: input rows of the register tile           */
  MM_KC = 512,       /* prefill: columns per block (MM_ROWS of them in f32:
                        8 KiB, stay in L1 while every input passes)        */
  MM_MC = 64,        /* prefill: input rows per block (64 x MM_KC x 4 B =
                        128 KiB of x, stays in L2 across the rows)         */
};

/* The rows of a tile starting at output o; those past the nr real ones
 * alias the last real one (same lines: no extra memory traffic), so the
 * kernels need no row edge cases and their results are dropped. */
static void tile_rows(const dense_job *j, int64_t o, int nr, int n, const char **r) {
  for (int i = 0; i < n; i++) r[i] = j->w + (size_t)(o + RLM_MIN(i, nr - 1)) * j->row_bytes;
}

/* The same for input rows i.. of x, from column k0. */
static void tile_inputs(const dense_job *j, int64_t i, int ni, int64_t k0, const float **xr) {
  for (int t = 0; t < MM_INS; t++) xr[t] = j->x + (i + RLM_MIN(t, ni - 1)) * j->in + k0;
}

/* y[i..i+ni][o..o+nr] = s (the first column block) or += s (the others). */
static void tile_store(const dense_job *j, int64_t i, int ni, int64_t o, int nr, bool first,
                       const float s[MM_INS][MM_ROWS]) {
  for (int t = 0; t < ni; t++) {
    float *y = j->y + (i + t) * j->out + o;
    for (int r = 0; r < nr; r++) y[r] = first ? s[t][r] : y[r] + s[t][r];
  }
}

/* Asks for the cache lines of [p, p + n) into L2 (L1 is too small for
 * what is in flight). Prefetches never fault, so running past the matrix
 * is harmless; the address is formed as an integer for that reason. */
static RLM_INLINE void prefetch_span(const char *p, size_t off, size_t n) {
  for (size_t b = 0; b < n; b += 64) _mm_prefetch((const char *)((uintptr_t)p + off + b), _MM_HINT_T1);
}

/* Decode's prefetch plan: while the tile at w + o * row_bytes computes,
 * the tile `ahead` bytes further on is asked for, `per` bytes per step of
 * `lanes` columns (whole lines, so the steps cover the tile). */
typedef struct mv_prefetch {
  size_t ahead, per;
} mv_prefetch;

static mv_prefetch mv_prefetch_plan(const dense_job *j, int lanes) {
  const size_t tile = MV_ROWS * j->row_bytes;
  const size_t steps = (size_t)RLM_MAX(1, j->in / lanes);
  mv_prefetch p;
  p.ahead = tile * RLM_MAX((size_t)1, (PF_MIN + tile - 1) / tile);
  p.per = ((tile + steps - 1) / steps + 63) & ~(size_t)63;
  return p;
}

/* ========================================================================
 * AVX2 + FMA + F16C: 8 lanes.
 * ====================================================================== */

/* w[k..k+8) widened to f32. */
static RLM_AVX2 RLM_INLINE __m256 w8_avx2(const char *w, int64_t k, rlm_dtype dt) {
  if (dt == RLM_DTYPE_F32) return _mm256_loadu_ps((const float *)w + k);
  const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + k));
  if (dt == RLM_DTYPE_F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* The first n < 8 of w[k..), zeros after: copied out so that nothing past
 * the row is read. */
static RLM_AVX2 RLM_INLINE __m256 w8_part_avx2(const char *w, int64_t k, int64_t n, rlm_dtype dt) {
  const size_t es = dt == RLM_DTYPE_F32 ? 4 : 2;
  _Alignas(32) char b[32] = {0};
  memcpy(b, w + (size_t)k * es, (size_t)n * es);
  return w8_avx2(b, 0, dt);
}

/* x[0..n), n <= 8, zeros after (a masked load never touches the rest). */
static RLM_AVX2 RLM_INLINE __m256 x8_part_avx2(const float *x, int64_t n) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_maskload_ps(x, _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), lane));
}

/* (sum a, sum b, sum c, sum d). */
static RLM_AVX2 RLM_INLINE __m128 hsum4_avx2(__m256 a, __m256 b, __m256 c, __m256 d) {
  /* per 128-bit half: ab = [a0+a2, b0+b2, a1+a3, b1+b3], cd alike */
  const __m256 ab = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
  const __m256 cd = _mm256_add_ps(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
  const __m256 t = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* Decode: s[i] = r[i] . x for the MV_ROWS rows of the tile at r[0],
 * prefetching as pf says. */
static RLM_AVX2 RLM_INLINE void mv_tile_avx2(const char *const *r, rlm_dtype dt, const float *x,
                                             int64_t in, mv_prefetch pf, float *s) {
  __m256 a[MV_ROWS];
  for (int i = 0; i < MV_ROWS; i++) a[i] = _mm256_setzero_ps();
  size_t pos = pf.ahead;
  int64_t k = 0;
  for (; k + 8 <= in; k += 8, pos += pf.per) {
    const __m256 xv = _mm256_loadu_ps(x + k);
    prefetch_span(r[0], pos, pf.per);
    for (int i = 0; i < MV_ROWS; i++) a[i] = _mm256_fmadd_ps(w8_avx2(r[i], k, dt), xv, a[i]);
  }
  if (k < in) {
    const __m256 xv = x8_part_avx2(x + k, in - k);
    for (int i = 0; i < MV_ROWS; i++)
      a[i] = _mm256_fmadd_ps(w8_part_avx2(r[i], k, in - k, dt), xv, a[i]);
  }
  _mm_storeu_ps(s, hsum4_avx2(a[0], a[1], a[2], a[3]));
  _mm_storeu_ps(s + 4, hsum4_avx2(a[4], a[5], a[6], a[7]));
}

static RLM_AVX2 RLM_INLINE void mv_rows_avx2(const dense_job *j, int64_t o0, int64_t o1,
                                             rlm_dtype dt) {
  const mv_prefetch pf = mv_prefetch_plan(j, 8);
  for (int64_t o = o0; o < o1; o += MV_ROWS) {
    const int nr = (int)RLM_MIN(MV_ROWS, o1 - o);
    const char *r[MV_ROWS];
    float s[MV_ROWS];
    tile_rows(j, o, nr, MV_ROWS, r);
    mv_tile_avx2(r, dt, j->x, j->in, pf, s);
    for (int i = 0; i < nr; i++) j->y[o + i] = s[i];
  }
}

/* Prefill: rows r[0..nr) columns [k0, k0 + nc) into wf[MM_ROWS][MM_KC],
 * zero-padded to a multiple of 8 (the tile reads whole registers). */
static RLM_AVX2 RLM_INLINE void widen_avx2(const char *const *r, int nr, int64_t k0, int64_t nc,
                                           rlm_dtype dt, float *wf) {
  for (int i = 0; i < nr; i++) {
    float *d = wf + i * MM_KC;
    int64_t k = 0;
    for (; k + 8 <= nc; k += 8) _mm256_store_ps(d + k, w8_avx2(r[i], k0 + k, dt));
    if (k < nc) _mm256_store_ps(d + k, w8_part_avx2(r[i], k0 + k, nc - k, dt));
  }
}

/* s[t][c], s[t][c + 1] = xr[t] . w0, xr[t] . w1 over nc columns: 4 inputs
 * x 2 rows, 8 accumulators (of 16 registers). */
static RLM_AVX2 void mm_tile_avx2(const float *const *xr, const float *w0, const float *w1,
                                  int64_t nc, float s[MM_INS][MM_ROWS], int c) {
  __m256 a[MM_INS][2];
  for (int t = 0; t < MM_INS; t++) a[t][0] = a[t][1] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= nc; k += 8) {
    const __m256 v0 = _mm256_load_ps(w0 + k), v1 = _mm256_load_ps(w1 + k);
    for (int t = 0; t < MM_INS; t++) {
      __m256 xv = _mm256_loadu_ps(xr[t] + k);
      __asm__("" : "+x"(xv)); /* one load: gcc would fold it into each FMA */
      a[t][0] = _mm256_fmadd_ps(v0, xv, a[t][0]);
      a[t][1] = _mm256_fmadd_ps(v1, xv, a[t][1]);
    }
  }
  if (k < nc) {
    const __m256 v0 = _mm256_load_ps(w0 + k), v1 = _mm256_load_ps(w1 + k);
    for (int t = 0; t < MM_INS; t++) {
      const __m256 xv = x8_part_avx2(xr[t] + k, nc - k);
      a[t][0] = _mm256_fmadd_ps(v0, xv, a[t][0]);
      a[t][1] = _mm256_fmadd_ps(v1, xv, a[t][1]);
    }
  }
  float h[2][4];
  _mm_storeu_ps(h[0], hsum4_avx2(a[0][0], a[0][1], a[1][0], a[1][1]));
  _mm_storeu_ps(h[1], hsum4_avx2(a[2][0], a[2][1], a[3][0], a[3][1]));
  for (int t = 0; t < MM_INS; t++) {
    s[t][c] = h[t / 2][(t % 2) * 2];
    s[t][c + 1] = h[t / 2][(t % 2) * 2 + 1];
  }
}

static RLM_AVX2 RLM_INLINE void mm_rows_avx2(const dense_job *j, int64_t o0, int64_t o1,
                                             rlm_dtype dt) {
  const size_t es = dt == RLM_DTYPE_F32 ? 4 : 2;
  _Alignas(64) float wf[MM_ROWS * MM_KC];
  for (int64_t i0 = 0; i0 < j->m; i0 += MM_MC) {
    const int64_t i1 = RLM_MIN(j->m, i0 + MM_MC);
    for (int64_t k0 = 0; k0 < j->in; k0 += MM_KC) {
      const int64_t nc = RLM_MIN(MM_KC, j->in - k0);
      for (int64_t o = o0; o < o1; o += MM_ROWS) {
        const int nr = (int)RLM_MIN(MM_ROWS, o1 - o);
        const char *r[MM_ROWS];
        tile_rows(j, o, nr, MM_ROWS, r);
        widen_avx2(r, nr, k0, nc, dt, wf);
        for (int i = 0; i < MM_ROWS; i++)
          prefetch_span(r[i], MM_ROWS * j->row_bytes + (size_t)k0 * es, (size_t)nc * es);
        for (int64_t i = i0; i < i1; i += MM_INS) {
          const int ni = (int)RLM_MIN(MM_INS, i1 - i);
          const float *xr[MM_INS];
          float s[MM_INS][MM_ROWS];
          tile_inputs(j, i, ni, k0, xr);
          mm_tile_avx2(xr, wf, wf + RLM_MIN(1, nr - 1) * MM_KC, nc, s, 0);
          if (nr > 2) mm_tile_avx2(xr, wf + 2 * MM_KC, wf + (nr - 1) * MM_KC, nc, s, 2);
          tile_store(j, i, ni, o, nr, k0 == 0, s);
        }
      }
    }
  }
}

/* The pool's range function: one instance per dtype, so the widening is
 * chosen at compile time. */
static RLM_AVX2 RLM_INLINE void rows_dt_avx2(const dense_job *j, int64_t o0, int64_t o1,
                                             rlm_dtype dt) {
  if (j->m == 1) mv_rows_avx2(j, o0, o1, dt);
  else mm_rows_avx2(j, o0, o1, dt);
}

static RLM_AVX2 void rows_avx2(void *ctx, int64_t o0, int64_t o1, int ith, int nth) {
  const dense_job *j = ctx;
  switch (j->dtype) {
  case RLM_DTYPE_F16: rows_dt_avx2(j, o0, o1, RLM_DTYPE_F16); break;
  case RLM_DTYPE_BF16: rows_dt_avx2(j, o0, o1, RLM_DTYPE_BF16); break;
  default: rows_dt_avx2(j, o0, o1, RLM_DTYPE_F32); break;
  }
}

/* ========================================================================
 * AVX-512 (F, BW, VL, DQ) + F16C: 16 lanes, masked edges.
 * ====================================================================== */

/* The lanes of the first n of 16 (n >= 16: all). */
static RLM_AVX512 RLM_INLINE __mmask16 mask16(int64_t n) {
  return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}

/* w[k..k+16), lanes outside mk zero and not read, widened to f32. */
static RLM_AVX512 RLM_INLINE __m512 w16_avx512(const char *w, int64_t k, __mmask16 mk,
                                               rlm_dtype dt) {
  if (dt == RLM_DTYPE_F32) return _mm512_maskz_loadu_ps(mk, (const float *)w + k);
  const __m256i h = _mm256_maskz_loadu_epi16(mk, (const uint16_t *)w + k);
  if (dt == RLM_DTYPE_F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* (sum a, sum b, sum c, sum d). */
static RLM_AVX512 RLM_INLINE __m128 hsum4_avx512(__m512 a, __m512 b, __m512 c, __m512 d) {
  /* per 128-bit quarter: ab = [a0+a2, b0+b2, a1+a3, b1+b3], cd alike */
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512 t = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(t), _mm512_extractf32x8_ps(t, 1));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* Decode: s[i] = r[i] . x for the MV_ROWS rows of the tile at r[0],
 * prefetching as pf says. The full-mask loads compile to plain ones; only
 * the last partial register is masked. */
static RLM_AVX512 RLM_INLINE void mv_tile_avx512(const char *const *r, rlm_dtype dt,
                                                 const float *x, int64_t in, mv_prefetch pf,
                                                 float *s) {
  __m512 a[MV_ROWS];
  for (int i = 0; i < MV_ROWS; i++) a[i] = _mm512_setzero_ps();
  size_t pos = pf.ahead;
  int64_t k = 0;
  for (; k + 16 <= in; k += 16, pos += pf.per) {
    const __m512 xv = _mm512_loadu_ps(x + k);
    prefetch_span(r[0], pos, pf.per);
    for (int i = 0; i < MV_ROWS; i++)
      a[i] = _mm512_fmadd_ps(w16_avx512(r[i], k, 0xffff, dt), xv, a[i]);
  }
  if (k < in) {
    const __mmask16 mk = mask16(in - k);
    const __m512 xv = _mm512_maskz_loadu_ps(mk, x + k);
    for (int i = 0; i < MV_ROWS; i++) a[i] = _mm512_fmadd_ps(w16_avx512(r[i], k, mk, dt), xv, a[i]);
  }
  _mm_storeu_ps(s, hsum4_avx512(a[0], a[1], a[2], a[3]));
  _mm_storeu_ps(s + 4, hsum4_avx512(a[4], a[5], a[6], a[7]));
}

static RLM_AVX512 RLM_INLINE void mv_rows_avx512(const dense_job *j, int64_t o0, int64_t o1,
                                                 rlm_dtype dt) {
  const mv_prefetch pf = mv_prefetch_plan(j, 16);
  for (int64_t o = o0; o < o1; o += MV_ROWS) {
    const int nr = (int)RLM_MIN(MV_ROWS, o1 - o);
    const char *r[MV_ROWS];
    float s[MV_ROWS];
    tile_rows(j, o, nr, MV_ROWS, r);
    mv_tile_avx512(r, dt, j->x, j->in, pf, s);
    for (int i = 0; i < nr; i++) j->y[o + i] = s[i];
  }
}

/* Prefill: rows r[0..nr) columns [k0, k0 + nc) into wf[MM_ROWS][MM_KC],
 * zero-padded to a multiple of 16 (the tile reads whole registers). */
static RLM_AVX512 RLM_INLINE void widen_avx512(const char *const *r, int nr, int64_t k0,
                                               int64_t nc, rlm_dtype dt, float *wf) {
  for (int i = 0; i < nr; i++)
    for (int64_t k = 0; k < nc; k += 16)
      _mm512_store_ps(wf + i * MM_KC + k, w16_avx512(r[i], k0 + k, mask16(nc - k), dt));
}

/* s[t][r] = xr[t] . wr[r] over nc columns: 4 x 4 accumulators. Every
 * step masks its x loads (all lanes but in the last step; the widened
 * weights past nc are the zero padding), so the tail needs no second copy
 * of the loop, which would make gcc keep the accumulators in memory. */
static RLM_AVX512 void mm_tile_avx512(const float *const *xr, const float *const *wr,
                                      int64_t nc, float s[MM_INS][MM_ROWS]) {
  __m512 a[MM_INS][MM_ROWS];
  for (int t = 0; t < MM_INS; t++)
    for (int r = 0; r < MM_ROWS; r++) a[t][r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < nc; k += 16) {
    const __mmask16 mk = mask16(nc - k);
    __m512 w[MM_ROWS];
    for (int r = 0; r < MM_ROWS; r++) w[r] = _mm512_load_ps(wr[r] + k);
    for (int t = 0; t < MM_INS; t++) {
      const __m512 xv = _mm512_maskz_loadu_ps(mk, xr[t] + k);
      for (int r = 0; r < MM_ROWS; r++) a[t][r] = _mm512_fmadd_ps(w[r], xv, a[t][r]);
    }
  }
  for (int t = 0; t < MM_INS; t++)
    _mm_storeu_ps(s[t], hsum4_avx512(a[t][0], a[t][1], a[t][2], a[t][3]));
}

static RLM_AVX512 RLM_INLINE void mm_rows_avx512(const dense_job *j, int64_t o0, int64_t o1,
                                                 rlm_dtype dt) {
  const size_t es = dt == RLM_DTYPE_F32 ? 4 : 2;
  _Alignas(64) float wf[MM_ROWS * MM_KC];
  for (int64_t i0 = 0; i0 < j->m; i0 += MM_MC) {
    const int64_t i1 = RLM_MIN(j->m, i0 + MM_MC);
    for (int64_t k0 = 0; k0 < j->in; k0 += MM_KC) {
      const int64_t nc = RLM_MIN(MM_KC, j->in - k0);
      for (int64_t o = o0; o < o1; o += MM_ROWS) {
        const int nr = (int)RLM_MIN(MM_ROWS, o1 - o);
        const char *r[MM_ROWS];
        const float *wr[MM_ROWS];
        tile_rows(j, o, nr, MM_ROWS, r);
        widen_avx512(r, nr, k0, nc, dt, wf);
        for (int i = 0; i < MM_ROWS; i++) {
          prefetch_span(r[i], MM_ROWS * j->row_bytes + (size_t)k0 * es, (size_t)nc * es);
          wr[i] = wf + RLM_MIN(i, nr - 1) * MM_KC;
        }
        for (int64_t i = i0; i < i1; i += MM_INS) {
          const int ni = (int)RLM_MIN(MM_INS, i1 - i);
          const float *xr[MM_INS];
          float s[MM_INS][MM_ROWS];
          tile_inputs(j, i, ni, k0, xr);
          mm_tile_avx512(xr, wr, nc, s);
          tile_store(j, i, ni, o, nr, k0 == 0, s);
        }
      }
    }
  }
}

static RLM_AVX512 RLM_INLINE void rows_dt_avx512(const dense_job *j, int64_t o0, int64_t o1,
                                                 rlm_dtype dt) {
  if (j->m == 1) mv_rows_avx512(j, o0, o1, dt);
  else mm_rows_avx512(j, o0, o1, dt);
}

static RLM_AVX512 void rows_avx512(void *ctx, int64_t o0, int64_t o1, int ith, int nth) {
  const dense_job *j = ctx;
  switch (j->dtype) {
  case RLM_DTYPE_F16: rows_dt_avx512(j, o0, o1, RLM_DTYPE_F16); break;
  case RLM_DTYPE_BF16: rows_dt_avx512(j, o0, o1, RLM_DTYPE_BF16); break;
  default: rows_dt_avx512(j, o0, o1, RLM_DTYPE_F32); break;
  }
}

/* ========================================================================
 * Which variants this CPU runs.
 * ====================================================================== */

static void dense_avx2(rlm_pool *pool, const void *w, rlm_dtype dtype, int64_t out, int64_t in,
                       const float *x, int64_t m, float *y) {
  dense_run(pool, rows_avx2, w, dtype, out, in, x, m, y);
}

static void dense_avx512(rlm_pool *pool, const void *w, rlm_dtype dtype, int64_t out, int64_t in,
                         const float *x, int64_t m, float *y) {
  dense_run(pool, rows_avx512, w, dtype, out, in, x, m, y);
}

#endif /* __x86_64__ */

/* ========================================================================
 * Selection.
 * ====================================================================== */

rlm_dense_fn rlm__dense_matmul_isa(const char *isa) {
  if (!strcmp(isa, "scalar")) return dense_scalar;
#if defined(__x86_64__)
  if (!strcmp(isa, "avx2")) return rlm__cpu_avx2() ? dense_avx2 : NULL;
  if (!strcmp(isa, "avx512")) return rlm__cpu_avx512() ? dense_avx512 : NULL;
#endif
  return NULL;
}

void rlm__dense_matmul(rlm_pool *pool, const void *w, rlm_dtype dtype, int64_t out, int64_t in,
                       const float *x, int64_t m, float *y) {
  static _Atomic(rlm_dense_fn) chosen; /* zero: not chosen yet */
  rlm_dense_fn fn = atomic_load(&chosen);
  if (!fn) {
    fn = rlm__dense_matmul_isa("avx512");
    if (!fn) fn = rlm__dense_matmul_isa("avx2");
    if (!fn) fn = dense_scalar;
    atomic_store(&chosen, fn);
  }
  fn(pool, w, dtype, out, in, x, m, y);
}
