/* test_quant.c -- the reference MLX affine quantizer against hand-derived
 * vectors (spec/mlx-semantics.md §1.5 and our own, one per bit width and
 * per edge case), error bounds of dequantize(quantize(x)), packing of the
 * word-straddling widths, group size 16's products (GGUF's Q6_K), and the
 * public API's argument checks. The fast
 * paths are compared with this reference in test_quant_fast.c. */
#include "quant/quant.h"
#include "test.h"

#include <float.h>

/* Quantizes one row of f32 with the reference; scales/biases as f32. */
static void quant_f32(const float *x, int cols, int bits, int g, uint32_t *wq,
                      float *s, float *b) {
  rlm__quantize_rows_ref(x, RLM_DTYPE_F32, 1, cols, bits, g, wq, s, b);
}

static void codes_of(const uint32_t *wq, int n, int bits, int *out) {
  for (int i = 0; i < n; i++) out[i] = (int)rlm__quant_get(wq, i, bits);
}

/* §1.5: x_j = (12 - j)/8, one 32-group. */
static void worked_input(float *x) {
  for (int j = 0; j < 32; j++) x[j] = (float)(12 - j) / 8.0f;
}

TEST(worked_example_4bit) {
  float x[32], s, b;
  uint32_t wq[4];
  worked_input(x);
  quant_f32(x, 32, 4, 32, wq, &s, &b);
  CHECK_EQ(wq[0], 0xbccddeefu);
  CHECK_EQ(wq[1], 0x88999aabu);
  CHECK_EQ(wq[2], 0x44556677u);
  CHECK_EQ(wq[3], 0x00112233u);
  CHECK(s == -2.375f / -9.0f);
  CHECK(b == -2.375f);
  /* Stored in bf16: scale 0.263671875, bias -2.375. */
  uint16_t sb[1], bb[1];
  uint32_t wq2[4];
  uint16_t xb[32];
  for (int j = 0; j < 32; j++) xb[j] = rlm__f32_to_bf16(x[j]);
  rlm__quantize_rows_ref(xb, RLM_DTYPE_BF16, 1, 32, 4, 32, wq2, sb, bb);
  CHECK(memcmp(wq, wq2, sizeof wq) == 0);
  CHECK(rlm__bf16_to_f32(sb[0]) == 0.263671875f);
  CHECK(rlm__bf16_to_f32(bb[0]) == -2.375f);
  /* Dequantize in bf16 with per-op rounding: code 9 -> 0.0, 15 -> 1.578125. */
  uint16_t out[32];
  rlm_qmat w = {wq2, sb, bb, RLM_DTYPE_BF16, 1, 32, 4, 32};
  rlm__dequantize_rows_ref(&w, out);
  CHECK(rlm__bf16_to_f32(out[12]) == 0.0f);
  CHECK(rlm__bf16_to_f32(out[0]) == 1.578125f);
}

TEST(worked_example_3bit) {
  float x[32], s, b;
  uint32_t wq[3];
  worked_input(x);
  quant_f32(x, 32, 3, 32, wq, &s, &b);
  static const int want[32] = {7, 6, 6, 6, 6, 5, 5, 5, 5, 5, 4, 4, 4, 4, 4, 3,
                               3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 1, 0, 0, 0};
  int got[32];
  codes_of(wq, 32, 3, got);
  for (int j = 0; j < 32; j++) CHECK_EQ(got[j], want[j]);
  CHECK_EQ(wq[0], 0x2db6edb7u);
  CHECK_EQ(wq[1], 0x26db7249u);
  CHECK_EQ(wq[2], 0x00124949u);
  CHECK(s == 0.59375f);
  CHECK(b == -2.375f);
}

/* Our own vector for every width: a group of 128 holding 0..n repeated
 * (x_j = j mod (n+1), and x_127 = n so that 8 bits also spans 0..255). wmin = 0, wmax = n: s = 1, |wmin| > |wmax| is false,
 * so edge = n, s = -1, q0 = round(n / -1) = -n, scale = n / -n = -1,
 * bias = n: codes are n - x_j, reversed order, exact round trip. */
TEST(every_width_reversed_ramp) {
  static const int widths[] = {2, 3, 4, 5, 6, 8};
  for (int w = 0; w < 6; w++) {
    int bits = widths[w], n = (1 << bits) - 1;
    float x[128], s, b;
    uint32_t wq[32] = {0};
    for (int j = 0; j < 128; j++) x[j] = (float)(j == 127 ? n : j % (n + 1));
    quant_f32(x, 128, bits, 128, wq, &s, &b);
    test_note("bits=%d", bits);
    CHECK(s == -1.0f);
    CHECK(b == (float)n);
    int got[128];
    codes_of(wq, 128, bits, got);
    for (int j = 0; j < 128; j++) CHECK_EQ(got[j], n - (int)x[j]);
    /* Bit stream: code j occupies bits [j*bits, (j+1)*bits). Rebuild the
     * words independently with a 64-bit shift register. */
    uint32_t want[32] = {0};
    for (int j = 0; j < 128; j++) {
      int bit = j * bits;
      uint64_t v = (uint64_t)(n - (int)x[j]) << (bit % 32);
      want[bit / 32] |= (uint32_t)v;
      if (bit % 32 + bits > 32) want[bit / 32 + 1] |= (uint32_t)(v >> 32);
    }
    CHECK(memcmp(wq, want, (size_t)(128 * bits / 32) * 4) == 0);
  }
}

/* Straddling positions named in the spec: 3-bit element 10 uses bits 30..32,
 * 5-bit element 6 bits 30..34, 6-bit element 5 bits 30..35. */
TEST(straddling_codes) {
  struct { int bits, elem; } cases[] = {{3, 10}, {5, 6}, {6, 5}};
  for (int c = 0; c < 3; c++) {
    int bits = cases[c].bits, e = cases[c].elem, n = (1 << bits) - 1;
    uint32_t wq[8] = {0};
    uint32_t code = (uint32_t)n & 0x15u; /* a pattern with both halves set */
    code |= 1u;
    int bit = e * bits;
    wq[bit / 32] |= code << (bit % 32);
    wq[bit / 32 + 1] |= code >> (32 - bit % 32);
    CHECK_EQ(rlm__quant_get(wq, e, bits), code);
    CHECK_EQ(bit / 32, 0);
    CHECK((bit % 32) + bits > 32);
  }
}

TEST(constant_positive_group) {
  /* wmax = wmin = c: s = eps, edge = c, codes 0, bias = c, exact. */
  float x[64], s, b;
  uint32_t wq[8];
  for (int j = 0; j < 64; j++) x[j] = 1.0f;
  quant_f32(x, 64, 4, 64, wq, &s, &b);
  for (int i = 0; i < 8; i++) CHECK_EQ(wq[i], 0);
  CHECK(b == 1.0f);
  CHECK(s == 1.0f / roundf(1.0f / -1e-7f));
}

TEST(all_negative_group_gpu_rule) {
  /* GPU rule: wmax starts at 0, so for all x = -2: wmin = -2, wmax = 0,
   * s = 2/n, edge = -2, q0 = -n, scale = 2/n, bias = -2, codes 0.
   * (MLX's CPU kernel would give scale -1e-7 here.) */
  static const int widths[] = {2, 3, 4, 5, 6, 8};
  for (int w = 0; w < 6; w++) {
    int bits = widths[w], n = (1 << bits) - 1;
    float x[32], s, b;
    uint32_t wq[8];
    for (int j = 0; j < 32; j++) x[j] = -2.0f;
    quant_f32(x, 32, bits, 32, wq, &s, &b);
    test_note("bits=%d", bits);
    CHECK(b == -2.0f);
    CHECK(s == -2.0f / (float)-n);
    for (int i = 0; i < bits; i++) CHECK_EQ(wq[i], 0);
  }
}

TEST(all_zero_group) {
  float x[32] = {0}, s, b;
  uint32_t wq[4];
  quant_f32(x, 32, 4, 32, wq, &s, &b);
  CHECK(s == -1e-7f);
  CHECK(b == 0.0f);
  for (int i = 0; i < 4; i++) CHECK_EQ(wq[i], 0);
  float out[32];
  rlm_qmat w = {wq, &s, &b, RLM_DTYPE_F32, 1, 32, 4, 32};
  rlm__dequantize_rows_ref(&w, out);
  for (int j = 0; j < 32; j++) CHECK(out[j] == 0.0f);
}

TEST(ties_round_half_away_from_zero) {
  /* 2-bit: x = {3, 0, 2.5, 0.5, 0...}: s = 1 -> edge 3, scale -1, bias 3.
   * (2.5-3)/-1 = 0.5 -> 1 (rint would give 0);
   * (0.5-3)/-1 = 2.5 -> 3 (rint would give 2). */
  float x[32] = {3.0f, 0.0f, 2.5f, 0.5f}, s, b;
  uint32_t wq[2];
  quant_f32(x, 32, 2, 32, wq, &s, &b);
  CHECK(s == -1.0f);
  CHECK(b == 3.0f);
  int got[4];
  codes_of(wq, 4, 2, got);
  CHECK_EQ(got[0], 0);
  CHECK_EQ(got[1], 3);
  CHECK_EQ(got[2], 1);
  CHECK_EQ(got[3], 3);
}

TEST(tiny_range) {
  /* Range below eps*n: s = 1e-7, q0 = round(-0.1) = 0, bias 0. */
  float x[32] = {0}, s, b;
  for (int j = 0; j < 32; j += 2) x[j] = 1e-8f;
  uint32_t wq[4];
  quant_f32(x, 32, 4, 32, wq, &s, &b);
  CHECK(s == -1e-7f);
  CHECK(b == 0.0f);
  for (int i = 0; i < 4; i++) CHECK_EQ(wq[i], 0);
}

TEST(f16_extremes) {
  /* x in {65504, -65504}, 4-bit: equal magnitudes -> edge = wmax = 65504,
   * s = -131008/15, q0 = round(-7.5) = -8, scale = -8188, bias = 65504;
   * -65504 codes as round(16) clamped to 15. 8-bit: q0 = -128,
   * scale = -511.75 (exact in f16), -65504 -> 256 -> 255. */
  uint16_t x[32];
  for (int j = 0; j < 32; j++) x[j] = rlm__f32_to_f16(j % 2 ? -65504.0f : 65504.0f);
  uint16_t s, b;
  uint32_t wq[8];
  rlm__quantize_rows_ref(x, RLM_DTYPE_F16, 1, 32, 4, 32, wq, &s, &b);
  CHECK(rlm__f16_to_f32(s) == -8188.0f);
  CHECK(rlm__f16_to_f32(b) == 65504.0f);
  CHECK_EQ(rlm__quant_get(wq, 0, 4), 0);
  CHECK_EQ(rlm__quant_get(wq, 1, 4), 15);
  rlm__quantize_rows_ref(x, RLM_DTYPE_F16, 1, 32, 8, 32, wq, &s, &b);
  CHECK(rlm__f16_to_f32(s) == -511.75f);
  CHECK_EQ(rlm__quant_get(wq, 1, 8), 255);
}

/* Dequantize in f32 from the stored scale/bias (what products and attention
 * use) and check the error bound per element:
 *   inside the coded range: |x - x^| <= |s|/2 + q|s - sT| + |b - bT|
 *   clipped extreme:        |x - x^| <= |s|   + q|s - sT| + |b - bT|
 * where s, b are the f32 parameters and sT, bT the stored ones (equal for
 * f32 input; the extra terms are the storage rounding of bf16/f16). */
static int check_bounds(const float *xf, const void *x, rlm_dtype dt, int cols,
                        int bits, int g) {
  uint32_t wq[128 * 8 / 32 * 4];
  uint16_t s16[8], b16[8];
  float s32[8], b32[8];
  void *sp = dt == RLM_DTYPE_F32 ? (void *)s32 : (void *)s16;
  void *bp = dt == RLM_DTYPE_F32 ? (void *)b32 : (void *)b16;
  rlm__quantize_rows_ref(x, dt, 1, cols, bits, g, wq, sp, bp);
  int bad = 0;
  for (int gi = 0; gi < cols / g; gi++) {
    float wmin = FLT_MAX, wmax = 0, s, b;
    for (int j = 0; j < g; j++) {
      wmin = fminf(wmin, xf[gi * g + j]);
      wmax = fmaxf(wmax, xf[gi * g + j]);
    }
    rlm__quant_group_params(wmin, wmax, bits, &s, &b);
    float sT = rlm__load_f(sp, dt, gi), bT = rlm__load_f(bp, dt, gi);
    float lo = fminf(b, b + s * (float)((1 << bits) - 1));
    float hi = fmaxf(b, b + s * (float)((1 << bits) - 1));
    for (int j = 0; j < g; j++) {
      int c = gi * g + j;
      float q = (float)rlm__quant_get(wq, c, bits);
      double err = fabs((double)xf[c] - ((double)q * sT + bT));
      double extra = q * fabs((double)s - sT) + fabs((double)b - bT) + 1e-6 * fabs(xf[c]);
      bool inside = xf[c] >= lo && xf[c] <= hi;
      double bound = (inside ? 0.5 : 1.0) * fabs(s) + extra;
      if (err > bound * (1 + 1e-5)) bad++;
    }
  }
  return bad;
}

TEST(round_trip_error_bounds) {
  uint64_t seed = 1234;
  static const int widths[] = {2, 3, 4, 5, 6, 8}, groups[] = {32, 64, 128};
  for (int it = 0; it < 300; it++) {
    int bits = widths[it % 6], g = groups[(it / 6) % 3], cols = g * (1 + it % 4);
    float xf[512];
    uint16_t xh[512];
    float scale = powf(10.0f, t_rng_float(&seed, -3, 3));
    float shift = (it % 5 == 0) ? -2 * scale : 0; /* some all-negative */
    for (int j = 0; j < cols; j++) xf[j] = t_rng_normal(&seed) * scale + shift;
    rlm_dtype dt = (rlm_dtype)(it % 3); /* F32, F16, BF16 */
    if (dt != RLM_DTYPE_F32) {
      for (int j = 0; j < cols; j++) {
        xh[j] = dt == RLM_DTYPE_F16 ? rlm__f32_to_f16(xf[j]) : rlm__f32_to_bf16(xf[j]);
        xf[j] = rlm__load_f(xh, dt, j);
      }
    }
    test_note("iteration %d bits=%d g=%d dtype=%d seed=1234", it, bits, g, dt);
    CHECK_EQ(check_bounds(xf, dt == RLM_DTYPE_F32 ? (void *)xf : (void *)xh, dt, cols, bits, g), 0);
  }
}

/* Products: y = x . W^T against the dequantized matrix, in double. */
TEST(matmul_matches_dequantized) {
  uint64_t seed = 99;
  int rows = 7, cols = 256, m = 3;
  float w[7 * 256], x[3 * 256], y[3 * 7], xsum[3 * 4];
  uint32_t wq[7 * 256 * 8 / 32];
  float s[7 * 8], b[7 * 8], deq[7 * 256];
  for (int i = 0; i < rows * cols; i++) w[i] = t_rng_normal(&seed);
  for (int i = 0; i < m * cols; i++) x[i] = t_rng_normal(&seed);
  static const int widths[] = {2, 3, 4, 5, 6, 8};
  for (int k = 0; k < 6; k++) {
    int bits = widths[k], g = 64;
    rlm__quantize_rows_ref(w, RLM_DTYPE_F32, rows, cols, bits, g, wq, s, b);
    rlm_qmat q = {wq, s, b, RLM_DTYPE_F32, rows, cols, bits, g};
    rlm__dequantize_rows_ref(&q, deq);
    rlm__group_sums(x, m, cols, g, xsum);
    rlm__qmatmul_ref(&q, x, xsum, m, 0, rows, y);
    for (int i = 0; i < m; i++)
      for (int o = 0; o < rows; o++) {
        double ref = 0, mag = 0;
        for (int c = 0; c < cols; c++) {
          ref += (double)x[i * cols + c] * deq[o * cols + c];
          mag += fabs((double)x[i * cols + c] * deq[o * cols + c]);
        }
        test_note("bits=%d i=%d o=%d", bits, i, o);
        CHECK_NEAR(y[i * rows + o], ref, 1e-5 * mag + 1e-6);
      }
  }
}

/* G = 16 (GGUF's Q6_K, quant.h): rlm__qmatmul, inline and over a pool,
 * close to the dequantized product; for B = 4 and 8 exactly the
 * reference's results (it takes the reference kernels; B = 2 and 6 take
 * the SIMD any-bits path, held to the reference in test_quant_fast);
 * int8 activations refused. */
TEST(group16_products) {
  enum { ROWS = 40, COLS = 256, M = 3, G = 16 };
  static float w[ROWS * COLS], deq[ROWS * COLS], s[ROWS * COLS / G], b[ROWS * COLS / G];
  static uint32_t wq[ROWS * COLS * 8 / 32];
  float x[M * COLS], xsum[M * COLS / G], y[M * ROWS], want[M * ROWS];
  uint64_t seed = 16;
  for (int i = 0; i < ROWS * COLS; i++) w[i] = t_rng_normal(&seed);
  for (int i = 0; i < M * COLS; i++) x[i] = t_rng_normal(&seed);
  CHECK(rlm__qmat_format_ok(6, 16) && rlm__qmat_format_ok(4, 16) && rlm__qmat_format_ok(8, 16));
  CHECK(!rlm__qmat_format_ok(5, 16) && !rlm__qmat_format_ok(3, 16) && !rlm__qmat_format_ok(6, 8));
  CHECK(!rlm__quant_group_ok(16)); /* quantizing and KV caches: still 32, 64, 128 */
  rlm_pool *pool = NULL;
  CHECK_EQ(rlm__pool_create(&pool, 2, NULL), RLM_OK);
  static const int widths[] = {2, 4, 6, 8};
  for (int k = 0; k < 4; k++) {
    const int bits = widths[k];
    rlm__quantize_rows_ref(w, RLM_DTYPE_F32, ROWS, COLS, bits, G, wq, s, b);
    rlm_qmat q = {wq, s, b, RLM_DTYPE_F32, ROWS, COLS, bits, G};
    CHECK(!rlm__q8act_ok(&q));
    rlm__dequantize_rows_ref(&q, deq);
    for (int m = 1; m <= M; m += M - 1) {
      rlm__group_sums(x, m, COLS, G, xsum);
      rlm__qmatmul_ref(&q, x, xsum, m, 0, ROWS, want);
      for (int p = 0; p < 2; p++) {
        memset(y, 0, sizeof y);
        rlm__qmatmul(p ? pool : NULL, &q, x, m, xsum, y);
        test_note("bits=%d m=%d pool=%d", bits, m, p);
        if (bits == 4 || bits == 8) CHECK(!memcmp(y, want, (size_t)(m * ROWS) * sizeof *y));
      }
      for (int i = 0; i < m * ROWS; i++) {
        double ref = 0, mag = 0;
        for (int c = 0; c < COLS; c++) {
          ref += (double)x[i / ROWS * COLS + c] * deq[i % ROWS * COLS + c];
          mag += fabs((double)x[i / ROWS * COLS + c] * deq[i % ROWS * COLS + c]);
        }
        CHECK_NEAR(y[i], ref, 1e-5 * mag + 1e-6);
      }
    }
  }
  rlm__pool_free(pool);
}

TEST(public_api_checks) {
  float x[64] = {0}, s[2], b[2], y[1];
  uint32_t wq[8];
  rlm_error err = {0};
  CHECK_EQ(rlm_quantize(x, RLM_DTYPE_F32, 1, 64, 7, 32, wq, s, b, &err), RLM_ERR_INVALID);
  CHECK_STR_CONTAINS(err.msg, "bits=7");
  CHECK_EQ(rlm_quantize(x, RLM_DTYPE_F32, 1, 64, 4, 48, wq, s, b, &err), RLM_ERR_INVALID);
  CHECK_STR_CONTAINS(err.msg, "group size 48");
  CHECK_EQ(rlm_quantize(x, RLM_DTYPE_F32, 1, 48, 4, 32, wq, s, b, &err), RLM_ERR_INVALID);
  CHECK_EQ(rlm_quantize(x, RLM_DTYPE_U32, 1, 64, 4, 32, wq, s, b, &err), RLM_ERR_UNSUPPORTED);
  CHECK_EQ(rlm_quantize(NULL, RLM_DTYPE_F32, 1, 64, 4, 32, wq, s, b, NULL), RLM_ERR_INVALID);
  CHECK_EQ(rlm_quantize(x, RLM_DTYPE_F32, 1, 64, 4, 32, wq, s, b, &err), RLM_OK);
  CHECK_EQ(rlm_dequantize(wq, s, b, RLM_DTYPE_F32, 1, 64, 4, 32, x, &err), RLM_OK);
  CHECK_EQ(rlm_quantized_matmul(x, 1, wq, s, b, RLM_DTYPE_F32, 1, 64, 4, 32, y, 1, &err), RLM_OK);
  CHECK_EQ(rlm_quantized_matmul(x, 1, wq, s, b, RLM_DTYPE_F32, 1, 64, 4, 64, y, 2, &err), RLM_OK);
  CHECK_EQ(rlm_quantized_matmul(x, 1, wq, s, b, RLM_DTYPE_F32, 1, 60, 4, 32, y, 1, &err),
           RLM_ERR_INVALID);
}

int main(void) {
  RUN(worked_example_4bit);
  RUN(worked_example_3bit);
  RUN(every_width_reversed_ramp);
  RUN(straddling_codes);
  RUN(constant_positive_group);
  RUN(all_negative_group_gpu_rule);
  RUN(all_zero_group);
  RUN(ties_round_half_away_from_zero);
  RUN(tiny_range);
  RUN(f16_extremes);
  RUN(round_trip_error_bounds);
  RUN(matmul_matches_dequantized);
  RUN(group16_products);
  RUN(public_api_checks);
  return test_summary();
}
