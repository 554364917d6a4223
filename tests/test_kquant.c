/* test_kquant.c -- products over GGUF blocks (src/quant/kquant.c and
 * kquant_x86.c) against an independent per-element dequantizer written
 * here from ggml's block layouts, and against model/gguf_quant.c's exact
 * conversion of the same blocks.
 *
 * Random blocks of Q4_K, Q6_K, Q8_0, Q5_0 and Q5_K (random codes and sub-block scales;
 * f16 d / dmin among them zero, negative, subnormal, large and +-65504),
 * stored at an address that is only 2-byte aligned. Checked:
 *   - rlm__kq_dequant_row == the independent dequantizer, value for value,
 *     and == the GGUF conversion's weights, code * s + b in f32 (as
 *     numbers: a zero's sign may differ, see gguf_quant.h), the blocks
 *     read in place from the image (zero-copy);
 *   - for every kernel table this CPU has (ref, avx2, avx512vnni) and m =
 *     1, 2, 3, 5, 8, 13, 64: the f32 product against the product in double
 *     of the dequantized weights within the sequential-sum rounding bound
 *     (cols + 16) u sum |w x|; the quantizer's bytes equal the reference
 *     quantizer's; the int8 product against the exact one within kquant.h's
 *     bound, and against the scalar int8 reference to float rounding;
 *   - the f32 kernels' dequantization value for value (the product with
 *     unit vectors is the weights);
 *   - over a 2-thread pool, the same bytes as inline;
 *   - the bound is tight enough to catch a layout bug: weights with their
 *     nibbles (Q4_K, Q6_K, Q5_0; Q5_K also its fifth bits shifted by a
 *     sub-block) or block halves (Q8_0) swapped give exact
 *     products outside it for nearly every output.
 */
#include "model/gguf_quant.h"
#include "quant/kquant.h"
#include "gguf_write.h"
#include "test.h"

enum { N_TYPES = 5 };                           /* RLM_KQ_Q4_K .. RLM_KQ_Q5_K */
enum { KQ_GW_Q5_0 = 6, KQ_GW_Q5_K = 13 };       /* ggml's type numbers (gguf_write.h lacks them) */

/* ---- random blocks ----------------------------------------------------------- */

static uint16_t rand_f16(uint64_t *seed) {
  const uint64_t r = t_rng_next(seed);
  switch (r % 20) {
  case 0: return 0;
  case 1: return (uint16_t)(1 + (r >> 8) % 0x3ff) | (uint16_t)((r >> 20 & 1) << 15); /* subnormal */
  case 2: return rlm__f32_to_f16(t_rng_float(seed, -3000.0f, 3000.0f));
  case 3: return (r >> 9 & 1) ? 0xfbff : 0x7bff; /* -+65504 */
  default: return rlm__f32_to_f16(t_rng_normal(seed) * 0.02f);
  }
}

static void put_f16(uint8_t *p, uint16_t h) { p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8); }

static const char *type_name(rlm_kq_type t) {
  static const char *const names[N_TYPES] = {"Q4_K", "Q6_K", "Q8_0", "Q5_0", "Q5_K"};
  return names[t];
}

/* A matrix of random blocks at a 2-byte (not 4-byte) aligned address;
 * *base is what to free. */
static rlm_kqmat rand_mat(rlm_kq_type t, int64_t rows, int64_t cols, uint64_t *seed, uint8_t **base) {
  const size_t n = (size_t)rows * rlm__kq_row_bytes(t, cols);
  *base = xmalloc(n + 8);
  uint8_t *p = *base + 2;
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)t_rng_next(seed);
  const int bb = rlm__kq_block_bytes(t);
  for (size_t b = 0; b < n / (size_t)bb; b++) {
    uint8_t *blk = p + b * (size_t)bb;
    if (t == RLM_KQ_Q4_K || t == RLM_KQ_Q5_K) put_f16(blk, rand_f16(seed)), put_f16(blk + 2, rand_f16(seed));
    else if (t == RLM_KQ_Q6_K) put_f16(blk + 208, rand_f16(seed));
    else put_f16(blk, rand_f16(seed)); /* Q8_0, Q5_0 */
  }
  return (rlm_kqmat){p, t, rows, cols};
}

/* ---- the independent dequantizer ------------------------------------------- */

static float f16v(const uint8_t *p) { return rlm__f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* 6-bit scale (which 0) or min (which 1) of Q4_K sub-block j. */
static int k6(const uint8_t *s, int j, int which) {
  if (j < 4) return s[j + 4 * which] & 63;
  const int low = which ? s[j + 4] >> 4 : s[j + 4] & 15;
  return low + 16 * (s[j - 4 + 4 * which] >> 6);
}

/* Element e of a block: the value w, the part a of kquant.h's bound (the
 * weight without Q4_K's min), and the scale of its sub-block. */
typedef struct elem {
  float w, a, s;
} elem;

static elem element(rlm_kq_type t, const uint8_t *blk, int e) {
  elem r;
  if (t == RLM_KQ_Q4_K || t == RLM_KQ_Q5_K) { /* Q5_K: qs after 32 qh bytes, bit j of qh[l] on top */
    const int j = e / 32, l = e % 32, k5 = t == RLM_KQ_Q5_K;
    const int q = (blk[16 + 32 * k5 + 32 * (j / 2) + l] >> (j % 2 ? 4 : 0) & 15) + (k5 ? 16 * (blk[16 + l] >> j & 1) : 0);
    const float d1 = f16v(blk) * (float)k6(blk + 4, j, 0), m1 = f16v(blk + 2) * (float)k6(blk + 4, j, 1);
    r.a = d1 * (float)q, r.w = r.a - m1, r.s = fabsf(d1) + fabsf(m1);
  } else if (t == RLM_KQ_Q6_K) {
    const int h = e / 128, i = e % 128 / 32, l = e % 32;
    const uint8_t qlb = blk[64 * h + 32 * (i % 2) + l];
    const int lo = i < 2 ? qlb & 15 : qlb >> 4, hi = blk[128 + 32 * h + l] >> (2 * i) & 3;
    const float d = f16v(blk + 208) * (float)(int8_t)blk[192 + e / 16];
    r.w = r.a = d * (float)(lo + 16 * hi - 32), r.s = fabsf(d);
  } else if (t == RLM_KQ_Q5_0) { /* qs[e % 16] nibble e / 16, fifth bit: bit e of the LE u32 at blk + 2 */
    const int lo = blk[6 + e % 16] >> (e < 16 ? 0 : 4) & 15, hi = blk[2 + e / 8] >> (e % 8) & 1;
    r.w = r.a = f16v(blk) * (float)(lo + 16 * hi - 16), r.s = fabsf(f16v(blk));
  } else {
    r.w = r.a = f16v(blk) * (float)(int8_t)blk[2 + e], r.s = fabsf(f16v(blk));
  }
  return r;
}

static elem element_at(const rlm_kqmat *w, int64_t o, int64_t c) {
  const int bl = rlm__kq_block(w->type), bb = rlm__kq_block_bytes(w->type);
  const uint8_t *row = (const uint8_t *)w->blocks + (size_t)o * rlm__kq_row_bytes(w->type, w->cols);
  return element(w->type, row + c / bl * bb, (int)(c % bl));
}

static bool same_number(float a, float b) { return a == b || (isnan(a) && isnan(b)); }

TEST(row_bytes) {
  CHECK_EQ(rlm__kq_row_bytes(RLM_KQ_Q4_K, 6912), 27 * 144);
  CHECK_EQ(rlm__kq_row_bytes(RLM_KQ_Q6_K, 2048), 8 * 210);
  CHECK_EQ(rlm__kq_row_bytes(RLM_KQ_Q8_0, 1152), 36 * 34);
  CHECK_EQ(rlm__kq_row_bytes(RLM_KQ_Q5_0, 1152), 36 * 22);
  CHECK_EQ(rlm__kq_block(RLM_KQ_Q5_0), 32);
  CHECK_EQ(rlm__kq_row_bytes(RLM_KQ_Q5_K, 2048), 8 * 176);
  CHECK_EQ(rlm__kq_q8_stride(256) % 64, 0);
}

TEST(dequant_matches_independent) {
  uint64_t seed = 1;
  for (int t = 0; t < N_TYPES; t++) {
    uint8_t *base;
    const rlm_kqmat w = rand_mat((rlm_kq_type)t, 7, rlm__kq_block((rlm_kq_type)t) == 32 ? 96 : 768, &seed, &base);
    float *row = xmalloc((size_t)w.cols * sizeof *row);
    int64_t bad = 0;
    for (int64_t o = 0; o < w.rows; o++) {
      rlm__kq_dequant_row(&w, o, row);
      for (int64_t c = 0; c < w.cols; c++) {
        const float want = element_at(&w, o, c).w;
        bad += !(same_number(row[c], want) && signbit(row[c]) == signbit(want));
      }
    }
    test_note("%s", type_name((rlm_kq_type)t));
    CHECK_EQ(bad, 0);
    free(row), free(base);
  }
}

/* ---- the GGUF conversion ---------------------------------------------------- */

/* One 2-D tensor [rows][cols] of ggml type `gtype` with the blocks of w,
 * in a GGUF v3 image (alignment 32). */
static void image_of(gw *g, const rlm_kqmat *w, uint32_t gtype) {
  const uint64_t dims[2] = {(uint64_t)w->cols, (uint64_t)w->rows};
  gw_header(g, 3, 1, 0);
  gw_tensor(g, "blk.0.ffn_down.weight", 2, dims, gtype, 0);
  gw_pad(g, 32);
  gw_bytes(g, w->blocks, (size_t)w->rows * rlm__kq_row_bytes(w->type, w->cols));
}

/* The converted layer's weights code * s + b in f32 (two operations; the
 * scales and biases f16 or f32, gguf_quant.h: exact either way). */
static void converted_values(const rlm_qmat *q, float *out) {
  const int64_t words = rlm__quant_row_words(q->cols, q->bits), ng = q->cols / q->group_size;
  for (int64_t o = 0; o < q->rows; o++)
    for (int64_t c = 0; c < q->cols; c++) {
      const int64_t g = o * ng + c / q->group_size;
      const float code = (float)rlm__quant_get(q->wq + o * words, c, q->bits);
      const float sc = rlm__load_f(q->scales, q->sdtype, g), bi = rlm__load_f(q->biases, q->sdtype, g);
      out[o * q->cols + c] = code * sc + bi;
    }
}

static void check_conversion(rlm_kq_type t, int64_t rows, int64_t cols, uint64_t seed) {
  static const uint32_t gtypes[N_TYPES] = {GW_T_Q4_K, GW_T_Q6_K, GW_T_Q8_0, KQ_GW_Q5_0, KQ_GW_Q5_K};
  uint8_t *base;
  const rlm_kqmat w = rand_mat(t, rows, cols, &seed, &base);
  gw g = {0};
  image_of(&g, &w, gtypes[t]);
  rlm_gguf *f = NULL;
  rlm_error err = {0};
  CHECK_EQ(rlm__gguf_open_memory(&f, "mem.gguf", g.p, g.n, &err), RLM_OK);
  const rlm_gguf_tensor *gt = f ? rlm__gguf_tensor_find(f, "blk.0.ffn_down.weight") : NULL;
  CHECK(gt != NULL);
  rlm_arena arena;
  rlm__arena_init(&arena, 0);
  rlm_linear l;
  if (gt && !rlm__gguf_linear(NULL, &arena, f, gt, &l, &err)) {
    float *conv = xmalloc((size_t)(rows * cols) * sizeof *conv), *row = xmalloc((size_t)cols * sizeof *row);
    converted_values(&l.q, conv);
    const rlm_kqmat inplace = {gt->data, t, rows, cols}; /* zero-copy: the image's own bytes */
    int64_t bad = 0;
    for (int64_t o = 0; o < rows; o++) {
      rlm__kq_dequant_row(&inplace, o, row);
      for (int64_t c = 0; c < cols; c++) bad += !same_number(row[c], conv[o * cols + c]);
    }
    test_note("%s %lldx%lld", type_name(t), (long long)rows, (long long)cols);
    CHECK_EQ(bad, 0);
    free(conv), free(row);
  } else {
    CHECK(!"conversion failed");
  }
  rlm__arena_free(&arena);
  rlm__gguf_free(f);
  free(g.p), free(base);
}

TEST(dequant_matches_gguf_conversion) {
  for (int t = 0; t < N_TYPES; t++) {
    const int64_t b = rlm__kq_block((rlm_kq_type)t);
    check_conversion((rlm_kq_type)t, 1, b, 10 + t);
    check_conversion((rlm_kq_type)t, 37, 3 * b, 20 + t);
    check_conversion((rlm_kq_type)t, 5, 2048, 30 + t);
  }
}

/* ---- products ------------------------------------------------------------------- */

static const rlm_kq_kernels *g_k; /* the table under test */
static rlm_pool *g_pool;          /* 2 threads */

/* x [m][cols]: normal values, row 1 all zero (d = 0) when m >= 3, row 2
 * scaled by 1e3. */
static float *rand_x(int64_t m, int64_t cols, uint64_t *seed) {
  float *x = xmalloc((size_t)(m * cols) * sizeof *x);
  for (int64_t i = 0; i < m * cols; i++) x[i] = t_rng_normal(seed);
  if (m >= 3) {
    memset(x + cols, 0, (size_t)cols * sizeof *x);
    for (int64_t c = 0; c < cols; c++) x[2 * cols + c] *= 1e3f;
  }
  return x;
}

/* Per output: the exact product in double, sum |w x|, kquant.h's int8
 * bound (sum |a| d_b / 2 with a margin for the rounding of x * inv) and a
 * float-rounding allowance for the int8 sums' scaling. */
typedef struct expect {
  double y, mag, bound, round;
} expect;

static expect *expected(const rlm_kqmat *w, const float *x, int64_t m) {
  expect *e = xmalloc((size_t)(m * w->rows) * sizeof *e);
  for (int64_t o = 0; o < w->rows; o++)
    for (int64_t i = 0; i < m; i++) {
      expect r = {0, 0, 0, 0};
      const float *xi = x + i * w->cols;
      for (int64_t b = 0; b < w->cols / 32; b++) {
        float amax = 0;
        for (int c = 0; c < 32; c++) amax = fmaxf(amax, fabsf(xi[b * 32 + c]));
        const double db = amax / 127.0f;
        for (int64_t c = b * 32; c < b * 32 + 32; c++) {
          const elem el = element_at(w, o, c);
          r.y += (double)el.w * xi[c];
          r.mag += fabs((double)el.w * xi[c]);
          r.bound += fabs((double)el.a) * db * (0.5 + 1e-4);
          r.round += (fabs((double)el.a) + fabs((double)el.w) + 64.0 * el.s) * fabs((double)xi[c]);
        }
      }
      e[i * w->rows + o] = r;
    }
  return e;
}

static void check_f32(const rlm_kqmat *w, const float *x, int64_t m, const expect *e) {
  float *y = xmalloc((size_t)(m * w->rows) * sizeof *y), *yp = xmalloc((size_t)(m * w->rows) * sizeof *yp);
  rlm__kq_matmul_with(g_k, NULL, w, x, m, y);
  int64_t bad = 0, first = -1;
  const double u = 0x1p-24 * (double)(w->cols + 16);
  for (int64_t i = 0; i < m * w->rows; i++)
    if (!(fabs(y[i] - e[i].y) <= u * e[i].mag + 1e-30)) bad++, first = first < 0 ? i : first;
  if (bad) fprintf(stderr, "  f32 out %lld: %.9g want %.9g\n", (long long)first, y[first], e[first].y);
  CHECK_EQ(bad, 0);
  rlm__kq_matmul_with(g_k, g_pool, w, x, m, yp);
  CHECK(!memcmp(y, yp, (size_t)(m * w->rows) * sizeof *y));
  free(y), free(yp);
}

static void check_q8(const rlm_kqmat *w, const float *x, int64_t m, const expect *e) {
  const size_t bytes = rlm__kq_matmul_q8_bytes(m, w->cols), stride = rlm__kq_q8_stride(w->cols);
  void *s = aligned_alloc(64, bytes), *sr = aligned_alloc(64, bytes), *sp = aligned_alloc(64, bytes);
  memset(s, 0, bytes), memset(sr, 0, bytes), memset(sp, 0, bytes);
  float *y = xmalloc((size_t)(m * w->rows) * sizeof *y), *yr = xmalloc((size_t)(m * w->rows) * sizeof *yr);
  float *yp = xmalloc((size_t)(m * w->rows) * sizeof *yp);
  rlm__kq_matmul_q8_with(g_k, NULL, w, x, m, s, y);
  rlm__kq_matmul_q8_ref(w, x, m, sr, yr);
  CHECK(!memcmp(s, sr, bytes)); /* every quantizer writes the reference's bytes */
  (void)stride;
  int64_t bad = 0, bad_ref = 0, first = -1;
  double worst = 0;
  for (int64_t i = 0; i < m * w->rows; i++) {
    const double err = fabs(y[i] - e[i].y);
    if (!(err <= e[i].bound + 1e-5 * e[i].round + 1e-30)) bad++, first = first < 0 ? i : first;
    if (!(fabs(y[i] - yr[i]) <= 1e-5 * e[i].round + 1e-30)) bad_ref++;
    /* how much of the bound is used, where float rounding is not what
     * dominates (a huge dmin m_j next to a tiny d sc_j: y ~ 1e7, the
     * bound a few units, the error an ulp of y) */
    if (e[i].bound > 1e-5 * e[i].round && err / e[i].bound > worst) worst = err / e[i].bound;
  }
  if (bad) fprintf(stderr, "  q8 out %lld: %.9g want %.9g bound %.3g\n", (long long)first, y[first], e[first].y,
                   e[first].bound);
  CHECK_EQ(bad, 0);
  CHECK_EQ(bad_ref, 0);
  CHECK(worst < 1.0);
  rlm__kq_matmul_q8_with(g_k, g_pool, w, x, m, sp, yp);
  CHECK(!memcmp(y, yp, (size_t)(m * w->rows) * sizeof *y));
  free(s), free(sr), free(sp), free(y), free(yr), free(yp);
}

static void check_products(rlm_kq_type t, int64_t rows, int64_t cols, uint64_t seed) {
  static const int64_t MS[] = {1, 2, 3, 5, 8, 13, 64};
  uint8_t *base;
  const rlm_kqmat w = rand_mat(t, rows, cols, &seed, &base);
  for (int k = 0; k < N_OF(MS); k++) {
    const int64_t m = MS[k];
    float *x = rand_x(m, cols, &seed);
    expect *e = expected(&w, x, m);
    test_note("%s %s %lldx%lld m=%lld", g_k->name, type_name(t), (long long)rows, (long long)cols, (long long)m);
    check_f32(&w, x, m, e);
    check_q8(&w, x, m, e);
    free(x), free(e);
  }
  free(base);
}

/* The f32 kernels' own dequantization, value for value: against unit
 * vectors (x = the identity, m = cols) the product is the weights
 * themselves, every other term an exact zero. */
static void check_f32_exact_weights(rlm_kq_type t, int64_t rows, int64_t cols, uint64_t seed) {
  uint8_t *base;
  const rlm_kqmat w = rand_mat(t, rows, cols, &seed, &base);
  float *x = xmalloc((size_t)(cols * cols) * sizeof *x), *y = xmalloc((size_t)(cols * rows) * sizeof *y);
  float *row = xmalloc((size_t)cols * sizeof *row);
  for (int64_t i = 0; i < cols; i++) x[i * cols + i] = 1.0f;
  rlm__kq_matmul_with(g_k, NULL, &w, x, cols, y);
  int64_t bad = 0;
  for (int64_t o = 0; o < rows; o++) {
    rlm__kq_dequant_row(&w, o, row);
    for (int64_t c = 0; c < cols; c++) bad += !same_number(y[c * rows + o], row[c]);
  }
  test_note("%s %s exact weights", g_k->name, type_name(t));
  CHECK_EQ(bad, 0);
  free(x), free(y), free(row), free(base);
}

static void products_all(void) {
  for (int t = 0; t < N_TYPES; t++)
    check_f32_exact_weights((rlm_kq_type)t, 9, rlm__kq_block((rlm_kq_type)t) == 32 ? 96 : 512, 500 + t);
  for (int t = 0; t < N_TYPES; t++) {
    const rlm_kq_type ty = (rlm_kq_type)t;
    const int64_t b = rlm__kq_block(ty);
    check_products(ty, 3, b, 100 + t);                        /* one block */
    check_products(ty, 37, 3 * b, 200 + t);                   /* rows over the pool's grain */
    check_products(ty, 5, b == 32 ? 1152 : 2048, 300 + t); /* a model-like row (odd Q8_0 pairs) */
    if (b == 32) check_products(ty, 9, 32 * 7, 400 + t);  /* an odd number of blocks (Q5_0: a short chunk of 3) */
    if (ty == RLM_KQ_Q5_0) {                              /* short last chunks of 1 and 2 blocks */
      check_products(ty, 4, 32 * 5, 410);
      check_products(ty, 3, 32 * 6, 420);
    }
  }
}

/* The bound catches a layout bug: the int8 product of w is compared with
 * the exact product of w with its nibbles swapped (Q4_K: every qs byte;
 * Q6_K: every ql byte) or its block halves swapped (Q8_0). */
static void check_bound_tight(rlm_kq_type t) {
  uint64_t seed = 77;
  const int64_t rows = 64, cols = 256, m = 1;
  uint8_t *base, *mbase;
  const rlm_kqmat w = rand_mat(t, rows, cols, &seed, &base);
  /* moderate scales everywhere: the bug must show in ordinary weights */
  const size_t n = (size_t)rows * rlm__kq_row_bytes(t, cols);
  const int bb = rlm__kq_block_bytes(t);
  uint8_t *p = (uint8_t *)w.blocks;
  for (size_t b = 0; b < n / (size_t)bb; b++) {
    uint8_t *blk = p + b * (size_t)bb;
    const uint16_t d = rlm__f32_to_f16(0.01f + 0.01f * (float)(b % 3));
    if (t == RLM_KQ_Q4_K || t == RLM_KQ_Q5_K) put_f16(blk, d), put_f16(blk + 2, d);
    else if (t == RLM_KQ_Q6_K) put_f16(blk + 208, d);
    else put_f16(blk, d);
  }
  mbase = xmalloc(n + 8);
  uint8_t *q = mbase + 2;
  memcpy(q, p, n);
  for (size_t b = 0; b < n / (size_t)bb; b++) {
    uint8_t *blk = q + b * (size_t)bb;
    if (t == RLM_KQ_Q4_K) for (int i = 0; i < 128; i++) blk[16 + i] = (uint8_t)(blk[16 + i] << 4 | blk[16 + i] >> 4);
    else if (t == RLM_KQ_Q6_K) for (int i = 0; i < 128; i++) blk[i] = (uint8_t)(blk[i] << 4 | blk[i] >> 4);
    else if (t == RLM_KQ_Q5_0) for (int i = 0; i < 16; i++) blk[6 + i] = (uint8_t)(blk[6 + i] << 4 | blk[6 + i] >> 4);
    else if (t == RLM_KQ_Q5_K) { /* nibbles swapped and the fifth bit taken one sub-block off */
      for (int i = 0; i < 128; i++) blk[48 + i] = (uint8_t)(blk[48 + i] << 4 | blk[48 + i] >> 4);
      for (int i = 0; i < 32; i++) blk[16 + i] = (uint8_t)(blk[16 + i] << 1 | blk[16 + i] >> 7);
    }
    else for (int i = 0; i < 16; i++) { const uint8_t s = blk[2 + i]; blk[2 + i] = blk[18 + i], blk[18 + i] = s; }
  }
  const rlm_kqmat wm = {q, t, rows, cols};
  float *x = rand_x(m, cols, &seed), *y = xmalloc((size_t)rows * sizeof *y);
  void *s = aligned_alloc(64, rlm__kq_matmul_q8_bytes(m, cols));
  rlm__kq_matmul_q8_with(g_k, NULL, &w, x, m, s, y);
  expect *e = expected(&w, x, m), *em = expected(&wm, x, m);
  int64_t caught = 0;
  double ratio = 0;
  for (int64_t o = 0; o < rows; o++) {
    caught += fabs(y[o] - em[o].y) > e[o].bound;
    ratio += fabs(y[o] - e[o].y) / e[o].bound;
  }
  test_note("%s %s: %lld of %lld caught", g_k->name, type_name(t), (long long)caught, (long long)rows);
  CHECK(caught >= rows * 3 / 4);
  if (g_k == &rlm__kq_kernels_ref)
    printf("  %s: layout bug caught in %lld/%lld outputs; mean |err| / bound %.3f\n", type_name(t),
           (long long)caught, (long long)rows, ratio / (double)rows);
  free(x), free(y), free(s), free(e), free(em), free(base), free(mbase);
}

static void bound_tight_all(void) {
  for (int t = 0; t < N_TYPES; t++) check_bound_tight((rlm_kq_type)t);
}

/* The dispatching entry points: the chosen table's bytes, over a pool too. */
TEST(dispatch) {
  uint64_t seed = 5;
  uint8_t *base;
  const rlm_kqmat w = rand_mat(RLM_KQ_Q4_K, 40, 512, &seed, &base);
  float *x = rand_x(3, 512, &seed);
  float *y = xmalloc(3 * 40 * sizeof *y), *yk = xmalloc(3 * 40 * sizeof *yk);
  void *s = aligned_alloc(64, rlm__kq_matmul_q8_bytes(3, 512));
  const rlm_kq_kernels *k = rlm__kq_kernels();
  CHECK(k != NULL);
  printf("  chosen kernels: %s\n", k->name);
  rlm__kq_matmul(g_pool, &w, x, 3, y);
  rlm__kq_matmul_with(k, NULL, &w, x, 3, yk);
  CHECK(!memcmp(y, yk, sizeof *y * 120));
  rlm__kq_matmul_q8(g_pool, &w, x, 3, s, y);
  rlm__kq_matmul_q8_with(k, NULL, &w, x, 3, s, yk);
  CHECK(!memcmp(y, yk, sizeof *y * 120));
  free(base), free(x), free(y), free(yk), free(s);
}

static const t_case CASES[] = {{"products", products_all}, {"bound_tight", bound_tight_all}};

int main(void) {
  CHECK_EQ(rlm__pool_create(&g_pool, 2, NULL), RLM_OK);
  RUN(row_bytes);
  RUN(dequant_matches_independent);
  RUN(dequant_matches_gguf_conversion);
  RUN(dispatch);
  g_k = &rlm__kq_kernels_ref;
  t_run_isa("ref", true, CASES, N_OF(CASES));
  g_k = rlm__kq_kernels_avx2();
  t_run_isa("avx2", g_k != NULL, CASES, N_OF(CASES));
  g_k = rlm__kq_kernels_avx512();
  t_run_isa("avx512vnni", g_k != NULL, CASES, N_OF(CASES));
  rlm__pool_free(g_pool);
  return test_summary();
}
