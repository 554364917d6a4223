/* test_qdot_avx2.c -- the AVX2 int8-activation kernels (qdot_avx2.c), for
 * 4-bit and 8-bit weights, against the scalar reference (rlm__qmv_q8_ref /
 * rlm__qmm_q8_ref).
 *
 * Both compute the same exact integer block sums; they differ only in how
 * the float terms d_b s_g isum_b and b_g xsum_g are added up. So the bound
 * is relative to the magnitude of those terms, with the integer sums taken
 * in absolute value (the kernels split each block into lane sums):
 *
 *   scale(o) = sum_b d_b |s_g(b)| sum_i code_i |xq_i| + sum_g |b_g xsum_g|
 *
 * Summing n such terms in any order is off by at most about n u scale
 * (u = 2^-24); with n <= 72 here (1152 columns, groups of 32) both sides
 * stay under 4.3e-6 scale, so |avx2 - ref| <= 1e-5 scale cannot fail from
 * rounding, while a wrong code (one step of one weight, s d |xq|, against
 * a scale of about cols times that) does: the negative control shows it.
 * On integer data (unit scales, block maxima of 127 so d = 1, integer
 * biases, sums below 2^24) every float operation is exact and the two must
 * agree to the bit, which pins the integer sums themselves. Rows outside
 * [o0, o1) must stay poisoned. The AVX2 activation quantizers must write
 * the references' bytes. Skipped without AVX2.
 */
#include "quant/quant.h"
#include "test.h"

static const int BITS[] = {4, 8};
static const int GROUPS[] = {32, 64, 128};
static const rlm_dtype DTYPES[] = {RLM_DTYPE_F32, RLM_DTYPE_F16, RLM_DTYPE_BF16};
static const double REL_TOL = 1e-5;
static uint64_t g_seed = 0x9d07a7c2ull;
static double g_worst; /* largest |avx2 - ref| / scale, for the log */

typedef struct test_qmat {
  rlm_qmat w;
  uint32_t *wq;
  void *scales, *biases;
} test_qmat;

static void qmat_make(test_qmat *t, int64_t rows, int64_t cols, int bits, int g, rlm_dtype dt, uint64_t *rng) {
  float *f = xmalloc((size_t)(rows * cols) * sizeof *f);
  for (int64_t r = 0; r < rows; r++) {
    const float mag = powf(10.0f, t_rng_float(rng, -2.0f, 2.0f));
    for (int64_t j = 0; j < cols; j++) f[r * cols + j] = mag * (t_rng_normal(rng) + t_rng_float(rng, -0.3f, 0.5f));
  }
  void *x = xmalloc((size_t)(rows * cols) * rlm_dtype_size(dt));
  rlm__convert(f, RLM_DTYPE_F32, x, dt, rows * cols);
  const size_t ns = (size_t)(rows * (cols / g)) * rlm_dtype_size(dt);
  t->wq = xmalloc((size_t)(rows * rlm__quant_row_words(cols, bits)) * sizeof(uint32_t));
  t->scales = xmalloc(ns);
  t->biases = xmalloc(ns);
  rlm__quantize_rows_ref(x, dt, rows, cols, bits, g, t->wq, t->scales, t->biases);
  t->w = (rlm_qmat){t->wq, t->scales, t->biases, dt, rows, cols, bits, g};
  free(x);
  free(f);
}

static void qmat_free(test_qmat *t) { free(t->wq), free(t->scales), free(t->biases); }

/* m rows of x, each with its own magnitude, and one all-zero block (d = 0). */
static float *make_x(int64_t m, int64_t cols, uint64_t *rng) {
  float *x = xmalloc((size_t)(m * cols) * sizeof *x);
  for (int64_t i = 0; i < m; i++) {
    const float mag = powf(10.0f, t_rng_float(rng, -3.0f, 3.0f));
    for (int64_t j = 0; j < cols; j++) x[i * cols + j] = mag * t_rng_normal(rng);
    memset(x + i * cols + (int64_t)(t_rng_next(rng) % (uint64_t)(cols / 32)) * 32, 0, 32 * sizeof *x);
  }
  return x;
}

/* The quantized activations of m rows (rlm__qmatmul_q8's layout) and their
 * group sums, as the kernels get them. */
typedef struct q8_rows {
  char *scratch;
  float *xsum;
  size_t stride;
} q8_rows;

/* One row's quantized x in the layout for w's bits, by the definition. */
static void quantize_ref(const rlm_qmat *w, const float *x, char *out) {
  if (w->bits == 8) rlm__q8act_quantize_w8_ref(x, w->cols, out);
  else rlm__q8act_quantize_ref(x, w->cols, out);
}

static void q8_rows_make(q8_rows *q, const rlm_qmat *w, const float *x, int64_t m) {
  q->stride = (rlm__q8act_bytes(w->cols) + 63) & ~(size_t)63;
  q->scratch = xmalloc(rlm__qmatmul_q8_bytes(m, w->cols, w->group_size));
  q->xsum = (float *)(q->scratch + m * q->stride);
  rlm__group_sums(x, m, w->cols, w->group_size, q->xsum);
  for (int64_t i = 0; i < m; i++) quantize_ref(w, x + i * w->cols, q->scratch + i * q->stride);
}

/* Element e's activation code and the block scales of a quantized row. */
static int xcode(const rlm_qmat *w, const char *xrow, int64_t e) {
  if (w->bits == 8) return ((const int16_t *)xrow)[rlm__q8act_w8_pos(e)];
  const int64_t c = e / 128, k = e % 128;
  return ((const int8_t *)xrow)[c * 128 + (k % 2 ? 64 + k / 2 : k / 2)];
}

static const float *xscales(const rlm_qmat *w, const char *xrow) {
  if (w->bits == 8) return (const float *)(xrow + 2 * w->cols);
  return (const float *)(xrow + w->cols) + (w->cols / 128) * 16;
}

/* scale(o) of the header for one quantized row. */
static double term_scale(const rlm_qmat *w, const char *xrow, const float *xsum, int64_t o) {
  const int64_t cols = w->cols, ng = cols / w->group_size;
  const float *d = xscales(w, xrow);
  const uint32_t *wr = w->wq + o * rlm__quant_row_words(cols, w->bits);
  double sum = 0;
  for (int64_t b = 0; b < cols / 32; b++) {
    double isum = 0;
    for (int64_t e = b * 32; e < b * 32 + 32; e++) isum += rlm__quant_get(wr, e, w->bits) * abs(xcode(w, xrow, e));
    sum += isum * d[b] * fabs((double)rlm__load_f(w->scales, w->sdtype, o * ng + b * 32 / w->group_size));
  }
  for (int64_t g = 0; g < ng; g++) sum += fabs((double)rlm__load_f(w->biases, w->sdtype, o * ng + g) * xsum[g]);
  return sum;
}

static const uint32_t POISON = 0x7fc0dead; /* a NaN nobody computes */

static void poison(float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) memcpy(y + i, &POISON, 4);
}

static bool is_poison(const float *y) { return memcmp(y, &POISON, 4) == 0; }

/* Entries of y [m][rows] that are wrong: outside [o0, o1) not poison, or
 * inside further than REL_TOL * scale from yr. */
static int count_bad(const rlm_qmat *w, const q8_rows *q, int64_t m, int64_t o0, int64_t o1, const float *yf,
                     const float *yr) {
  const int64_t ng = w->cols / w->group_size;
  int bad = 0;
  for (int64_t i = 0; i < m; i++)
    for (int64_t o = 0; o < w->rows; o++) {
      const float *f = yf + i * w->rows + o;
      if (o < o0 || o >= o1) {
        bad += !is_poison(f);
        continue;
      }
      const double scale = term_scale(w, q->scratch + i * q->stride, q->xsum + i * ng, o);
      const double err = fabs((double)*f - yr[i * w->rows + o]);
      if (scale > 0 && err / scale > g_worst) g_worst = err / scale;
      bad += !(err <= REL_TOL * scale + 1e-35);
    }
  return bad;
}

/* One case: the mat-vec (m == 1) or the mat-mat against the reference on
 * rows [o0, o1), and the mat-mat for m == 1 too (a 1 x 1 edge tile). */
static int run_case(const rlm_qmat *w, const float *x, int64_t m, int64_t o0, int64_t o1) {
  q8_rows q;
  q8_rows_make(&q, w, x, m);
  float *yr = xmalloc((size_t)(m * w->rows) * sizeof *yr), *yf = xmalloc((size_t)(m * w->rows) * sizeof *yf);
  rlm__qmm_q8_ref(w, q.scratch, q.stride, q.xsum, m, o0, o1, yr);
  poison(yf, m * w->rows);
  if (m == 1) rlm__qmv_q8_avx2(w, q.scratch, q.xsum, o0, o1, yf);
  else rlm__qmm_q8_avx2(w, q.scratch, q.stride, q.xsum, m, o0, o1, yf);
  int bad = count_bad(w, &q, m, o0, o1, yf, yr);
  if (m == 1) {
    poison(yf, w->rows);
    rlm__qmm_q8_avx2(w, q.scratch, q.stride, q.xsum, 1, o0, o1, yf);
    bad += count_bad(w, &q, 1, o0, o1, yf, yr);
  }
  free(yf), free(yr), free(q.scratch);
  return bad;
}

/* Both widths, m = 1..17 (every tile remainder, more than one
 * QMM_IN_BLOCK of 16), every group size and scale dtype, row ranges
 * starting and ending off the 4- and 2-row tiles, a column count of one
 * chunk and of several (bias tails of 1..7 groups and whole 8s). */
TEST(avx2_matches_ref) {
  static const int64_t COLS[] = {128, 384, 1152};
  for (int bi = 0; bi < 2; bi++)
    for (int ci = 0; ci < 3; ci++)
      for (int gi = 0; gi < 3; gi++)
        for (int di = 0; di < 3; di++) {
          const int64_t rows = 37, cols = COLS[ci];
          uint64_t rng = g_seed + (uint64_t)(bi * 27 + ci * 9 + gi * 3 + di) * 7919;
          test_qmat t;
          qmat_make(&t, rows, cols, BITS[bi], GROUPS[gi], DTYPES[di], &rng);
          CHECK(rlm__q8act_ok(&t.w));
          for (int64_t m = 1; m <= 17; m++) {
            float *x = make_x(m, cols, &rng);
            const int64_t o0 = 1 + (int64_t)(t_rng_next(&rng) % 4), o1 = rows - (int64_t)(t_rng_next(&rng) % 4);
            test_note("bits %d cols %lld group %d dtype %s m %lld rows [%lld, %lld)", BITS[bi], (long long)cols,
                      GROUPS[gi], rlm_dtype_name(DTYPES[di]), (long long)m, (long long)o0, (long long)o1);
            CHECK_EQ(run_case(&t.w, x, m, o0, o1), 0);
            free(x);
          }
          qmat_free(&t);
        }
  printf("     avx2 vs ref: worst %.2g of the term scale (tol %g)\n", g_worst, REL_TOL);
}

/* More than one QMM_OUT_BLOCK of output rows and a row range that is not
 * tile-aligned inside it, at the Gemma-3-1B hidden size. */
TEST(avx2_many_rows) {
  const int64_t rows = 300, cols = 1152, m = 9;
  for (int bi = 0; bi < 2; bi++) {
    uint64_t rng = g_seed ^ (0xabcdefull + (uint64_t)bi);
    test_qmat t;
    qmat_make(&t, rows, cols, BITS[bi], 64, RLM_DTYPE_BF16, &rng);
    float *x = make_x(m, cols, &rng);
    test_note("bits %d", BITS[bi]);
    CHECK_EQ(run_case(&t.w, x, m, 5, 291), 0);
    CHECK_EQ(run_case(&t.w, x, 1, 7, 290), 0);
    free(x);
    qmat_free(&t);
  }
}

/* Codes packed LSB first, as MLX does (4 or 8 bits never straddle words). */
static void pack_codes(const uint8_t *codes, int64_t n, int bits, uint32_t *wq) {
  memset(wq, 0, (size_t)(n * bits / 32) * sizeof *wq);
  for (int64_t i = 0; i < n; i++) wq[i * bits / 32] |= (uint32_t)codes[i] << (i * bits % 32);
}

/* Integer data on which every float operation is exact: codes of any
 * value, unit scales, integer biases in [-8, 8]; x integers in [-127, 127]
 * with +-127 in every block (so d = 1 and the codes are x itself) but one
 * all-zero block; 384 columns keep every partial sum below 2^24
 * (384 * 255 * 127 + 6 * 8 * 64 * 127). The kernels must then give the
 * reference's floats exactly, for every lane-to-block mapping mistake
 * changes an integer sum. */
TEST(avx2_exact_on_integer_data) {
  const int64_t rows = 37, cols = 384;
  for (int bi = 0; bi < 2; bi++)
    for (int gi = 0; gi < 3; gi++)
      for (int di = 0; di < 3; di++) {
        const int bits = BITS[bi], g = GROUPS[gi];
        const rlm_dtype dt = DTYPES[di];
        uint64_t rng = g_seed ^ (uint64_t)(0x5151 + bi * 9 + gi * 3 + di);
        uint8_t *codes = xmalloc((size_t)(rows * cols));
        for (int64_t i = 0; i < rows * cols; i++) codes[i] = (uint8_t)(t_rng_next(&rng) % (1u << bits));
        const int64_t ns = rows * (cols / g);
        float *sf = xmalloc((size_t)ns * sizeof *sf), *bf = xmalloc((size_t)ns * sizeof *bf);
        for (int64_t i = 0; i < ns; i++) sf[i] = 1.0f, bf[i] = (float)((int)(t_rng_next(&rng) % 17) - 8);
        test_qmat t;
        t.wq = xmalloc((size_t)(rows * rlm__quant_row_words(cols, bits)) * sizeof(uint32_t));
        t.scales = xmalloc((size_t)ns * rlm_dtype_size(dt));
        t.biases = xmalloc((size_t)ns * rlm_dtype_size(dt));
        pack_codes(codes, rows * cols, bits, t.wq);
        rlm__convert(sf, RLM_DTYPE_F32, t.scales, dt, ns);
        rlm__convert(bf, RLM_DTYPE_F32, t.biases, dt, ns);
        t.w = (rlm_qmat){t.wq, t.scales, t.biases, dt, rows, cols, bits, g};
        for (int64_t m = 1; m <= 9; m++) {
          float *x = xmalloc((size_t)(m * cols) * sizeof *x);
          for (int64_t i = 0; i < m * cols; i++) x[i] = (float)((int)(t_rng_next(&rng) % 255) - 127);
          for (int64_t b = 0; b < m * cols / 32; b++) /* +-127 somewhere in each block */
            x[b * 32 + (int64_t)(t_rng_next(&rng) % 32)] = b % 2 ? 127.0f : -127.0f;
          memset(x + (int64_t)(t_rng_next(&rng) % (uint64_t)(m * cols / 32)) * 32, 0, 32 * sizeof *x);
          q8_rows q;
          q8_rows_make(&q, &t.w, x, m);
          float *yr = xmalloc((size_t)(m * rows) * sizeof *yr), *yf = xmalloc((size_t)(m * rows) * sizeof *yf);
          rlm__qmm_q8_ref(&t.w, q.scratch, q.stride, q.xsum, m, 0, rows, yr);
          int bad = 0;
          for (int pass = 0; pass < 2; pass++) { /* the mat-mat, then the mat-vec per row */
            poison(yf, m * rows);
            if (pass == 0) rlm__qmm_q8_avx2(&t.w, q.scratch, q.stride, q.xsum, m, 3, rows - 1, yf);
            for (int64_t i = 0; pass == 1 && i < m; i++)
              rlm__qmv_q8_avx2(&t.w, q.scratch + i * q.stride, q.xsum + i * (cols / g), 3, rows - 1,
                               yf + i * rows);
            for (int64_t i = 0; i < m * rows; i++) {
              const int64_t o = i % rows;
              bad += (o < 3 || o >= rows - 1) ? !is_poison(yf + i) : yf[i] != yr[i];
            }
          }
          test_note("bits %d group %d dtype %s m %lld", bits, g, rlm_dtype_name(dt), (long long)m);
          CHECK_EQ(bad, 0);
          CHECK(yr[5] == yr[5]); /* a real sum, not NaN */
          free(yf), free(yr), free(q.scratch), free(x);
        }
        qmat_free(&t);
        free(bf), free(sf), free(codes);
      }
}

/* The control: one code moved by one step in the mat-mat and the mat-vec
 * inputs of the AVX2 kernels breaks the bound for that row. The element
 * is made 8 times its row's largest (|xq| = 127 whatever the row: make_x's
 * all-zero block could otherwise hold it, and then no code there matters;
 * some seeds failed so). An 8-bit step is a smaller share of the scale
 * (codes up to 255 against 15), so there the control takes one chunk of
 * 128 columns. avx2_exact_on_integer_data pins any single wrong code. */
TEST(avx2_tolerance_catches_one_wrong_code) {
  const int64_t rows = 8, m = 5;
  for (int bi = 0; bi < 2; bi++) {
    const int bits = BITS[bi];
    const int64_t cols = bits == 8 ? 128 : 1152, e = bits == 8 ? 100 : 700;
    uint64_t rng = g_seed ^ (0x1234ull + (uint64_t)bi);
    test_qmat t;
    qmat_make(&t, rows, cols, bits, 32, RLM_DTYPE_F16, &rng);
    float *x = make_x(m, cols, &rng);
    for (int64_t i = 0; i < m; i++) {
      float amax = 0;
      for (int64_t k = 0; k < cols; k++) amax = fmaxf(amax, fabsf(x[i * cols + k]));
      x[i * cols + e] = 8.0f * amax;
    }
    q8_rows q;
    q8_rows_make(&q, &t.w, x, m);
    float *yr = xmalloc((size_t)(m * rows) * sizeof *yr), *yf = xmalloc((size_t)(m * rows) * sizeof *yf);
    rlm__qmm_q8_ref(&t.w, q.scratch, q.stride, q.xsum, m, 0, rows, yr);
    /* row 3, element e: a code of 0 becomes 1, anything else one less */
    const int per_word = 32 / bits, mask = (1 << bits) - 1;
    uint32_t *word = t.wq + 3 * rlm__quant_row_words(cols, bits) + e / per_word;
    const int shift = bits * (int)(e % per_word), code = (int)(*word >> shift) & mask;
    *word = (*word & ~((uint32_t)mask << shift)) | (uint32_t)(code ? code - 1 : 1) << shift;
    const double saved = g_worst;
    test_note("bits %d", bits);
    rlm__qmm_q8_avx2(&t.w, q.scratch, q.stride, q.xsum, m, 0, rows, yf);
    CHECK(count_bad(&t.w, &q, m, 0, rows, yf, yr) > 0);
    rlm__qmv_q8_avx2(&t.w, q.scratch, q.xsum, 0, rows, yf);
    CHECK(count_bad(&t.w, &q, 1, 0, rows, yf, yr) > 0);
    g_worst = saved; /* the control's error is meant to be large */
    free(yf), free(yr), free(q.scratch), free(x);
    qmat_free(&t);
  }
}

/* The AVX2 quantizers write the definitions' bytes (codes in the chunk
 * layouts, per-lane and per-block scales): random rows, an all-zero block,
 * a block with one dominant element and tiny ones, and a block whose
 * largest element is 127 (inv = 1) with exact .5 ties, which must round
 * to even as lrintf does. */
TEST(avx2_quantize_matches_ref) {
  const int64_t cols = 1152;
  const size_t n4 = (size_t)cols + (size_t)(cols / 128) * 16 * 4 + (size_t)(cols / 32) * 4;
  const size_t n8 = 2 * (size_t)cols + (size_t)(cols / 32) * 4;
  uint64_t rng = g_seed ^ 0x77ull;
  float *x = make_x(1, cols, &rng);
  for (int i = 0; i < 32; i++) x[64 + i] = 0.0f;                   /* d = 0 */
  x[200] = 3e4f, x[210] = -1e-30f, x[211] = 1e-38f;                /* one dominant element */
  for (int i = 0; i < 32; i++) x[320 + i] = (float)(i - 16) + 0.5f; /* ties */
  x[320] = 127.0f, x[351] = -126.5f;
  unsigned char *a = xmalloc(rlm__q8act_bytes(cols)), *b = xmalloc(rlm__q8act_bytes(cols));
  CHECK(n4 + 64 <= rlm__q8act_bytes(cols) && n8 + 64 <= rlm__q8act_bytes(cols));
  memset(a, 0xa5, n4), memset(b, 0x5a, n4);
  rlm__q8act_quantize_avx2(x, cols, a);
  rlm__q8act_quantize_ref(x, cols, b);
  CHECK(memcmp(a, b, n4) == 0);
  memset(a, 0xa5, n8), memset(b, 0x5a, n8);
  rlm__q8act_quantize_w8_avx2(x, cols, a);
  rlm__q8act_quantize_w8_ref(x, cols, b);
  CHECK(memcmp(a, b, n8) == 0);
  /* the quad layout is a permutation: every chunk position written once */
  unsigned char *seen = calloc((size_t)cols, 1);
  for (int64_t e = 0; e < cols; e++) seen[rlm__q8act_w8_pos(e)]++;
  int once = 0;
  for (int64_t e = 0; e < cols; e++) once += seen[e] == 1;
  CHECK_EQ(once, cols);
  free(seen), free(a), free(b), free(x);
}

/* VNNI first, then AVX2, then the reference, at 4 and 8 bits; the 8-bit
 * layout follows the kernel (half-block on VNNI, quad on AVX2). */
TEST(dispatch_picks_avx2) {
  if (rlm__cpu_avx512_vnni()) {
    CHECK(rlm__qmv_q8_kernel(4) != rlm__qmv_q8_avx2);
    CHECK(rlm__qmv_q8_kernel(8) != rlm__qmv_q8_avx2);
    CHECK(rlm__qmm_q8_kernel(4) != rlm__qmm_q8_avx2);
    CHECK(rlm__qmm_q8_kernel(8) != rlm__qmm_q8_avx2);
    CHECK(rlm__qmv_q8_quantizer_for(rlm__qmv_q8_kernel(8), 8) == rlm__q8act_quantize_w6);
  } else {
    CHECK(rlm__qmv_q8_kernel(4) == rlm__qmv_q8_avx2);
    CHECK(rlm__qmv_q8_kernel(8) == rlm__qmv_q8_avx2);
    CHECK(rlm__qmm_q8_kernel(4) == rlm__qmm_q8_avx2);
    CHECK(rlm__qmm_q8_kernel(8) == rlm__qmm_q8_avx2);
  }
  CHECK(rlm__qmv_q8_quantizer_for(rlm__qmv_q8_avx2, 8) == rlm__q8act_quantize_w8);
  CHECK(rlm__qmm_q8_quantizer_for(rlm__qmm_q8_avx2, 8) == rlm__q8act_quantize_w8);
  /* the dispatched quantizers are the AVX2 ones here: same bytes as them */
  const int64_t cols = 256;
  const size_t n4 = (size_t)cols + (size_t)(cols / 128) * 16 * 4 + (size_t)(cols / 32) * 4;
  const size_t n8 = 2 * (size_t)cols + (size_t)(cols / 32) * 4;
  uint64_t rng = g_seed;
  float *x = make_x(1, cols, &rng);
  unsigned char *a = xmalloc(rlm__q8act_bytes(cols)), *b = xmalloc(rlm__q8act_bytes(cols));
  rlm__q8act_quantize(x, cols, a);
  rlm__q8act_quantize_avx2(x, cols, b);
  CHECK(memcmp(a, b, n4) == 0);
  rlm__q8act_quantize_w8(x, cols, a);
  rlm__q8act_quantize_w8_avx2(x, cols, b);
  CHECK(memcmp(a, b, n8) == 0);
  free(a), free(b), free(x);
}

int main(void) {
  const char *s = getenv("RINGLM_TEST_SEED");
  if (s) g_seed = strtoull(s, NULL, 0);
  static const t_case tests[] = {
      {"matches_ref", avx2_matches_ref},
      {"many_rows", avx2_many_rows},
      {"exact_on_integer_data", avx2_exact_on_integer_data},
      {"tolerance_catches_one_wrong_code", avx2_tolerance_catches_one_wrong_code},
      {"quantize_matches_ref", avx2_quantize_matches_ref},
      {"dispatch", dispatch_picks_avx2},
  };
  t_run_isa("avx2", rlm__cpu_avx2(), tests, N_OF(tests));
  return test_summary();
}
