/* test_gguf_quant.c -- GGUF tensors converted to ringlm weights
 * (src/model/gguf_quant.c) against an independent per-element scalar
 * dequantizer written here from the ggml block layouts, and against
 * scripts/gguf_ref.py.
 *
 * For every supported type: random blocks (random f16 d / dmin / m, among
 * them zeros, negatives, subnormals and large ones; random codes and
 * sub-block scales) in a GGUF image, converted; then (a) every element of
 * the converted matrix, dequantized by quant.h's reference, equals the
 * scalar dequantizer's f32 value (as numbers: only a zero's sign may
 * differ, see gguf_quant.h), and (b) the model's product entry points
 * (rlm__linear, and rlm__linear_q8 for Q6_K's group size 16, which must
 * fall back to the exact product) match the product with those values, in
 * double, within 1e-5 of sum |x w|. Plus: unsupported types, tensors that
 * are not 2-D or not whole blocks, unaligned dense data, an allocation
 * failure, the Python reference bit for bit on a file of every type, and
 * the conversion speed (printed). */
#include "model/gguf_quant.h"
#include "gguf_write.h"
#include "test.h"

#include <time.h>

/* ---- random GGUF images -------------------------------------------------- */

typedef struct tspec {
  const char *name;
  uint32_t type;
  uint32_t n_dims;
  uint64_t dims[4];
  uint8_t *data;     /* malloc'd */
  size_t nbytes;
} tspec;

/* A finite f16: mostly moderate values of either sign, sometimes zero, a
 * subnormal or a large one. */
static uint16_t rand_f16(uint64_t *seed) {
  const uint64_t r = t_rng_next(seed);
  switch (r % 16) {
  case 0: return 0;
  case 1: return (uint16_t)(1 + (r >> 8) % 0x3ff) | (uint16_t)((r >> 20 & 1) << 15); /* subnormal */
  case 2: return rlm__f32_to_f16(t_rng_float(seed, -3000.0f, 3000.0f));
  default: return rlm__f32_to_f16(t_rng_normal(seed) * 0.02f);
  }
}

static void put_f16(uint8_t *p, uint16_t h) { p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8); }

/* Byte offsets of the f16 fields of one block of each quantized type. */
static int f16_fields(uint32_t type, int *off) {
  switch (type) {
  case RLM_GGML_TYPE_Q8_0: case RLM_GGML_TYPE_Q4_0: case RLM_GGML_TYPE_Q5_0: off[0] = 0; return 1;
  case RLM_GGML_TYPE_Q4_1: case RLM_GGML_TYPE_Q5_1: case RLM_GGML_TYPE_Q4_K:
  case RLM_GGML_TYPE_Q5_K: off[0] = 0, off[1] = 2; return 2;
  case RLM_GGML_TYPE_Q6_K: off[0] = 208; return 1;
  default: return 0;
  }
}

/* n elements of `type`: random codes and scales, f16 fields from rand_f16,
 * dense values finite. */
static uint8_t *rand_data(uint32_t type, int64_t n, uint64_t *seed, size_t *nbytes) {
  uint32_t block = 1, bytes = 1;
  CHECK(rlm__ggml_type_block(type, &block, &bytes));
  *nbytes = (size_t)(n / block) * bytes;
  uint8_t *p = xmalloc(*nbytes);
  for (size_t i = 0; i < *nbytes; i++) p[i] = (uint8_t)t_rng_next(seed);
  for (int64_t i = 0; i < n && block == 1; i++) {
    const float v = t_rng_normal(seed);
    if (type == RLM_GGML_TYPE_F32) memcpy(p + 4 * i, &v, 4);
    else if (type == RLM_GGML_TYPE_F16) put_f16(p + 2 * i, rand_f16(seed));
    else if (type == RLM_GGML_TYPE_BF16) put_f16(p + 2 * i, rlm__f32_to_bf16(v));
  }
  int off[2];
  const int nf = f16_fields(type, off);
  for (int64_t b = 0; b < n / block; b++)
    for (int k = 0; k < nf; k++) put_f16(p + b * bytes + off[k], rand_f16(seed));
  return p;
}

static tspec rand_tensor(const char *name, uint32_t type, int64_t rows, int64_t cols, uint64_t *seed) {
  tspec t = {name, type, 2, {(uint64_t)cols, (uint64_t)rows, 1, 1}, NULL, 0};
  t.data = rand_data(type, rows * cols, seed, &t.nbytes);
  return t;
}

/* A GGUF v3 image holding the tensors (alignment 32, or `align` as
 * general.alignment when nonzero; offsets packed as tight as it allows). */
static void build_image(gw *w, const tspec *ts, int n, uint32_t align) {
  const uint64_t a = align ? align : 32;
  gw_header(w, 3, (uint64_t)n, align ? 1 : 0);
  if (align) gw_kv_u32(w, "general.alignment", align);
  uint64_t off = 0;
  for (int i = 0; i < n; i++) {
    gw_tensor(w, ts[i].name, ts[i].n_dims, ts[i].dims, ts[i].type, off);
    off += (ts[i].nbytes + a - 1) / a * a;
  }
  gw_pad(w, a);
  for (int i = 0; i < n; i++) {
    gw_bytes(w, ts[i].data, ts[i].nbytes);
    if (i + 1 < n) gw_pad(w, a);
  }
}

static rlm_gguf *open_image(const gw *w) {
  rlm_gguf *g = NULL;
  rlm_error err = {0};
  rlm_status rc = rlm__gguf_open_memory(&g, "mem.gguf", w->p, w->n, &err);
  if (rc) fprintf(stderr, "  open: %s\n", err.msg);
  CHECK_EQ(rc, RLM_OK);
  return g;
}

/* ---- the independent dequantizer: element e of one block ------------------ */

static float f16v(const uint8_t *p) { return rlm__f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* Nibble e % 16 of qs[16], low for e < 16 (Q4_0, Q4_1, Q5_0, Q5_1). */
static int nib32(const uint8_t *qs, int e) { return e < 16 ? qs[e] & 15 : qs[e - 16] >> 4; }

static int bit_of(const uint8_t *bytes, int i) { return bytes[i / 8] >> (i % 8) & 1; }

/* Q4_K / Q5_K: 6-bit scale (which = 0) or min (which = 1) of sub-block j. */
static int k6(const uint8_t *s, int j, int which) {
  if (j < 4) return s[j + 4 * which] & 63;
  const int low = which ? s[j + 4] >> 4 : s[j + 4] & 15;
  return low + 16 * (s[j - 4 + 4 * which] >> 6);
}

static float ref_k(const uint8_t *blk, int e, int q) {
  const int j = e / 32;
  const float d1 = f16v(blk) * (float)k6(blk + 4, j, 0);
  const float m1 = f16v(blk + 2) * (float)k6(blk + 4, j, 1);
  return d1 * (float)q - m1;
}

static float ref_value(uint32_t type, const uint8_t *blk, int e) {
  switch (type) {
  case RLM_GGML_TYPE_Q8_0: return f16v(blk) * (float)(int8_t)blk[2 + e];
  case RLM_GGML_TYPE_Q4_0: return f16v(blk) * (float)(nib32(blk + 2, e) - 8);
  case RLM_GGML_TYPE_Q4_1: return f16v(blk) * (float)nib32(blk + 4, e) + f16v(blk + 2);
  case RLM_GGML_TYPE_Q5_0: return f16v(blk) * (float)((nib32(blk + 6, e) | bit_of(blk + 2, e) << 4) - 16);
  case RLM_GGML_TYPE_Q5_1:
    return f16v(blk) * (float)(nib32(blk + 8, e) | bit_of(blk + 4, e) << 4) + f16v(blk + 2);
  case RLM_GGML_TYPE_Q4_K: {
    const int j = e / 32, l = e % 32;
    return ref_k(blk, e, blk[16 + 32 * (j / 2) + l] >> (j % 2 ? 4 : 0) & 15);
  }
  case RLM_GGML_TYPE_Q5_K: {
    const int j = e / 32, l = e % 32;
    const int lo = blk[48 + 32 * (j / 2) + l] >> (j % 2 ? 4 : 0) & 15;
    return ref_k(blk, e, lo + 16 * (blk[16 + l] >> j & 1));
  }
  case RLM_GGML_TYPE_Q6_K: {
    const int h = e / 128, i = e % 128 / 32, l = e % 32; /* half, quarter, lane */
    const uint8_t qlb = blk[64 * h + 32 * (i % 2) + l];
    const int lo = i < 2 ? qlb & 15 : qlb >> 4, hi = blk[128 + 32 * h + l] >> (2 * i) & 3;
    const float d = f16v(blk + 208) * (float)(int8_t)blk[192 + e / 16];
    return d * (float)(lo + 16 * hi - 32);
  }
  case RLM_GGML_TYPE_F32: { float v; memcpy(&v, blk, 4); return v; }
  case RLM_GGML_TYPE_F16: return f16v(blk);
  case RLM_GGML_TYPE_BF16: return rlm__bf16_to_f32((uint16_t)(blk[0] | blk[1] << 8));
  default: return NAN;
  }
}

/* The whole tensor by ref_value, [n_elements]. */
static float *ref_tensor(const tspec *t) {
  uint32_t block = 1, bytes = 1;
  rlm__ggml_type_block(t->type, &block, &bytes);
  const int64_t n = (int64_t)(t->dims[0] * t->dims[1]);
  float *out = xmalloc((size_t)n * sizeof *out);
  for (int64_t i = 0; i < n; i++) out[i] = ref_value(t->type, t->data + i / block * bytes, (int)(i % block));
  return out;
}

/* The converted layer's weights as f32 [out][in]. */
static float *layer_values(const rlm_linear *l) {
  float *out = xmalloc((size_t)(l->out * l->in) * sizeof *out);
  const rlm_qmat *q = &l->q;
  const int64_t ng = l->in / (l->quant ? q->group_size : 1);
  /* q*s + b in f32, as the products compute it (rlm__dequantize_rows_ref
   * would round it to f16 scales' dtype, MLX's dequantize semantics) */
  for (int64_t o = 0; l->quant && o < l->out; o++)
    for (int64_t c = 0; c < l->in; c++) {
      const int64_t gi = o * ng + c / q->group_size;
      out[o * l->in + c] = (float)rlm__quant_get(q->wq + o * rlm__quant_row_words(q->cols, q->bits), c, q->bits) *
                               rlm__load_f(q->scales, q->sdtype, gi) + rlm__load_f(q->biases, q->sdtype, gi);
    }
  if (!l->quant)
    for (int64_t i = 0; i < l->out * l->in; i++) out[i] = rlm__load_f(l->w, l->dtype, i);
  return out;
}

/* Equal as numbers (a zero's sign may differ), or both NaN. */
static int64_t count_mismatches(const float *a, const float *b, int64_t n, int64_t *first) {
  int64_t bad = 0;
  *first = -1;
  for (int64_t i = 0; i < n; i++)
    if (!(a[i] == b[i] || (isnan(a[i]) && isnan(b[i])))) {
      if (!bad++) *first = i;
    }
  return bad;
}

/* ---- per type ---------------------------------------------------------------- */

typedef struct expect {
  uint32_t type;
  bool quant;
  int bits, group;
} expect;

static const expect TYPES[] = {
    {RLM_GGML_TYPE_F32, false, 0, 0},  {RLM_GGML_TYPE_F16, false, 0, 0}, {RLM_GGML_TYPE_BF16, false, 0, 0},
    {RLM_GGML_TYPE_Q8_0, true, 8, 32}, {RLM_GGML_TYPE_Q4_0, true, 4, 32}, {RLM_GGML_TYPE_Q4_1, true, 4, 32},
    {RLM_GGML_TYPE_Q5_0, true, 5, 32}, {RLM_GGML_TYPE_Q5_1, true, 5, 32}, {RLM_GGML_TYPE_Q4_K, true, 4, 32},
    {RLM_GGML_TYPE_Q5_K, true, 5, 32}, {RLM_GGML_TYPE_Q6_K, true, 6, 16},
};

/* y = x W^T through the model's entry points against the values in double. */
static void check_products(const rlm_linear *l, const float *vals, uint64_t *seed) {
  enum { M = 3 };
  const int64_t rows = l->out, cols = l->in;
  float *x = xmalloc((size_t)(M * cols) * sizeof *x), *y = xmalloc((size_t)(M * rows) * sizeof *y);
  float *y8 = xmalloc((size_t)(M * rows) * sizeof *y8), *xsum = xmalloc((size_t)(M * cols) * sizeof *xsum);
  void *q8 = xmalloc(rlm__qmatmul_q8_bytes(M, cols, 32));
  for (int64_t i = 0; i < M * cols; i++) x[i] = t_rng_normal(seed);
  for (int m = 1; m <= M; m += M - 1) {
    rlm__linear(NULL, l, x, m, y, xsum);
    int64_t bad = 0;
    for (int64_t i = 0; i < m * rows; i++) {
      double ref = 0, mag = 0;
      for (int64_t c = 0; c < cols; c++) {
        const double p = (double)x[i / rows * cols + c] * vals[i % rows * cols + c];
        ref += p, mag += fabs(p);
      }
      bad += !(fabs(y[i] - ref) <= 1e-5 * mag + 1e-30);
    }
    test_note("product m=%d", m);
    CHECK_EQ(bad, 0);
    if (l->quant && l->q.group_size < 32) { /* int8 activations refused: the same exact product */
      CHECK(!rlm__q8act_ok(&l->q));
      rlm__linear_q8(NULL, l, x, m, y8, q8);
      CHECK(!memcmp(y, y8, (size_t)(m * rows) * sizeof *y));
    }
  }
  free(x), free(y), free(y8), free(xsum), free(q8);
}

static rlm_pool *g_pool; /* 2 threads */

/* Converted over the pool: the same arrays, byte for byte. */
static void check_pool_same(const rlm_gguf *g, const rlm_gguf_tensor *gt, const rlm_linear *l) {
  rlm_arena arena;
  rlm__arena_init(&arena, 0);
  rlm_linear p;
  CHECK_EQ(rlm__gguf_linear(g_pool, &arena, g, gt, &p, NULL), RLM_OK);
  if (l->quant && p.quant) {
    const size_t n = (size_t)(l->out * l->in), ng = n / (size_t)l->q.group_size;
    CHECK(!memcmp(p.q.wq, l->q.wq, n * (size_t)l->q.bits / 8));
    const size_t sb = ng * rlm_dtype_size(l->q.sdtype);
    CHECK_EQ(p.q.sdtype, l->q.sdtype);
    CHECK(!memcmp(p.q.scales, l->q.scales, sb) && !memcmp(p.q.biases, l->q.biases, sb));
  }
  rlm__arena_free(&arena);
}

static void check_type(const expect *ex, int64_t rows, int64_t cols, uint64_t seed) {
  tspec t = rand_tensor("blk.0.ffn_down.weight", ex->type, rows, cols, &seed);
  gw w = {0};
  build_image(&w, &t, 1, 0);
  rlm_gguf *g = open_image(&w);
  rlm_arena arena;
  rlm__arena_init(&arena, 0);
  rlm_linear l;
  rlm_error err = {0};
  const rlm_gguf_tensor *gt = g ? rlm__gguf_tensor_find(g, t.name) : NULL;
  CHECK(gt != NULL);
  rlm_status rc = gt ? rlm__gguf_linear(NULL, &arena, g, gt, &l, &err) : RLM_ERR_NOT_FOUND;
  test_note("%s %lldx%lld: %s", rlm__ggml_type_name(ex->type), (long long)rows, (long long)cols, err.msg);
  CHECK_EQ(rc, RLM_OK);
  if (!rc) {
    CHECK_EQ(l.out, rows);
    CHECK_EQ(l.in, cols);
    CHECK_EQ(l.quant, ex->quant);
    if (l.quant) {
      CHECK_EQ(l.q.bits, ex->bits);
      CHECK_EQ(l.q.group_size, ex->group);
      /* f16 for the d-and-m types unless a value does not fit; K-quants f32 */
      CHECK(l.q.sdtype == RLM_DTYPE_F32 || l.q.sdtype == RLM_DTYPE_F16);
      if (ex->type == RLM_GGML_TYPE_Q4_K || ex->type == RLM_GGML_TYPE_Q5_K || ex->type == RLM_GGML_TYPE_Q6_K)
        CHECK_EQ(l.q.sdtype, RLM_DTYPE_F32);
      CHECK(rlm__qmat_format_ok(l.q.bits, l.q.group_size));
    }
    float *want = ref_tensor(&t), *got = layer_values(&l);
    int64_t first;
    const int64_t bad = count_mismatches(got, want, rows * cols, &first);
    if (bad) fprintf(stderr, "  element %lld: %.9g, want %.9g\n", (long long)first, got[first], want[first]);
    CHECK_EQ(bad, 0);
    check_products(&l, want, &seed);
    free(want), free(got);
    check_pool_same(g, gt, &l);
  }
  rlm__arena_free(&arena);
  rlm__gguf_free(g);
  free(w.p), free(t.data);
}

TEST(every_type_exact) {
  CHECK_EQ(rlm__pool_create(&g_pool, 2, NULL), RLM_OK);
  for (size_t i = 0; i < sizeof TYPES / sizeof *TYPES; i++) {
    uint32_t block = 1, bytes = 1;
    rlm__ggml_type_block(TYPES[i].type, &block, &bytes);
    const int64_t b = block < 32 ? 32 : block;
    check_type(&TYPES[i], 1, b, 100 + i);         /* one block (a few for dense) */
    check_type(&TYPES[i], 37, 3 * b, 200 + i);    /* rows over the pool's grain */
    check_type(&TYPES[i], 5, 2048, 300 + i);      /* a model-like row */
  }
  rlm__pool_free(g_pool);
  g_pool = NULL;
}

/* ---- refusals ------------------------------------------------------------- */

static rlm_status convert_named(rlm_gguf *g, const char *name, rlm_error *err) {
  rlm_arena arena;
  rlm__arena_init(&arena, 0);
  rlm_linear l;
  memset(&l, 0xab, sizeof l);
  const rlm_gguf_tensor *t = rlm__gguf_tensor_find(g, name);
  CHECK(t != NULL);
  rlm_status rc = t ? rlm__gguf_linear(NULL, &arena, g, t, &l, err) : RLM_ERR_NOT_FOUND;
  if (rc) CHECK(!l.out && !l.in && !l.quant && !l.w && !l.q.wq); /* zeroed on failure */
  rlm__arena_free(&arena);
  return rc;
}

/* Q8_0's bias -128 d is an f16 value until it overflows (|d| > 511.75):
 * f16 scales for a tensor of ordinary d, f32 (exact still) when one block's
 * d is 1000. */
TEST(scales_narrow_to_f16_only_when_exact) {
  uint64_t seed = 7;
  for (int big = 0; big < 2; big++) {
    tspec t = rand_tensor("w", RLM_GGML_TYPE_Q8_0, 4, 64, &seed);
    for (size_t b = 0; b < t.nbytes; b += 34) { /* every d 0.5, one 1000 when big */
      const uint16_t h = rlm__f32_to_f16(big && b == 34 * 5 ? 1000.0f : 0.5f);
      memcpy(t.data + b, &h, 2);
    }
    gw w = {0};
    build_image(&w, &t, 1, 0);
    rlm_gguf *g = open_image(&w);
    rlm_arena arena;
    rlm__arena_init(&arena, 0);
    rlm_linear l;
    CHECK(g && !rlm__gguf_linear(NULL, &arena, g, rlm__gguf_tensor_find(g, "w"), &l, NULL));
    if (g) {
      CHECK_EQ(l.q.sdtype, big ? RLM_DTYPE_F32 : RLM_DTYPE_F16);
      float *want = ref_tensor(&t), *got = layer_values(&l);
      int64_t first;
      CHECK_EQ(count_mismatches(got, want, 4 * 64, &first), 0);
      free(want), free(got);
    }
    rlm__arena_free(&arena);
    rlm__gguf_free(g);
    free(w.p), free(t.data);
  }
}

TEST(unsupported_and_malformed) {
  uint64_t seed = 7;
  tspec ts[] = {
      rand_tensor("t.q2k", RLM_GGML_TYPE_Q2_K, 2, 256, &seed),
      rand_tensor("t.iq4xs", RLM_GGML_TYPE_IQ4_XS, 2, 256, &seed),
      rand_tensor("t.f64", RLM_GGML_TYPE_F64, 2, 8, &seed),
      rand_tensor("t.q8_1", RLM_GGML_TYPE_Q8_1, 2, 32, &seed),
      rand_tensor("t.3d", RLM_GGML_TYPE_Q4_0, 2, 32, &seed),
      rand_tensor("t.1d", RLM_GGML_TYPE_F32, 1, 64, &seed),
      rand_tensor("t.q4k", RLM_GGML_TYPE_Q4_K, 2, 256, &seed),
  };
  ts[4].n_dims = 3, ts[4].dims[1] = 1, ts[4].dims[2] = 2; /* 32 x 1 x 2 */
  ts[5].n_dims = 1;
  const int n = N_OF(ts);
  gw w = {0};
  build_image(&w, ts, n, 0);
  rlm_gguf *g = open_image(&w);
  rlm_error err = {0};
  static const char *unsupported[][2] = {{"t.q2k", "Q2_K"}, {"t.iq4xs", "IQ4_XS"}, {"t.f64", "F64"},
                                         {"t.q8_1", "Q8_1"}};
  for (int i = 0; g && i < N_OF(unsupported); i++) {
    CHECK_EQ(convert_named(g, unsupported[i][0], &err), RLM_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(err.msg, unsupported[i][0]);
    CHECK_STR_CONTAINS(err.msg, unsupported[i][1]);
    CHECK_STR_CONTAINS(err.msg, "mem.gguf");
  }
  if (g) {
    CHECK_EQ(convert_named(g, "t.3d", &err), RLM_ERR_FORMAT);
    CHECK_STR_CONTAINS(err.msg, "'t.3d'");
    CHECK_STR_CONTAINS(err.msg, "3-D");
    CHECK_EQ(convert_named(g, "t.1d", &err), RLM_ERR_FORMAT);
    CHECK_STR_CONTAINS(err.msg, "'t.1d'");
  }
  /* Columns that are not whole blocks: the reader refuses such a file,
   * so the tensor is altered after reading. */
  const rlm_gguf_tensor *t = g ? rlm__gguf_tensor_find(g, "t.q4k") : NULL;
  CHECK(t != NULL);
  if (t) {
    rlm_gguf_tensor bad = *t;
    bad.dims[0] = 128, bad.dims[1] = 4; /* same elements, half-block rows */
    rlm_arena arena;
    rlm__arena_init(&arena, 0);
    rlm_linear l;
    CHECK_EQ(rlm__gguf_linear(NULL, &arena, g, &bad, &l, &err), RLM_ERR_FORMAT);
    CHECK_STR_CONTAINS(err.msg, "'t.q4k'");
    CHECK_STR_CONTAINS(err.msg, "256-element blocks");
    rlm__arena_free(&arena);
  }
  CHECK(!rlm__gguf_type_convertible(RLM_GGML_TYPE_Q2_K) && rlm__gguf_type_convertible(RLM_GGML_TYPE_Q6_K));
  rlm__gguf_free(g);
  free(w.p);
  for (int i = 0; i < n; i++) free(ts[i].data);
}

/* Dense data at an address not aligned for its dtype (alignment 1 allows
 * any offset) is copied, aligned; out of memory is RLM_ERR_NOMEM. */
TEST(unaligned_dense_and_nomem) {
  uint64_t seed = 11;
  tspec ts[2] = {rand_tensor("a", RLM_GGML_TYPE_F16, 1, 1, &seed),
                 rand_tensor("b", RLM_GGML_TYPE_F32, 3, 5, &seed)};
  gw w = {0};
  build_image(&w, ts, 2, 1);
  rlm_gguf *g = open_image(&w);
  const rlm_gguf_tensor *t = g ? rlm__gguf_tensor_find(g, "b") : NULL;
  CHECK(t != NULL && (uintptr_t)t->data % 4 != 0);
  rlm_arena arena;
  rlm__arena_init(&arena, 0);
  rlm_linear l;
  rlm_error err = {0};
  if (t && !rlm__gguf_linear(NULL, &arena, g, t, &l, &err)) {
    CHECK((uintptr_t)l.w % 4 == 0 && l.w != t->data);
    CHECK(!memcmp(l.w, ts[1].data, ts[1].nbytes));
  }
  rlm__arena_free(&arena);
  if (g) {
    rlm__alloc_fail_at(0); /* the copy's arena block */
    CHECK_EQ(convert_named(g, "b", &err), RLM_ERR_NOMEM);
    rlm__alloc_fail_at(-1);
  }
  /* A quantized tensor's arrays (large enough for a block each): every
   * allocation failed in turn, until the conversion goes through. */
  tspec q = rand_tensor("q", RLM_GGML_TYPE_Q6_K, 1000, 256, &seed);
  gw w2 = {0};
  build_image(&w2, &q, 1, 0);
  rlm_gguf *g2 = open_image(&w2);
  int nth = 0;
  for (rlm_status rc = RLM_ERR_NOMEM; g2 && rc == RLM_ERR_NOMEM && nth < 10; nth++) {
    rlm__alloc_fail_at(nth);
    rc = convert_named(g2, "q", &err);
    rlm__alloc_fail_at(-1);
    CHECK(rc == RLM_OK || rc == RLM_ERR_NOMEM);
  }
  CHECK(nth >= 2 && nth < 10); /* at least one failure seen, then success */
  rlm__gguf_free(g2), rlm__gguf_free(g);
  free(w2.p), free(w.p), free(q.data), free(ts[0].data), free(ts[1].data);
}

/* ---- scripts/gguf_ref.py --------------------------------------------------- */

/* A float32 .npy file's data (numpy's format 1.0/2.0 header), or NULL. */
static float *load_npy(const char *path, int64_t n) {
  size_t len = 0;
  char *p = t_read_file(path, &len);
  if (!p || len < 12 || memcmp(p, "\x93NUMPY", 6)) {
    free(p);
    return NULL;
  }
  const uint8_t *u = (const uint8_t *)p; /* version 1: u16 header length; 2: u32 */
  const size_t hlen = u[6] == 1 ? (size_t)(u[8] | u[9] << 8) : (size_t)(u[8] | u[9] << 8 | u[10] << 16);
  const size_t start = (u[6] == 1 ? 10 : 12) + hlen;
  float *out = NULL;
  if (strstr(p + 10, "'<f4'") && strstr(p + 10, "'fortran_order': False") && len == start + (size_t)n * 4) {
    out = xmalloc((size_t)n * 4);
    memcpy(out, p + start, (size_t)n * 4);
  }
  free(p);
  return out;
}

TEST(python_reference_bit_for_bit) {
  char out[8192], dir[256], file[320];
  if (t_run_cmd(out, sizeof out, "/usr/bin/python3 -c 'import numpy'") != 0) {
    t_skip("/usr/bin/python3 with numpy is needed for scripts/gguf_ref.py (%.200s)", out);
    return;
  }
  const char *src = t_env("RINGLM_SOURCE_DIR");
  uint64_t seed = 2026;
  enum { N = sizeof TYPES / sizeof *TYPES };
  tspec ts[N];
  static const char *names[N] = {"w.f32", "w.f16", "w.bf16", "w.q8_0", "w.q4_0", "w.q4_1",
                                 "w.q5_0", "w.q5_1", "w.q4_k", "w.q5_k", "w.q6_k"};
  for (int i = 0; i < N; i++) ts[i] = rand_tensor(names[i], TYPES[i].type, 3 + i, 512, &seed);
  gw w = {0};
  build_image(&w, ts, N, 0);
  t_tmpdir(dir, sizeof dir, "gguf-quant");
  snprintf(file, sizeof file, "%s/all.gguf", dir);
  FILE *f = fopen(file, "wb");
  CHECK(f && fwrite(w.p, 1, w.n, f) == w.n);
  if (f) fclose(f);
  const int rc =
      t_run_cmd(out, sizeof out, "/usr/bin/python3 '%s/scripts/gguf_ref.py' '%s' -o '%s/npy'", src, file, dir);
  if (rc) fprintf(stderr, "  gguf_ref.py: %s\n", out);
  CHECK_EQ(rc, 0);
  rlm_gguf *g = open_image(&w);
  for (int i = 0; g && !rc && i < N; i++) {
    char path[400];
    snprintf(path, sizeof path, "%s/npy/%s.npy", dir, names[i]);
    const int64_t n = (int64_t)(ts[i].dims[0] * ts[i].dims[1]);
    float *py = load_npy(path, n);
    test_note("%s", names[i]);
    CHECK(py != NULL);
    rlm_arena arena;
    rlm__arena_init(&arena, 0);
    rlm_linear l;
    if (py && !rlm__gguf_linear(NULL, &arena, g, rlm__gguf_tensor_find(g, names[i]), &l, NULL)) {
      float *c = layer_values(&l);
      int64_t first;
      const int64_t bad = count_mismatches(c, py, n, &first);
      if (bad)
        fprintf(stderr, "  %s element %lld: C %.9g, Python %.9g\n", names[i], (long long)first, c[first],
                py[first]);
      CHECK_EQ(bad, 0);
      free(c);
    }
    rlm__arena_free(&arena);
    free(py);
  }
  rlm__gguf_free(g);
  free(w.p);
  for (int i = 0; i < N; i++) free(ts[i].data);
  if (t_cur_failed == 0) {
    snprintf(out, sizeof out, "rm -rf '%s'", dir);
    CHECK(system(out) == 0);
  }
}

/* ---- speed (printed, not checked) ------------------------------------------ */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

TEST(conversion_speed) {
  static const uint32_t types[] = {RLM_GGML_TYPE_Q8_0, RLM_GGML_TYPE_Q4_0, RLM_GGML_TYPE_Q5_0,
                                   RLM_GGML_TYPE_Q4_K, RLM_GGML_TYPE_Q5_K, RLM_GGML_TYPE_Q6_K};
  const char *env = getenv("RINGLM_GGUF_SPEED_MB");
  const double mb = env ? atof(env) : 16.0;
  uint64_t seed = 5;
  rlm_pool *pool = NULL;
  CHECK_EQ(rlm__pool_create(&pool, 2, NULL), RLM_OK);
  for (int i = 0; i < N_OF(types); i++) {
    uint32_t block = 1, bytes = 1;
    rlm__ggml_type_block(types[i], &block, &bytes);
    const int64_t cols = 2048, rows = (int64_t)(mb * 1e6 / ((double)cols / block * bytes)) + 1;
    tspec t = rand_tensor("w", types[i], rows, cols, &seed);
    gw w = {0};
    build_image(&w, &t, 1, 0);
    free(t.data);
    rlm_gguf *g = open_image(&w);
    rlm_arena arena;
    rlm_linear l;
    double dt[2];
    for (int p = 0; p < 2; p++) {
      rlm__arena_init(&arena, 0);
      const double t0 = now_s();
      CHECK_EQ(g ? rlm__gguf_linear(p ? pool : NULL, &arena, g, rlm__gguf_tensor_find(g, "w"), &l, NULL)
                 : RLM_ERR_FORMAT, RLM_OK);
      dt[p] = now_s() - t0;
      rlm__arena_free(&arena);
    }
    printf("     %-5s %6.1f MB: %6.1f ms, %5.2f GB/s of GGUF data; 2 threads %6.1f ms, %5.2f GB/s\n",
           rlm__ggml_type_name(types[i]), (double)t.nbytes / 1e6, dt[0] * 1e3, (double)t.nbytes / 1e9 / dt[0],
           dt[1] * 1e3, (double)t.nbytes / 1e9 / dt[1]);
    rlm__gguf_free(g);
    free(w.p);
  }
  rlm__pool_free(pool);
}

int main(void) {
  RUN(every_type_exact);
  RUN(scales_narrow_to_f16_only_when_exact);
  RUN(unsupported_and_malformed);
  RUN(unaligned_dense_and_nomem);
  RUN(python_reference_bit_for_bit);
  RUN(conversion_speed);
  return test_summary();
}
