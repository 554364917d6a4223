/* test_attn.c -- position-masked attention (src/attn).
 *
 * The reference is checked against answers worked out by hand and against
 * a double-precision computation written here from attn.h's text (its own
 * mask rule, its own dequantization), so a bug shared by rlm__attn_visible
 * and both kernels would still show. Every fused variant the CPU supports
 * (scalar, avx2, avx512) is then checked against the reference on random
 * segments: mixed dense and quantized storage, all bit widths and group
 * sizes, windows and sinks, empty slots, shuffled slot order.
 *
 * Tolerance of a fused row against the reference row (see rows_ratio):
 *   max_e |fused - ref| <= 1e-5 * max_e |ref| + 1e-6 * mass
 * where mass = max_e sum_t p_t |v_te|, the size of the values being
 * averaged: a flat softmax over thousands of slots averages them down to
 * a row far smaller than its terms, and f32 rounding scales with the
 * terms. The bound is tight enough that a 1e-3 error in the scale, or a
 * window one position off, fails (fused_detects_wrong_args).
 *
 * Int8 queries (attn.h's int8_q) are approximate by design: their
 * section derives the bound they are held to (THE BOUND), checks every
 * variant that has them -- scalar-i8 (the definition), avx2, avx512,
 * avx512vnni -- against the exact reference with it, against the
 * definition within f32 rounding, and their integer sums for equality.
 */
#include "attn/attn.h"
#include "test.h"

enum { MAX_SEGS = 3, MAX_BLOCKS = 32 };

static const char *const ISAS[] = {"scalar", "avx2", "avx512"};
enum { N_ISAS = 3 };

/* ========================================================================
 * Test cases: segments with their own storage, queries, and the buffers
 * they own.
 * ====================================================================== */

typedef struct mat_spec {
  int bits;        /* 0: dense                                   */
  rlm_dtype dtype; /* element dtype, or scale/bias dtype         */
  int group;       /* quantized only                             */
  int pad;         /* extra elements (words) per row: NaN filled */
} mat_spec;

typedef struct tcase {
  rlm_attn_args a;
  rlm_attn_seg segs[MAX_SEGS];
  float *out;
  void *blocks[MAX_BLOCKS]; /* everything allocated for the case */
  int n_blocks;
  char desc[256];
} tcase;

static void *tc_alloc(tcase *c, size_t bytes) {
  void *p = calloc(bytes ? bytes : 1, 1);
  if (!p || c->n_blocks == MAX_BLOCKS) {
    fprintf(stderr, "test_attn: out of memory or blocks\n");
    exit(2);
  }
  c->blocks[c->n_blocks++] = p;
  return p;
}

static void tc_free(tcase *c) {
  for (int i = 0; i < c->n_blocks; i++) free(c->blocks[i]);
  c->n_blocks = 0;
}

/* Dense rows: values mean + sd * N(0,1), padding NaN (must never be read). */
static void mat_dense(tcase *c, rlm_attn_mat *m, int64_t n, int dim, uint64_t *rng,
                      float mean, float sd) {
  const size_t es = rlm_dtype_size(m->dtype);
  void *d = tc_alloc(c, (size_t)(n * m->row_stride) * es);
  for (int64_t i = 0; i < n; i++)
    for (int64_t e = 0; e < m->row_stride; e++)
      rlm__store_f(d, m->dtype, i * m->row_stride + e,
                   e < dim ? mean + sd * t_rng_normal(rng) : NAN);
  m->data = d;
}

/* Quantized rows through the format's reference quantizer, one row at a
 * time so rows can be padded; padding words are all ones, padding scales
 * NaN. */
static void mat_quant(tcase *c, rlm_attn_mat *m, int64_t n, int dim, uint64_t *rng,
                      float mean, float sd) {
  const size_t es = rlm_dtype_size(m->dtype);
  const int64_t words = rlm__quant_row_words(dim, m->bits), ng = dim / m->group_size;
  uint32_t *wq = tc_alloc(c, (size_t)(n * m->row_stride) * 4);
  char *sc = tc_alloc(c, (size_t)(n * m->sb_stride) * es);
  char *bi = tc_alloc(c, (size_t)(n * m->sb_stride) * es);
  float *x = malloc((size_t)dim * sizeof *x);
  void *xt = malloc((size_t)dim * es);
  for (int64_t i = 0; i < n; i++) {
    for (int e = 0; e < dim; e++) x[e] = mean + sd * t_rng_normal(rng);
    rlm__convert(x, RLM_DTYPE_F32, xt, m->dtype, dim);
    const size_t o = (size_t)(i * m->sb_stride) * es;
    rlm__quantize_rows_ref(xt, m->dtype, 1, dim, m->bits, m->group_size, wq + i * m->row_stride,
                           sc + o, bi + o);
    for (int64_t w = words; w < m->row_stride; w++) wq[i * m->row_stride + w] = 0xffffffffu;
    for (int64_t g = ng; g < m->sb_stride; g++) {
      rlm__store_f(sc, m->dtype, i * m->sb_stride + g, NAN);
      rlm__store_f(bi, m->dtype, i * m->sb_stride + g, NAN);
    }
  }
  free(x);
  free(xt);
  m->data = wq;
  m->scales = sc;
  m->biases = bi;
}

static rlm_attn_mat mat_make(tcase *c, const mat_spec *sp, int64_t n, int dim, uint64_t *rng,
                             float mean, float sd) {
  rlm_attn_mat m = {.bits = sp->bits, .dtype = sp->dtype, .group_size = sp->group};
  if (!sp->bits) {
    m.row_stride = dim + sp->pad;
    mat_dense(c, &m, n, dim, rng, mean, sd);
  } else {
    m.row_stride = rlm__quant_row_words(dim, sp->bits) + sp->pad;
    m.sb_stride = dim / sp->group + sp->pad;
    mat_quant(c, &m, n, dim, rng, mean, sd);
  }
  return m;
}

/* Empty slots may hold anything (a fresh ring is not cleared): make them
 * NaN so a kernel that reads one fails loudly. */
static void mat_poison_row(rlm_attn_mat *m, int64_t i, int dim) {
  if (m->bits) {
    for (int64_t g = 0; g < dim / m->group_size; g++)
      rlm__store_f((void *)m->scales, m->dtype, i * m->sb_stride + g, NAN);
    return;
  }
  for (int e = 0; e < dim; e++) rlm__store_f((void *)m->data, m->dtype, i * m->row_stride + e, NAN);
}

/* ---- random cases --------------------------------------------------------- */

static int pick(uint64_t *rng, int n) { return (int)(t_rng_next(rng) % (uint64_t)n); }

static mat_spec spec_random(uint64_t *rng, int dim) {
  static const rlm_dtype dts[3] = {RLM_DTYPE_F32, RLM_DTYPE_F16, RLM_DTYPE_BF16};
  static const int bits[8] = {4, 8, 4, 8, 2, 3, 5, 6};
  static const int groups[3] = {32, 64, 128};
  mat_spec s = {0, dts[pick(rng, 3)], 0, pick(rng, 4) == 0 ? 1 + pick(rng, 5) : 0};
  if (pick(rng, 10) < 3) return s;
  const int g = groups[pick(rng, 3)];
  for (int k = 0; k < 3; k++) { /* the drawn group, or the next one that divides dim */
    const int gk = groups[(k + g / 64) % 3];
    if (dim % gk == 0) return (mat_spec){bits[pick(rng, 8)], s.dtype, gk, s.pad};
  }
  return s; /* no group divides dim: dense */
}

static int dim_random(uint64_t *rng) {
  static const int dims[] = {32, 64, 96, 128, 128, 128, 160, 192, 256, 48, 80, 40, 72};
  return dims[pick(rng, (int)(sizeof dims / sizeof *dims))];
}

static int64_t slots_random(uint64_t *rng, int64_t left) {
  const int r = pick(rng, 10);
  int64_t n = r == 0 ? 0 : r <= 6 ? 1 + pick(rng, 200) : r <= 8 ? 200 + pick(rng, 800)
                                                                  : 1000 + pick(rng, 2001);
  return RLM_MIN(n, left);
}

/* A segment of n slots with the given storage and random positions in
 * [0, span), one in eight empty. */
static void seg_build(tcase *c, rlm_attn_seg *s, const mat_spec *ks, const mat_spec *vs,
                      int64_t n, int64_t span, uint64_t *rng) {
  const rlm_attn_args *a = &c->a;
  int32_t *pos = tc_alloc(c, (size_t)n * sizeof *pos);
  s->n = n;
  s->k = mat_make(c, ks, n, a->dim_k, rng, 0.0f, 1.0f);
  s->v = mat_make(c, vs, n, a->dim_v, rng, 0.3f, 1.0f);
  for (int64_t i = 0; i < n; i++) {
    pos[i] = pick(rng, 8) == 0 ? -1 : pick(rng, (int)span);
    if (pos[i] < 0) mat_poison_row(&s->k, i, a->dim_k), mat_poison_row(&s->v, i, a->dim_v);
  }
  s->pos = pos;
  size_t o = strlen(c->desc);
  snprintf(c->desc + o, sizeof c->desc - o, " [n=%lld K%d/%s/g%d V%d/%s/g%d]", (long long)n,
           ks->bits, rlm_dtype_name(ks->dtype), ks->group, vs->bits, rlm_dtype_name(vs->dtype),
           vs->group);
}

static void seg_random(tcase *c, rlm_attn_seg *s, int64_t n, int64_t span, uint64_t *rng) {
  const mat_spec ks = spec_random(rng, c->a.dim_k), vs = spec_random(rng, c->a.dim_v);
  seg_build(c, s, &ks, &vs, n, span, rng);
}

/* Query positions: mostly at the end of the span (decode), some anywhere,
 * some -1 (padding rows that see nothing). */
static void queries_random(tcase *c, int64_t span, uint64_t *rng) {
  rlm_attn_args *a = &c->a;
  float *q = tc_alloc(c, (size_t)a->n_q * (size_t)a->dim_k * sizeof *q);
  int64_t *qp = tc_alloc(c, (size_t)a->n_q * sizeof *qp);
  for (int i = 0; i < a->n_q * a->dim_k; i++) q[i] = t_rng_normal(rng);
  for (int i = 0; i < a->n_q; i++) {
    const int r = pick(rng, 8);
    qp[i] = r == 0 ? -1 : r <= 4 ? span - 1 - pick(rng, 3) : pick(rng, (int)span + 8);
  }
  a->q = q;
  a->q_pos = qp;
  c->out = tc_alloc(c, (size_t)a->n_q * (size_t)a->dim_v * sizeof *c->out);
  a->out = c->out;
}

/* A random window (none, or 4..3+win_max) with sinks, and the span of
 * positions (1..span_max) the case's slots hold; names the case. */
static int64_t case_window(tcase *c, uint64_t seed, uint64_t *rng, int win_max, int span_max) {
  rlm_attn_args *a = &c->a;
  a->window = pick(rng, 2) ? 0 : 4 + pick(rng, win_max);
  a->sink = a->window && pick(rng, 2) ? 1 + pick(rng, 4) : 0;
  const int64_t span = 1 + pick(rng, span_max);
  snprintf(c->desc, sizeof c->desc, "seed %llu dk %d dv %d nq %d win %lld sink %lld span %lld",
           (unsigned long long)seed, a->dim_k, a->dim_v, a->n_q, (long long)a->window,
           (long long)a->sink, (long long)span);
  return span;
}

static void case_random_nq(tcase *c, uint64_t seed, int nq_max) {
  uint64_t rng = seed;
  memset(c, 0, sizeof *c);
  rlm_attn_args *a = &c->a;
  a->dim_k = dim_random(&rng);
  a->dim_v = pick(&rng, 2) ? a->dim_k : dim_random(&rng);
  a->n_q = 1 + pick(&rng, nq_max);
  a->scale = t_rng_float(&rng, 0.3f, 2.0f) / sqrtf((float)a->dim_k);
  const int64_t span = case_window(c, seed, &rng, 61, 4000);
  a->n_segs = 1 + pick(&rng, MAX_SEGS);
  int64_t left = 3000;
  for (int s = 0; s < a->n_segs; s++) {
    const int64_t n = slots_random(&rng, left);
    left -= n;
    seg_random(c, &c->segs[s], n, span, &rng);
  }
  a->segs = c->segs;
  queries_random(c, span, &rng);
}

static void case_random(tcase *c, uint64_t seed) { case_random_nq(c, seed, 16); }

/* ---- shuffling ------------------------------------------------------------ */

static void copy_row(rlm_attn_mat *dst, const rlm_attn_mat *src, int64_t to, int64_t from) {
  const size_t es = src->bits ? 4 : rlm_dtype_size(src->dtype);
  const size_t rb = (size_t)src->row_stride * es;
  memcpy((char *)dst->data + (size_t)to * rb, (const char *)src->data + (size_t)from * rb, rb);
  if (!src->bits) return;
  const size_t sb = (size_t)src->sb_stride * rlm_dtype_size(src->dtype);
  memcpy((char *)dst->scales + (size_t)to * sb, (const char *)src->scales + (size_t)from * sb, sb);
  memcpy((char *)dst->biases + (size_t)to * sb, (const char *)src->biases + (size_t)from * sb, sb);
}

static rlm_attn_mat mat_like(tcase *c, const rlm_attn_mat *m, int64_t n) {
  rlm_attn_mat r = *m;
  const size_t es = m->bits ? 4 : rlm_dtype_size(m->dtype);
  r.data = tc_alloc(c, (size_t)(n * m->row_stride) * es);
  if (m->bits) {
    r.scales = tc_alloc(c, (size_t)(n * m->sb_stride) * rlm_dtype_size(m->dtype));
    r.biases = tc_alloc(c, (size_t)(n * m->sb_stride) * rlm_dtype_size(m->dtype));
  }
  return r;
}

/* dst: src with every segment's slots permuted and the segments reversed;
 * queries and output buffer are shared with src. */
static void case_shuffled(tcase *dst, const tcase *src, uint64_t seed) {
  uint64_t rng = seed;
  memset(dst, 0, sizeof *dst);
  dst->a = src->a;
  dst->a.segs = dst->segs;
  for (int s = 0; s < src->a.n_segs; s++) {
    const rlm_attn_seg *from = &src->segs[s];
    rlm_attn_seg *to = &dst->segs[src->a.n_segs - 1 - s];
    const int64_t n = from->n;
    int32_t *pos = tc_alloc(dst, (size_t)n * sizeof *pos);
    int64_t *perm = tc_alloc(dst, (size_t)n * sizeof *perm);
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
      const int64_t k = (int64_t)(t_rng_next(&rng) % (uint64_t)(i + 1)), t = perm[i];
      perm[i] = perm[k], perm[k] = t;
    }
    *to = (rlm_attn_seg){.n = n, .pos = pos, .k = mat_like(dst, &from->k, n),
                         .v = mat_like(dst, &from->v, n)};
    for (int64_t i = 0; i < n; i++) {
      pos[i] = from->pos[perm[i]];
      copy_row(&to->k, &from->k, i, perm[i]);
      copy_row(&to->v, &from->v, i, perm[i]);
    }
  }
}

/* ========================================================================
 * The double-precision answer, from attn.h's text alone.
 * ====================================================================== */

static double elem_d(const rlm_attn_mat *m, int64_t i, int e) {
  if (!m->bits) return rlm__load_f(m->data, m->dtype, i * m->row_stride + e);
  const int64_t g = i * m->sb_stride + e / m->group_size;
  const uint32_t *wq = (const uint32_t *)m->data + i * m->row_stride;
  uint32_t code = 0;
  for (int b = 0; b < m->bits; b++) { /* bit by bit: independent of rlm__quant_get */
    const int64_t bit = (int64_t)e * m->bits + b;
    code |= ((wq[bit / 32] >> (bit % 32)) & 1u) << b;
  }
  return code * (double)rlm__load_f(m->scales, m->dtype, g) + rlm__load_f(m->biases, m->dtype, g);
}

static bool sees(int64_t qp, int64_t kp, int64_t window, int64_t sink) {
  if (kp == -1 || kp > qp) return false;
  if (window == 0 || kp < sink) return true;
  return qp - kp < window - sink;
}

/* Row q: out (double) and mass = max_e sum_t p_t |v_te|; returns the
 * number of visible slots. */
static int64_t attn_double_row(const rlm_attn_args *a, int q, double *out, double *mass) {
  double mx = -INFINITY, sum = 0;
  int64_t n_vis = 0;
  for (int pass = 0; pass < 2; pass++) {
    for (int s = 0; s < a->n_segs; s++) {
      const rlm_attn_seg *seg = &a->segs[s];
      for (int64_t i = 0; i < seg->n; i++) {
        if (!sees(a->q_pos[q], seg->pos[i], a->window, a->sink)) continue;
        double d = 0;
        for (int e = 0; e < a->dim_k; e++)
          d += a->q[(size_t)q * a->dim_k + e] * elem_d(&seg->k, i, e);
        d *= a->scale;
        if (pass == 0) {
          mx = d > mx ? d : mx;
          n_vis++;
          continue;
        }
        const double p = exp(d - mx);
        sum += p;
        for (int e = 0; e < a->dim_v; e++) {
          const double v = elem_d(&seg->v, i, e);
          out[e] += p * v;
          mass[e] += p * fabs(v);
        }
      }
    }
  }
  for (int e = 0; e < a->dim_v; e++) {
    out[e] = n_vis ? out[e] / sum : 0;
    mass[e] = n_vis ? mass[e] / sum : 0;
  }
  return n_vis;
}

typedef struct truth {
  double *out;    /* [n_q][dim_v] */
  double *mass;   /* [n_q] max_e sum_t p_t |v_te| */
  int64_t *n_vis; /* [n_q] visible slots */
} truth;

static truth truth_make(const rlm_attn_args *a) {
  truth t = {calloc((size_t)a->n_q * a->dim_v + 1, sizeof(double)),
             calloc((size_t)a->n_q + 1, sizeof(double)),
             calloc((size_t)a->n_q + 1, sizeof(int64_t))};
  double *mrow = calloc((size_t)a->dim_v, sizeof *mrow);
  for (int q = 0; q < a->n_q; q++) {
    memset(mrow, 0, (size_t)a->dim_v * sizeof *mrow);
    t.n_vis[q] = attn_double_row(a, q, t.out + (size_t)q * a->dim_v, mrow);
    for (int e = 0; e < a->dim_v; e++) t.mass[q] = fmax(t.mass[q], mrow[e]);
  }
  free(mrow);
  return t;
}

static void truth_free(truth *t) {
  free(t->out);
  free(t->mass);
  free(t->n_vis);
}

/* ========================================================================
 * Comparison.
 * ====================================================================== */

/* Worst over rows of max_e |got - want| / (rel * max_e |want| + abs * mass):
 * <= 1 passes. Rows that see nothing must be exactly zero (else +inf). */
static double rows_ratio(const float *got, const float *want, const truth *t, int n_q, int dv,
                         double rel, double abs_) {
  double worst = 0;
  for (int q = 0; q < n_q; q++) {
    double err = 0, norm = 0;
    for (int e = 0; e < dv; e++) {
      const double g = got[(size_t)q * dv + e], w = want[(size_t)q * dv + e];
      if (t->n_vis[q] == 0 && g != 0) return INFINITY;
      err = fmax(err, isnan(g) ? INFINITY : fabs(g - w));
      norm = fmax(norm, fabs(w));
    }
    if (err == 0) continue;
    worst = fmax(worst, err / (rel * norm + abs_ * t->mass[q]));
  }
  return worst;
}

static double fused_ratio(rlm_attn_fused_fn fn, const rlm_attn_args *a, const float *want,
                          const truth *t) {
  const size_t nf = rlm__attn_scratch_floats(a->n_q, a->dim_k, a->dim_v);
  float *scratch = malloc(nf * sizeof *scratch);
  float *got = malloc(((size_t)a->n_q * a->dim_v + 1) * sizeof *got);
  rlm_attn_args b = *a;
  b.out = got;
  fn(&b, scratch);
  const double r = rows_ratio(got, want, t, a->n_q, a->dim_v, 1e-5, 1e-6);
  free(scratch);
  free(got);
  return r;
}

/* ========================================================================
 * Hand-computed cases.
 * ====================================================================== */

/* Two slots, dim 2: scores 0 and ln 3, so weights 1/4 and 3/4. */
typedef struct tiny {
  float k[4], v[4], q[6], out[6];
  int32_t pos[2];
  int64_t q_pos[3];
  rlm_attn_seg seg;
  rlm_attn_args a;
} tiny;

static void tiny_init(tiny *c) {
  memset(c, 0, sizeof *c);
  const float k[4] = {0, 0, logf(3.0f), 0}, v[4] = {4, 8, 8, 0}, q[6] = {1, 5, 1, 5, 1, 5};
  memcpy(c->k, k, sizeof k), memcpy(c->v, v, sizeof v), memcpy(c->q, q, sizeof q);
  c->pos[0] = 0, c->pos[1] = 1;
  c->q_pos[0] = 1, c->q_pos[1] = 0, c->q_pos[2] = -1; /* both, slot 0 only, nothing */
  const rlm_attn_mat km = {.dtype = RLM_DTYPE_F32, .data = c->k, .row_stride = 2};
  const rlm_attn_mat vm = {.dtype = RLM_DTYPE_F32, .data = c->v, .row_stride = 2};
  c->seg = (rlm_attn_seg){.n = 2, .pos = c->pos, .k = km, .v = vm};
  c->a = (rlm_attn_args){.segs = &c->seg, .n_segs = 1, .dim_k = 2, .dim_v = 2, .q = c->q,
                         .q_pos = c->q_pos, .n_q = 3, .scale = 1.0f, .out = c->out};
}

static void tiny_check(const float *out) {
  CHECK_NEAR(out[0], 0.25 * 4 + 0.75 * 8, 1e-5); /* 7 */
  CHECK_NEAR(out[1], 0.25 * 8 + 0.75 * 0, 1e-5); /* 2 */
  CHECK_NEAR(out[2], 4, 1e-6);
  CHECK_NEAR(out[3], 8, 1e-6);
  CHECK(out[4] == 0.0f && out[5] == 0.0f);
}

TEST(ref_hand_computed) {
  tiny c;
  tiny_init(&c);
  CHECK_EQ(rlm__attn_ref(&c.a), RLM_OK);
  tiny_check(c.out);
}

TEST(fused_hand_computed) {
  for (int i = 0; i < N_ISAS; i++) {
    rlm_attn_fused_fn fn = rlm__attn_fused_isa(ISAS[i]);
    if (!fn) continue;
    tiny c;
    tiny_init(&c);
    float scratch[1024];
    CHECK(rlm__attn_scratch_floats(3, 2, 2) <= 1024);
    test_note("isa %s", ISAS[i]);
    fn(&c.a, scratch);
    tiny_check(c.out);
  }
}

/* q = 0 makes every visible slot weigh the same, and v_t = (position,
 * 1) makes the output (mean visible position, 1): the window rule checked
 * against positions listed by hand. */
TEST(ref_window_and_sink) {
  enum { N = 12 };
  float k[N * 2] = {0}, v[N * 2], q[2] = {0, 0}, out[2];
  int32_t pos[N];
  for (int i = 0; i < N; i++) pos[i] = (i * 5) % N, v[2 * i] = (float)pos[i], v[2 * i + 1] = 1;
  pos[3] = -1; /* position 3 is empty */
  const rlm_attn_seg seg = {N, pos, {.dtype = RLM_DTYPE_F32, .data = k, .row_stride = 2},
                            {.dtype = RLM_DTYPE_F32, .data = v, .row_stride = 2}};
  const struct { int64_t qp, window, sink; double mean; } cases[] = {
      {10, 0, 0, (0 + 1 + 2 + 4 + 5 + 6 + 7 + 8 + 9 + 10) / 10.0}, /* causal: 0..10 but 3 */
      {10, 4, 0, (7 + 8 + 9 + 10) / 4.0},                         /* last 4 */
      {10, 4, 1, (0 + 8 + 9 + 10) / 4.0},                         /* sink 0 + last 3 */
      {10, 4, 2, (0 + 1 + 9 + 10) / 4.0},                         /* sinks 0,1 + last 2 */
      {5, 4, 2, (0 + 1 + 4 + 5) / 4.0},                           /* 3 is empty */
      {1, 4, 2, (0 + 1) / 2.0},                                   /* only sinks exist */
      {11, 2, 2, (0 + 1) / 2.0},                                  /* window all sink */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const int64_t qp = cases[i].qp;
    rlm_attn_args a = {.segs = &seg, .n_segs = 1, .dim_k = 2, .dim_v = 2, .q = q, .q_pos = &qp,
                       .n_q = 1, .scale = 1, .window = cases[i].window, .sink = cases[i].sink,
                       .out = out};
    test_note("case %zu", i);
    CHECK_EQ(rlm__attn_ref(&a), RLM_OK);
    CHECK_NEAR(out[0], cases[i].mean, 1e-5);
    CHECK_NEAR(out[1], 1, 1e-6);
  }
}

/* ========================================================================
 * Reference against the double-precision answer.
 * ====================================================================== */

/* Dense f32 only, so the reference's single rounding of scores and
 * weights is all that separates them. */
TEST(ref_matches_double) {
  for (uint64_t seed = 1; seed <= 12; seed++) {
    tcase c;
    uint64_t rng = seed * 7919;
    memset(&c, 0, sizeof c);
    rlm_attn_args *a = &c.a;
    a->dim_k = dim_random(&rng), a->dim_v = dim_random(&rng), a->n_q = 1 + pick(&rng, 8);
    a->scale = 1.0f / sqrtf((float)a->dim_k);
    a->window = seed % 2 ? 0 : 16, a->sink = seed % 4 == 0 ? 2 : 0;
    a->n_segs = 2, a->segs = c.segs;
    const mat_spec sp = {0, RLM_DTYPE_F32, 0, (int)(seed % 3)};
    for (int s = 0; s < 2; s++) seg_random(&c, &c.segs[s], 50 + pick(&rng, 400), 600, &rng);
    for (int s = 0; s < 2; s++) { /* replace the random storage by dense f32 */
      c.segs[s].k = mat_make(&c, &sp, c.segs[s].n, a->dim_k, &rng, 0, 1);
      c.segs[s].v = mat_make(&c, &sp, c.segs[s].n, a->dim_v, &rng, 0.3f, 1);
    }
    queries_random(&c, 600, &rng);
    test_note("%s", c.desc);
    truth t = truth_make(a);
    float *want = malloc(((size_t)a->n_q * a->dim_v + 1) * sizeof *want);
    for (size_t i = 0; i < (size_t)a->n_q * a->dim_v; i++) want[i] = (float)t.out[i];
    CHECK_EQ(rlm__attn_ref(a), RLM_OK);
    CHECK(rows_ratio(c.out, want, &t, a->n_q, a->dim_v, 1e-6, 1e-7) <= 1);
    free(want);
    truth_free(&t);
    tc_free(&c);
  }
}

/* All storage formats: the reference's dequantization against the
 * bit-by-bit one above (f32 rounding of dequantized values included). */
TEST(ref_matches_double_quantized) {
  for (uint64_t seed = 100; seed < 124; seed++) {
    tcase c;
    case_random(&c, seed);
    const rlm_attn_args *a = &c.a;
    test_note("%s", c.desc);
    truth t = truth_make(a);
    float *want = malloc(((size_t)a->n_q * a->dim_v + 1) * sizeof *want);
    for (size_t i = 0; i < (size_t)a->n_q * a->dim_v; i++) want[i] = (float)t.out[i];
    CHECK_EQ(rlm__attn_ref(a), RLM_OK);
    CHECK(rows_ratio(c.out, want, &t, a->n_q, a->dim_v, 2e-6, 2e-7) <= 1);
    free(want);
    truth_free(&t);
    tc_free(&c);
  }
}

/* ========================================================================
 * Fused against the reference.
 * ====================================================================== */

#if defined(__has_feature) /* clang */
#if __has_feature(address_sanitizer)
#define T_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) /* gcc */
#define T_SANITIZED 1
#endif

#if defined(T_SANITIZED)
enum { N_RANDOM = 100 }; /* sanitizer builds are ~20x slower */
#else
enum { N_RANDOM = 300 };
#endif

/* Random cases; the reference on shuffled slots must match itself, and
 * every variant (on the original and on the shuffled slots) the
 * reference. Prints the worst ratio per variant to show the margin. */
TEST(fused_matches_ref_random) {
  double worst[N_ISAS] = {0}, worst_shuffle = 0;
  for (uint64_t seed = 1; seed <= N_RANDOM; seed++) {
    tcase c, d;
    case_random(&c, seed);
    case_shuffled(&d, &c, seed ^ 0xabcdef);
    const rlm_attn_args *a = &c.a;
    test_note("%s", c.desc);
    truth t = truth_make(a);
    float *want = malloc(((size_t)a->n_q * a->dim_v + 1) * sizeof *want);
    float *shuf = malloc(((size_t)a->n_q * a->dim_v + 1) * sizeof *shuf);
    d.a.out = shuf;
    CHECK_EQ(rlm__attn_ref(a), RLM_OK);
    CHECK_EQ(rlm__attn_ref(&d.a), RLM_OK);
    memcpy(want, c.out, (size_t)a->n_q * a->dim_v * sizeof *want);
    const double rs = rows_ratio(shuf, want, &t, a->n_q, a->dim_v, 1e-5, 1e-6);
    CHECK(rs <= 1);
    worst_shuffle = fmax(worst_shuffle, rs);
    for (int i = 0; i < N_ISAS; i++) {
      rlm_attn_fused_fn fn = rlm__attn_fused_isa(ISAS[i]);
      if (!fn) continue;
      const double r0 = fused_ratio(fn, a, want, &t), r1 = fused_ratio(fn, &d.a, want, &t);
      test_note("%s isa %s", c.desc, ISAS[i]);
      CHECK(r0 <= 1);
      CHECK(r1 <= 1);
      worst[i] = fmax(worst[i], fmax(r0, r1));
    }
    free(want);
    free(shuf);
    truth_free(&t);
    tc_free(&d);
    tc_free(&c);
  }
  printf("     %d cases; worst error / tolerance: ref shuffled %.3f", N_RANDOM, worst_shuffle);
  for (int i = 0; i < N_ISAS; i++)
    if (rlm__attn_fused_isa(ISAS[i])) printf(", %s %.3f", ISAS[i], worst[i]);
  printf("\n");
}

/* The tolerance must catch real mistakes: a scale off by 1e-3 and a
 * window one position too wide both fail, for every variant. */
/* The shapes of a real cache, named: a K8V4 ring, a dense f16/bf16 block,
 * a K4V8 ring, in that order (so the 4-bit accumulator order is entered,
 * left and entered again), two query blocks of GQA rows, with and
 * without a window. */
TEST(fused_mixed_segments) {
  static const mat_spec specs[3][2] = {
      {{8, RLM_DTYPE_F16, 64, 0}, {4, RLM_DTYPE_F16, 64, 0}},
      {{0, RLM_DTYPE_F16, 0, 0}, {0, RLM_DTYPE_BF16, 0, 0}},
      {{4, RLM_DTYPE_BF16, 32, 0}, {8, RLM_DTYPE_BF16, 32, 0}},
  };
  for (int round = 0; round < 4; round++) {
    tcase c;
    uint64_t rng = 900 + (uint64_t)round;
    memset(&c, 0, sizeof c);
    rlm_attn_args *a = &c.a;
    a->dim_k = 128, a->dim_v = round % 2 ? 64 : 128, a->n_q = 8;
    a->scale = 1.0f / sqrtf(128.0f);
    a->window = round >= 2 ? 48 : 0, a->sink = round >= 2 ? 2 : 0;
    a->n_segs = 3, a->segs = c.segs;
    snprintf(c.desc, sizeof c.desc, "round %d", round);
    for (int s = 0; s < 3; s++)
      seg_build(&c, &c.segs[s], &specs[s][0], &specs[s][1], 700, 2000, &rng);
    queries_random(&c, 2000, &rng);
    test_note("%s", c.desc);
    truth t = truth_make(a);
    CHECK_EQ(rlm__attn_ref(a), RLM_OK);
    for (int i = 0; i < N_ISAS; i++) {
      rlm_attn_fused_fn fn = rlm__attn_fused_isa(ISAS[i]);
      test_note("%s isa %s", c.desc, ISAS[i]);
      if (fn) CHECK(fused_ratio(fn, a, c.out, &t) <= 1);
    }
    truth_free(&t);
    tc_free(&c);
  }
}

/* True if some query row would see one more slot with window + 1. */
static bool window_edge_hit(const rlm_attn_args *a) {
  for (int q = 0; q < a->n_q; q++)
    for (int s = 0; s < a->n_segs; s++)
      for (int64_t i = 0; i < a->segs[s].n; i++) {
        const int64_t kp = a->segs[s].pos[i];
        if (kp >= a->sink && kp == a->q_pos[q] - (a->window - a->sink)) return true;
      }
  return false;
}

TEST(fused_detects_wrong_args) {
  tcase c;
  uint64_t seed = 77;
  for (;; seed++) { /* a case with a window whose edge matters */
    case_random(&c, seed);
    if (c.a.window && window_edge_hit(&c.a)) break;
    tc_free(&c);
  }
  const rlm_attn_args *a = &c.a;
  test_note("%s", c.desc);
  truth t = truth_make(a);
  CHECK_EQ(rlm__attn_ref(a), RLM_OK);
  for (int i = 0; i < N_ISAS; i++) {
    rlm_attn_fused_fn fn = rlm__attn_fused_isa(ISAS[i]);
    if (!fn) continue;
    rlm_attn_args b = *a;
    CHECK(fused_ratio(fn, &b, c.out, &t) <= 1);
    b.scale = a->scale * 1.001f;
    CHECK(fused_ratio(fn, &b, c.out, &t) > 1);
    b = *a;
    b.window = a->window + 1;
    CHECK(fused_ratio(fn, &b, c.out, &t) > 1);
  }
  truth_free(&t);
  tc_free(&c);
}

/* One query, scores exactly 0, -1, ..., -69 (q = e_0, k_t = (-t, 0, ..),
 * scale 1) and V the identity: out[t] is the weight of slot t, so the
 * vector exp is checked against expf over its whole useful range. */
TEST(fused_exp_accuracy) {
  enum { N = 70, D = 80 };
  static float k[N * D], v[N * D];
  float q[D] = {1}, want[D], got[D];
  int32_t pos[N];
  for (int t = 0; t < N; t++) {
    pos[t] = t;
    k[t * D] = -(float)t - 0.37f * (float)(t % 3);
    v[t * D + t] = 1;
  }
  const int64_t qp = N;
  const rlm_attn_seg seg = {N, pos, {.dtype = RLM_DTYPE_F32, .data = k, .row_stride = D},
                            {.dtype = RLM_DTYPE_F32, .data = v, .row_stride = D}};
  rlm_attn_args a = {.segs = &seg, .n_segs = 1, .dim_k = D, .dim_v = D, .q = q, .q_pos = &qp,
                     .n_q = 1, .scale = 1, .out = want};
  CHECK_EQ(rlm__attn_ref(&a), RLM_OK);
  float *scratch = malloc(rlm__attn_scratch_floats(1, D, D) * sizeof *scratch);
  for (int i = 0; i < N_ISAS; i++) {
    rlm_attn_fused_fn fn = rlm__attn_fused_isa(ISAS[i]);
    if (!fn) continue;
    a.out = got;
    fn(&a, scratch);
    double worst = 0;
    for (int t = 0; t < N; t++) worst = fmax(worst, fabs(got[t] / want[t] - 1));
    test_note("isa %s worst relative %g", ISAS[i], worst);
    CHECK(worst < 2e-6);
  }
  free(scratch);
}

/* Scores around +1000 (softmax must subtract the max) and one slot far
 * above the rest (weights underflow to exactly 0, no NaN). */
TEST(fused_large_scores) {
  enum { N = 100, D = 32 };
  static float k[N * D], v[N * D];
  float q[D], want[D], got[D];
  int32_t pos[N];
  for (int e = 0; e < D; e++) q[e] = 1;
  for (int t = 0; t < N; t++) {
    pos[t] = t;
    for (int e = 0; e < D; e++) k[t * D + e] = 31.25f + (t == 42 ? 4.0f : 0.01f * (float)(t % 7));
    for (int e = 0; e < D; e++) v[t * D + e] = (float)(t + e);
  }
  const int64_t qp = N;
  const rlm_attn_seg seg = {N, pos, {.dtype = RLM_DTYPE_F32, .data = k, .row_stride = D},
                            {.dtype = RLM_DTYPE_F32, .data = v, .row_stride = D}};
  rlm_attn_args a = {.segs = &seg, .n_segs = 1, .dim_k = D, .dim_v = D, .q = q, .q_pos = &qp,
                     .n_q = 1, .scale = 1, .out = want}; /* scores ~1000, slot 42 +128 */
  CHECK_EQ(rlm__attn_ref(&a), RLM_OK);
  float scratch[2048];
  CHECK(rlm__attn_scratch_floats(1, D, D) <= 2048);
  for (int i = 0; i < N_ISAS; i++) {
    rlm_attn_fused_fn fn = rlm__attn_fused_isa(ISAS[i]);
    if (!fn) continue;
    a.out = got;
    fn(&a, scratch);
    test_note("isa %s", ISAS[i]);
    for (int e = 0; e < D; e++) {
      CHECK(got[e] == (float)(42 + e));
      CHECK(want[e] == (float)(42 + e));
    }
  }
}

/* ========================================================================
 * INT8 QUERIES (attn.h): 4-bit K scored with int8 query codes.
 *
 * THE BOUND. Query row q is quantized per block b of 32 with d_b =
 * max|q| / 127 and qi_j = rint(q_j * (127 / max|q|)); the rint is off by
 * at most 1/2 and the three f32 roundings (d_b, 127 / max|q|, the
 * product) by at most 3 * 2^-24 * 127 < 1e-4 more, so
 *     |q_j - d_b qi_j| <= 0.5001 d_b.
 * The bias part uses the exact group sums of q, so only the codes' part
 * of k_j = s_g code_j + b_g meets that error:
 *     |score_int8 - score| <= scale * 0.5001 * sum_j |s_g(j)| code_j d_b(j) =: E_qt
 * for slots with 4-bit K (0 for other segments). With every visible
 * score moved by at most E_q = max_t E_qt, each softmax weight moves by a
 * factor within e^(+-2 E_q), so each output element by at most
 *     (e^(2 E_q) - 1) * sum_t p_t |v_te| <= (e^(2 E_q) - 1) * mass_q
 * and the log-sum-exp by at most E_q; f32 rounding adds the fused
 * kernel's own tolerance (rows_ratio's). The output bound is loose (E_q
 * reaches 0.4 here, e^0.8 - 1 = 1.2 x mass): the scores, checked one by
 * one against their own E_qt (i8_scores_within_bound) and through the
 * log-sum-exp, are what catch a wrong combination of d, s and b. A kernel
 * that drops b_g * sum_g(q) moves scores by scale * sum_g b_g qsum_g: 6 in
 * the log-sum-exp of i8_bound_catches_no_bias's case against E_q <= 0.4,
 * and that test checks that both checks fail it.
 * ====================================================================== */

static const char *const I8_ISAS[] = {"scalar-i8", "avx2", "avx512", "avx512vnni"};
enum { N_I8_ISAS = 4 };

/* A case for int8 queries: head dims 64/128/256, GQA blocks of 1..8 rows,
 * most segments 4-bit K (any dtype and group) with V 4-bit, 8-bit or
 * dense, the rest any storage (so segments switch paths within a call);
 * windows, sinks, empty slots and ragged positions as case_random. */
static void case_i8(tcase *c, uint64_t seed) {
  static const int dims[3] = {64, 128, 256}, groups[3] = {32, 64, 128}, vbits[3] = {4, 8, 0};
  static const rlm_dtype dts[3] = {RLM_DTYPE_F32, RLM_DTYPE_F16, RLM_DTYPE_BF16};
  uint64_t rng = seed;
  memset(c, 0, sizeof *c);
  rlm_attn_args *a = &c->a;
  a->dim_k = dims[pick(&rng, 3)];
  a->dim_v = pick(&rng, 2) ? a->dim_k : dims[pick(&rng, 3)];
  a->n_q = 1 + pick(&rng, 8);
  a->scale = t_rng_float(&rng, 0.5f, 1.5f) / sqrtf((float)a->dim_k);
  a->int8_q = true;
  const int64_t span = case_window(c, seed, &rng, 200, 3000);
  a->n_segs = 1 + pick(&rng, MAX_SEGS);
  int64_t left = 2500;
  for (int s = 0; s < a->n_segs; s++) {
    const int64_t n = RLM_MAX(slots_random(&rng, left), 1);
    left = RLM_MAX(left - n, 0);
    mat_spec ks = spec_random(&rng, a->dim_k), vs = {0, dts[pick(&rng, 3)], 0, 0};
    if (pick(&rng, 4)) ks = (mat_spec){4, dts[pick(&rng, 3)], groups[pick(&rng, 3)], ks.pad};
    if (ks.bits && a->dim_k % ks.group) ks.group = 32;
    vs.bits = vbits[pick(&rng, 3)];
    vs.group = vs.bits ? groups[pick(&rng, 2)] : 0;
    seg_build(c, &c->segs[s], &ks, &vs, n, span, &rng);
  }
  a->segs = c->segs;
  queries_random(c, span, &rng);
}

/* Code of element e of slot i of a quantized matrix, bit by bit. */
static uint32_t code_of(const rlm_attn_mat *m, int64_t i, int e) {
  const uint32_t *wq = (const uint32_t *)m->data + i * m->row_stride;
  uint32_t code = 0;
  for (int b = 0; b < m->bits; b++) {
    const int64_t bit = (int64_t)e * m->bits + b;
    code |= ((wq[bit / 32] >> (bit % 32)) & 1u) << b;
  }
  return code;
}

/* d_b of row q's block b, from max|q| (exact in any order). */
static double i8_block_d(const rlm_attn_args *a, int q, int b) {
  double mx = 0;
  for (int e = 32 * b; e < 32 * b + 32; e++) mx = fmax(mx, fabs(a->q[(size_t)q * a->dim_k + e]));
  return mx / 127;
}

/* cs[b] = |s_g(b)| * sum of block b's codes, for slot i of a 4-bit K. */
static void i8_code_scales(const rlm_attn_mat *k, int64_t i, int dim, double *cs) {
  for (int b = 0; b < dim / 32; b++) {
    const double sg = rlm__load_f(k->scales, k->dtype, i * k->sb_stride + 32 * b / k->group_size);
    double sum = 0;
    for (int e = 32 * b; e < 32 * b + 32; e++) sum += code_of(k, i, e);
    cs[b] = fabs(sg) * sum;
  }
}

/* E_qt of THE BOUND from cs (i8_code_scales) and row q's d_b. */
static double i8_slot_bound(const rlm_attn_args *a, const double *cs, const double *d) {
  double e = 0;
  for (int b = 0; b < a->dim_k / 32; b++) e += cs[b] * d[b];
  return a->scale * 0.5001 * e;
}

/* E_q of THE BOUND per row (max over its visible slots). */
static double *i8_bounds(const rlm_attn_args *a) {
  double *E = calloc((size_t)a->n_q + 1, sizeof *E);
  const int nb = a->dim_k / 32;
  double *d = calloc((size_t)a->n_q * nb + 1, sizeof *d), *cs = calloc((size_t)nb + 1, sizeof *cs);
  for (int q = 0; q < a->n_q; q++)
    for (int b = 0; b < nb; b++) d[q * nb + b] = i8_block_d(a, q, b);
  for (int s = 0; s < a->n_segs; s++) {
    const rlm_attn_seg *seg = &a->segs[s];
    for (int64_t i = 0; i < seg->n && seg->k.bits == 4; i++) {
      i8_code_scales(&seg->k, i, a->dim_k, cs);
      for (int q = 0; q < a->n_q; q++)
        if (sees(a->q_pos[q], seg->pos[i], a->window, a->sink))
          E[q] = fmax(E[q], i8_slot_bound(a, cs, d + q * nb));
    }
  }
  free(d);
  free(cs);
  return E;
}

/* Worst over rows of the output error against THE BOUND (<= 1 passes). */
static double i8_rows_ratio(const float *got, const float *want, const truth *t, const double *E,
                            const rlm_attn_args *a) {
  double worst = 0;
  for (int q = 0; q < a->n_q; q++) {
    double err = 0, norm = 0;
    for (int e = 0; e < a->dim_v; e++) {
      const double g = got[(size_t)q * a->dim_v + e], w = want[(size_t)q * a->dim_v + e];
      if (t->n_vis[q] == 0 && g != 0) return INFINITY;
      err = fmax(err, isnan(g) ? INFINITY : fabs(g - w));
      norm = fmax(norm, fabs(w));
    }
    const double tol = 1e-5 * norm + 1e-6 * t->mass[q] + expm1(2 * E[q]) * t->mass[q];
    if (err > 0) worst = fmax(worst, err / tol);
  }
  return worst;
}

/* The log-sum-exp against THE BOUND: |got - want| <= E_q + f32 rounding. */
static double i8_lse_ratio(const float *got, const float *want, const truth *t, const double *E,
                           int n_q) {
  double worst = 0;
  for (int q = 0; q < n_q; q++) {
    if (t->n_vis[q] == 0) {
      if (!(isinf(got[q]) && got[q] < 0)) return INFINITY;
      continue;
    }
    const double err = fabs((double)got[q] - want[q]);
    worst = fmax(worst, isnan(err) ? INFINITY : err / (E[q] + 1e-5 * fmax(1.0, fabs(want[q]))));
  }
  return worst;
}

/* Runs fn on a with its own out, lse and scratch: no allocation, no
 * write past rlm__attn_scratch_floats. */
static void i8_run(rlm_attn_fused_fn fn, const rlm_attn_args *a, float *out, float *lse) {
  enum { GUARD = 64 };
  const size_t nf = rlm__attn_scratch_floats(a->n_q, a->dim_k, a->dim_v);
  float *scratch = malloc((nf + GUARD) * sizeof *scratch);
  for (int g = 0; g < GUARD; g++) scratch[nf + g] = 4321.0f;
  rlm_attn_args b = *a;
  b.out = out, b.lse = lse;
  const uint64_t before = rlm__alloc_count();
  fn(&b, scratch);
  CHECK_EQ(rlm__alloc_count(), before);
  bool intact = true;
  for (int g = 0; g < GUARD; g++) intact = intact && scratch[nf + g] == 4321.0f;
  CHECK(intact);
  free(scratch);
}

static bool any_differs(const float *x, const float *y, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (x[i] != y[i]) return true;
  return false;
}

/* The integer sums of each variant equal, exactly, the sums computed
 * here from the definition (codes bit by bit, q coded by qdot.c's rule
 * in natural order), on random rows and on the extremes (codes 15
 * against codes +-127, where a saturating s16 step would show). */
TEST(i8_isums_exact) {
  static const int dims[4] = {64, 128, 192, 256};
  uint64_t rng = 4242;
  int checked[N_I8_ISAS] = {0};
  for (int round = 0; round < 40; round++) {
    const int dim = dims[round % 4], cols = (dim + 127) / 128 * 128, mode = round % 5;
    uint32_t wq[256 / 8];
    float x[256] = {0};
    int32_t want[8], got[8];
    for (int w = 0; w < dim / 8; w++) wq[w] = mode <= 1 ? 0xffffffffu : (uint32_t)t_rng_next(&rng);
    for (int e = 0; e < dim; e++) /* modes 0, 1: every code 15 against +127, -127 */
      x[e] = mode == 0 ? 2.0f : mode == 1 ? -2.0f : mode == 2 ? 3.0f : t_rng_normal(&rng);
    unsigned char *xq = xmalloc(rlm__q8act_bytes(cols));
    rlm__q8act_quantize(x, cols, xq);
    const rlm_attn_mat m = {.bits = 4, .data = wq, .row_stride = dim / 8};
    for (int b = 0; b < dim / 32; b++) {
      float mx = 0;
      for (int e = 32 * b; e < 32 * b + 32; e++) mx = fmaxf(mx, fabsf(x[e]));
      const float inv = mx > 0 ? 127.0f / mx : 0.0f;
      want[b] = 0;
      for (int e = 32 * b; e < 32 * b + 32; e++)
        want[b] += (int32_t)code_of(&m, 0, e) * (int32_t)lrintf(x[e] * inv);
    }
    if (mode <= 1) CHECK_EQ(want[0], (mode ? -1 : 1) * 32 * 15 * 127);
    for (int i = 0; i < N_I8_ISAS; i++) {
      memset(got, 0x55, sizeof got);
      if (!rlm__attn_i8_isums(I8_ISAS[i], wq, xq, dim, got)) continue;
      test_note("dim %d mode %d isa %s", dim, mode, I8_ISAS[i]);
      CHECK(memcmp(got, want, (size_t)(dim / 32) * sizeof *got) == 0);
      checked[i]++;
    }
    free(xq);
  }
  CHECK(checked[0] == 40); /* the reference is always there */
  CHECK(!rlm__attn_i8_isums("scalar", NULL, NULL, 64, NULL)); /* the exact tables have none */
  CHECK(!rlm__attn_i8_isums("scalar-i8", NULL, NULL, 96, NULL)); /* not a multiple of 64 */
  if (!checked[3]) printf("     skipped: no AVX-512 VNNI (vpdpbusd sums not run)\n");
}

/* Random int8-query cases, on their slots and shuffled: every variant
 * within THE BOUND of the exact reference (outputs and log-sum-exp),
 * within f32 rounding of the scalar-i8 definition, and visibly not the
 * exact path (some log-sum-exp differs where a row sees 4-bit K); the
 * split over 2 threads too. Prints the worst error / bound. */
TEST(i8_matches_ref_random) {
  rlm_pool *pool = NULL;
  CHECK_EQ(rlm__pool_create(&pool, 2, NULL), RLM_OK);
  double worst[N_I8_ISAS] = {0}, worst_lse[N_I8_ISAS] = {0}, worst_def[N_I8_ISAS] = {0};
  double worst_split = 0;
  int n_int = 0;
  for (uint64_t seed = 1; seed <= N_RANDOM / 2; seed++) {
    tcase c, d;
    case_i8(&c, seed);
    case_shuffled(&d, &c, seed ^ 0x5eed);
    rlm_attn_args *a = &c.a;
    test_note("%s", c.desc);
    truth t = truth_make(a);
    double *E = i8_bounds(a);
    bool sees_q4 = false;
    for (int q = 0; q < a->n_q; q++) sees_q4 = sees_q4 || E[q] > 0;
    n_int += sees_q4;
    const size_t no = (size_t)a->n_q * a->dim_v + 1, nl = (size_t)a->n_q + 1;
    float *want = malloc(no * sizeof(float)), *def = malloc(no * sizeof(float));
    float *got = malloc(no * sizeof(float)), *ex = malloc(no * sizeof(float));
    float *lse_ref = malloc(nl * sizeof(float)), *lse_def = malloc(nl * sizeof(float));
    float *lse = malloc(nl * sizeof(float)), *lse_ex = malloc(nl * sizeof(float));
    a->lse = lse_ref;
    CHECK_EQ(rlm__attn_ref(a), RLM_OK);
    a->lse = NULL;
    memcpy(want, c.out, (no - 1) * sizeof *want);
    i8_run(rlm__attn_fused_isa("scalar-i8"), a, def, lse_def);
    for (int i = 0; i < N_I8_ISAS; i++) {
      rlm_attn_fused_fn fn = rlm__attn_fused_isa(I8_ISAS[i]);
      if (!fn) continue;
      test_note("%s isa %s", c.desc, I8_ISAS[i]);
      rlm_attn_args b = *a;
      b.int8_q = false;
      i8_run(fn, &b, ex, lse_ex);
      for (int sh = 0; sh < 2; sh++) {
        i8_run(fn, sh ? &d.a : a, got, lse);
        if (!sh && sees_q4) CHECK(any_differs(lse, lse_ex, (size_t)a->n_q));
        const double r = i8_rows_ratio(got, want, &t, E, a);
        const double rl = i8_lse_ratio(lse, lse_ref, &t, E, a->n_q);
        const double rd = rows_ratio(got, def, &t, a->n_q, a->dim_v, 1e-5, 1e-6);
        CHECK(r <= 1);
        CHECK(rl <= 1);
        CHECK(rd <= 1);
        worst[i] = fmax(worst[i], r), worst_lse[i] = fmax(worst_lse[i], rl);
        worst_def[i] = fmax(worst_def[i], rd);
      }
    }
    const size_t n_split = rlm__attn_split_scratch_floats(2, a->n_q, a->dim_k, a->dim_v);
    float *scratch = malloc(n_split * sizeof *scratch);
    rlm_attn_args b = *a;
    b.out = got, b.lse = lse;
    rlm__attn_split(pool, &b, scratch);
    const double rs = fmax(i8_rows_ratio(got, want, &t, E, a),
                           i8_lse_ratio(lse, lse_ref, &t, E, a->n_q));
    CHECK(rs <= 1);
    worst_split = fmax(worst_split, rs);
    free(scratch);
    free(want), free(def), free(got), free(ex), free(lse_ref), free(lse_def), free(lse), free(lse_ex);
    free(E);
    truth_free(&t);
    tc_free(&d);
    tc_free(&c);
  }
  CHECK(n_int > N_RANDOM / 4); /* most cases exercise the integer path */
  printf("     %d cases (%d with 4-bit K in sight); worst error / bound (out, lse, vs scalar-i8):",
         N_RANDOM / 2, n_int);
  for (int i = 0; i < N_I8_ISAS; i++)
    if (rlm__attn_fused_isa(I8_ISAS[i]))
      printf(" %s %.3f %.3f %.3f;", I8_ISAS[i], worst[i], worst_lse[i], worst_def[i]);
  printf(" split %.3f\n", worst_split);
  rlm__pool_free(pool);
}

/* Slot i of m as a one-slot matrix. */
static rlm_attn_mat mat_slot(rlm_attn_mat m, int64_t i) {
  m.data = (const char *)m.data + (size_t)(i * m.row_stride) * (m.bits ? 4 : rlm_dtype_size(m.dtype));
  if (m.bits) {
    const size_t sb = (size_t)(i * m.sb_stride) * rlm_dtype_size(m.dtype);
    m.scales = (const char *)m.scales + sb;
    m.biases = (const char *)m.biases + sb;
  }
  return m;
}

/* Each score on its own: for up to n slots of every segment, a call that
 * sees only that slot of `run`, whose log-sum-exp is the slot's score;
 * worst over rows and slots of |score - exact| / (E_qt + f32 rounding),
 * with the exact score and E_qt those of the same slot in `a` (run is a
 * or a copy of it with other biases: i8_bound_catches_no_bias). */
static double i8_scores_ratio(rlm_attn_fused_fn fn, const rlm_attn_args *run, const rlm_attn_args *a,
                              int n) {
  const int nb = a->dim_k / 32;
  double worst = 0, *cs = calloc((size_t)nb + 1, sizeof *cs), *d = calloc((size_t)nb + 1, sizeof *d);
  float *out = malloc(((size_t)a->n_q * a->dim_v + 1) * sizeof *out);
  float *lse = malloc(((size_t)a->n_q + 1) * sizeof *lse);
  for (int s = 0; s < a->n_segs; s++) {
    const rlm_attn_seg *seg = &a->segs[s], *rs = &run->segs[s];
    for (int64_t i = 0; i < RLM_MIN(seg->n, n); i++) {
      const rlm_attn_seg one = {1, rs->pos + i, mat_slot(rs->k, i), mat_slot(rs->v, i)};
      rlm_attn_args b = *run;
      b.segs = &one, b.n_segs = 1;
      i8_run(fn, &b, out, lse);
      if (seg->k.bits == 4) i8_code_scales(&seg->k, i, a->dim_k, cs);
      for (int q = 0; q < a->n_q; q++) {
        if (!sees(a->q_pos[q], seg->pos[i], a->window, a->sink)) continue;
        double score = 0, size = 0;
        for (int e = 0; e < a->dim_k; e++) {
          const double x = a->q[(size_t)q * a->dim_k + e] * elem_d(&seg->k, i, e);
          score += x, size += fabs(x);
        }
        for (int k = 0; k < nb; k++) d[k] = i8_block_d(a, q, k);
        const double E = seg->k.bits == 4 ? i8_slot_bound(a, cs, d) : 0;
        const double tol = E + 1e-5 * a->scale * size + 1e-6;
        worst = fmax(worst, fabs(lse[q] - a->scale * score) / tol);
      }
    }
  }
  free(cs), free(d), free(out), free(lse);
  return worst;
}

/* Every score of every variant within its own E_qt (not just the row's
 * largest). */
TEST(i8_scores_within_bound) {
  double worst[N_I8_ISAS] = {0};
  for (uint64_t seed = 300; seed < 330; seed++) {
    tcase c;
    case_i8(&c, seed);
    for (int i = 0; i < N_I8_ISAS; i++) {
      rlm_attn_fused_fn fn = rlm__attn_fused_isa(I8_ISAS[i]);
      if (!fn) continue;
      test_note("%s isa %s", c.desc, I8_ISAS[i]);
      const double r = i8_scores_ratio(fn, &c.a, &c.a, 24);
      CHECK(r <= 1);
      worst[i] = fmax(worst[i], r);
    }
    tc_free(&c);
  }
  printf("     worst score error / bound:");
  for (int i = 0; i < N_I8_ISAS; i++)
    if (rlm__attn_fused_isa(I8_ISAS[i])) printf(" %s %.3f", I8_ISAS[i], worst[i]);
  printf("\n");
}

/* THE BOUND is tight enough to matter: a kernel that dropped b_g *
 * sum_g(q) would score the case as it would score the same case with K's
 * biases zeroed, and that fails the per-score check and the log-sum-exp
 * check of every variant, where the true case passes both. */
TEST(i8_bound_catches_no_bias) {
  tcase c;
  double *E = NULL;
  for (uint64_t seed = 77;; seed++) { /* a case where some row sees 4-bit K */
    case_i8(&c, seed);
    E = i8_bounds(&c.a);
    bool q4 = false;
    for (int q = 0; q < c.a.n_q; q++) q4 = q4 || E[q] > 0;
    if (q4) break;
    free(E);
    tc_free(&c);
  }
  rlm_attn_args *a = &c.a;
  test_note("%s", c.desc);
  truth t = truth_make(a);
  float *lse_ref = malloc(((size_t)a->n_q + 1) * sizeof(float));
  float *lse = malloc(((size_t)a->n_q + 1) * sizeof(float));
  float *out = malloc(((size_t)a->n_q * a->dim_v + 1) * sizeof(float));
  a->lse = lse_ref;
  CHECK_EQ(rlm__attn_ref(a), RLM_OK);
  a->lse = NULL;
  rlm_attn_seg zsegs[MAX_SEGS];
  rlm_attn_args z = *a;
  memcpy(zsegs, c.segs, sizeof zsegs);
  z.segs = zsegs;
  int n_q4 = 0;
  for (int s = 0; s < a->n_segs; s++) {
    rlm_attn_mat *k = &zsegs[s].k;
    if (k->bits != 4) continue;
    n_q4++;
    const size_t bytes = (size_t)(zsegs[s].n * k->sb_stride) * rlm_dtype_size(k->dtype);
    k->biases = tc_alloc(&c, bytes); /* zeros */
  }
  CHECK(n_q4 > 0);
  int checked = 0;
  double e_max = 0, off_min = INFINITY; /* the margin, printed */
  for (int i = 0; i < N_I8_ISAS; i++) {
    rlm_attn_fused_fn fn = rlm__attn_fused_isa(I8_ISAS[i]);
    if (!fn) continue;
    test_note("%s isa %s", c.desc, I8_ISAS[i]);
    CHECK(i8_scores_ratio(fn, a, a, 16) <= 1);
    i8_run(fn, a, out, lse);
    CHECK(i8_lse_ratio(lse, lse_ref, &t, E, a->n_q) <= 1);
    CHECK(i8_scores_ratio(fn, &z, a, 16) > 1);
    i8_run(fn, &z, out, lse);
    CHECK(i8_lse_ratio(lse, lse_ref, &t, E, a->n_q) > 1);
    double off = 0;
    for (int q = 0; q < a->n_q; q++)
      if (E[q] > 0) off = fmax(off, fabs((double)lse[q] - lse_ref[q])), e_max = fmax(e_max, E[q]);
    off_min = fmin(off_min, off);
    checked++;
  }
  CHECK(checked >= 1);
  printf("     %s: E_q at most %.3f; without b_g * sum(q) the log-sum-exp is off by %.3f\n", c.desc,
         e_max, off_min);
  free(lse_ref), free(lse), free(out), free(E);
  truth_free(&t);
  tc_free(&c);
}

/* ========================================================================
 * Contract: no allocation, scratch bounds, edge shapes, errors.
 * ====================================================================== */

TEST(fused_no_alloc_and_scratch_bounds) {
  enum { GUARD = 256 };
  const float sentinel = 12345.678f;
  for (uint64_t seed = 500; seed < 520; seed++) {
    tcase c;
    case_random(&c, seed);
    const rlm_attn_args *a = &c.a;
    const size_t nf = rlm__attn_scratch_floats(a->n_q, a->dim_k, a->dim_v);
    float *scratch = malloc((nf + GUARD) * sizeof *scratch);
    for (int i = 0; i < N_ISAS; i++) {
      rlm_attn_fused_fn fn = rlm__attn_fused_isa(ISAS[i]);
      if (!fn) continue;
      for (size_t g = 0; g < GUARD; g++) scratch[nf + g] = sentinel;
      test_note("%s isa %s", c.desc, ISAS[i]);
      const uint64_t before = rlm__alloc_count();
      fn(a, scratch);
      rlm__attn_fused(a, scratch);
      CHECK_EQ(rlm__alloc_count(), before);
      bool intact = true;
      for (size_t g = 0; g < GUARD; g++) intact = intact && scratch[nf + g] == sentinel;
      CHECK(intact);
    }
    free(scratch);
    tc_free(&c);
  }
}

/* One call over 2 and 3 threads: split by slots (up to 16 query rows)
 * and by query rows (more) both stay within the fused kernel's tolerance
 * of the reference, log-sum-exp included; calls too small to split run
 * on the caller's thread, bit for bit the fused kernel. */
TEST(split_matches_ref) {
  rlm_pool *pools[2] = {NULL, NULL};
  CHECK_EQ(rlm__pool_create(&pools[0], 2, NULL), RLM_OK);
  CHECK_EQ(rlm__pool_create(&pools[1], 3, NULL), RLM_OK);
  int ran[3] = {0}; /* serial, by queries, by slots */
  double worst = 0, worst_lse = 0;
  for (uint64_t seed = 900; seed < 900 + N_RANDOM / 2; seed++) {
    tcase c;
    case_random_nq(&c, seed, seed % 2 ? 16 : 80);
    rlm_attn_args *a = &c.a;
    test_note("%s", c.desc);
    truth t = truth_make(a);
    const size_t nv = (size_t)a->n_q * a->dim_v + 1;
    float *want = malloc(nv * sizeof *want), *got = malloc(nv * sizeof *got);
    float *lse_ref = malloc(((size_t)a->n_q + 1) * sizeof(float));
    float *lse = malloc(((size_t)a->n_q + 1) * sizeof(float));
    a->lse = lse_ref;
    CHECK_EQ(rlm__attn_ref(a), RLM_OK);
    memcpy(want, c.out, (nv - 1) * sizeof *want);
    for (int p = 0; p < 2; p++) {
      const int P = rlm__pool_size(pools[p]);
      float *scratch = malloc(rlm__attn_split_scratch_floats(P, a->n_q, a->dim_k, a->dim_v) * sizeof(float));
      rlm_attn_args b = *a;
      b.out = got, b.lse = lse;
      const int how = rlm__attn_split(pools[p], &b, scratch);
      ran[how == 1 ? 0 : how > 0 ? 1 : 2]++;
      CHECK(how == 1 || how == P || how == -P);
      if (how == 1) { /* the fused kernel itself */
        float *same = malloc(nv * sizeof *same);
        b.out = same, b.lse = NULL;
        rlm__attn_fused(&b, scratch);
        CHECK(memcmp(same, got, (nv - 1) * sizeof *got) == 0);
        free(same);
      }
      const double r = rows_ratio(got, want, &t, a->n_q, a->dim_v, 1e-5, 1e-6);
      CHECK(r <= 1);
      worst = fmax(worst, r);
      for (int q = 0; q < a->n_q; q++) {
        if (t.n_vis[q] == 0) {
          CHECK(isinf(lse[q]) && lse[q] < 0);
          continue;
        }
        const double d = fabs((double)lse[q] - lse_ref[q]) / (1e-5 * fmax(1.0, fabs(lse_ref[q])));
        CHECK(d <= 1);
        worst_lse = fmax(worst_lse, d);
      }
      free(scratch);
    }
    free(want), free(got), free(lse_ref), free(lse);
    truth_free(&t);
    tc_free(&c);
  }
  CHECK(ran[0] > 0 && ran[1] > 0 && ran[2] > 0);
  printf("     serial %d, by queries %d, by slots %d; worst error / tolerance %.3f, lse %.3f\n", ran[0],
         ran[1], ran[2], worst, worst_lse);
  rlm__pool_free(pools[0]);
  rlm__pool_free(pools[1]);
}

/* No segments, empty segments, only empty slots, n_q = 0: zeros (or
 * nothing written) and no crash. */
TEST(edge_shapes) {
  float k[64] = {0}, v[64] = {0}, q[64] = {0}, out[64], scratch[4096];
  int32_t pos[2] = {-1, -1};
  const int64_t qp[2] = {5, 9};
  const rlm_attn_mat m = {.dtype = RLM_DTYPE_F32, .data = k, .row_stride = 32};
  const rlm_attn_mat mv = {.dtype = RLM_DTYPE_F32, .data = v, .row_stride = 32};
  const rlm_attn_seg segs[2] = {{0, NULL, m, mv}, {2, pos, m, mv}};
  CHECK(rlm__attn_scratch_floats(2, 32, 32) <= 4096);
  for (int n_segs = 0; n_segs <= 2; n_segs++) {
    rlm_attn_args a = {.segs = segs, .n_segs = n_segs, .dim_k = 32, .dim_v = 32, .q = q,
                       .q_pos = qp, .n_q = 2, .scale = 1, .out = out};
    for (int i = -1; i < N_ISAS; i++) {
      rlm_attn_fused_fn fn = i < 0 ? NULL : rlm__attn_fused_isa(ISAS[i]);
      if (i >= 0 && !fn) continue;
      for (int e = 0; e < 64; e++) out[e] = 1;
      if (fn) fn(&a, scratch);
      else CHECK_EQ(rlm__attn_ref(&a), RLM_OK);
      bool zero = true;
      for (int e = 0; e < 64; e++) zero = zero && out[e] == 0;
      test_note("n_segs %d isa %s", n_segs, i < 0 ? "ref" : ISAS[i]);
      CHECK(zero);
    }
  }
  rlm_attn_args none = {.segs = segs, .n_segs = 2, .dim_k = 32, .dim_v = 32, .n_q = 0, .scale = 1};
  CHECK_EQ(rlm__attn_ref(&none), RLM_OK);
  rlm__attn_fused(&none, scratch);
  CHECK(rlm__attn_scratch_floats(0, 32, 32) > 0); /* the tile's scale/bias rows */
}

TEST(ref_invalid_args) {
  tcase c;
  case_random(&c, 3);
  rlm_attn_args a = c.a;
  rlm_attn_seg segs[MAX_SEGS];
  memcpy(segs, c.segs, sizeof segs);
  a.segs = segs;
  CHECK_EQ(rlm__attn_ref(&a), RLM_OK);
  segs[0].n = 4;
  const rlm_attn_seg good = segs[0];
  segs[0].k.bits = 7;
  CHECK_EQ(rlm__attn_ref(&a), RLM_ERR_INVALID);
  segs[0] = good;
  segs[0].v.bits = 4, segs[0].v.group_size = 48; /* not a group size */
  segs[0].v.scales = segs[0].v.biases = segs[0].v.data;
  CHECK_EQ(rlm__attn_ref(&a), RLM_ERR_INVALID);
  segs[0] = good;
  segs[0].pos = NULL;
  CHECK_EQ(rlm__attn_ref(&a), RLM_ERR_INVALID);
  segs[0] = good;
  a.dim_k = 0;
  CHECK_EQ(rlm__attn_ref(&a), RLM_ERR_INVALID);
  a = c.a;
  a.window = -1;
  CHECK_EQ(rlm__attn_ref(&a), RLM_ERR_INVALID);
  tc_free(&c);
}

/* Every allocation of the reference failed in turn: RLM_ERR_NOMEM, no
 * leak (the sanitizer build checks), then success. */
TEST(ref_out_of_memory) {
  tcase c;
  case_random(&c, 11);
  int64_t nth = 0;
  rlm_status rc;
  do {
    rlm__alloc_fail_at(nth++);
    rc = rlm__attn_ref(&c.a);
    rlm__alloc_fail_at(-1);
    CHECK(rc == RLM_OK || rc == RLM_ERR_NOMEM);
  } while (rc == RLM_ERR_NOMEM && nth < 100);
  CHECK_EQ(rc, RLM_OK);
  CHECK(nth >= 5); /* k, v, positions, scores, one row's sums */
  tc_free(&c);
}

int main(void) {
  for (int i = 0; i < N_ISAS; i++)
    if (!rlm__attn_fused_isa(ISAS[i])) printf("skipped: %s not supported\n", ISAS[i]);
  if (!rlm__attn_fused_isa("avx512vnni"))
    printf("skipped: no AVX-512 VNNI (int8 queries: avx512vnni)\n");
  RUN(ref_hand_computed);
  RUN(fused_hand_computed);
  RUN(ref_window_and_sink);
  RUN(ref_matches_double);
  RUN(ref_matches_double_quantized);
  RUN(fused_matches_ref_random);
  RUN(fused_mixed_segments);
  RUN(fused_detects_wrong_args);
  RUN(fused_exp_accuracy);
  RUN(fused_large_scores);
  RUN(fused_no_alloc_and_scratch_bounds);
  RUN(split_matches_ref);
  RUN(edge_shapes);
  RUN(ref_invalid_args);
  RUN(ref_out_of_memory);
  RUN(i8_isums_exact);
  RUN(i8_matches_ref_random);
  RUN(i8_scores_within_bound);
  RUN(i8_bound_catches_no_bias);
  return test_summary();
}
