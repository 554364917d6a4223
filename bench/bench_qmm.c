/* bench_qmm.c -- the prefill products: y[m][rows] = x[m][cols] W^T for
 * 4-bit MLX weights (g64, bf16 scales) with m = 512 input rows, on the
 * matrix shapes of a Gemma-3-1B layer and on a slice of its 8-bit tied
 * lm_head (-m 8 or -m 1: the batched or one-row decode sizes), one thread.
 *
 *   exact   rlm__qmatmul (f32 activations; the default path)
 *   int8    rlm__qmatmul_q8 (activations quantized per block of 32)
 *
 * Reported as GMAC/s (m * rows * cols / time) and as a multiple of the
 * exact path measured in the same run (the machine is shared and noisy;
 * each figure is a median of repetitions). Prefill speed is this product
 * rate: nearly all of a prefill's multiply-adds are here.
 *
 * --sweep M1,M2,... times the exact path instead for each listed m (the
 * batched-decode sizes; default 1,2,4,8,16) on every product of a layer
 * (q, k/v, o, gate/up, down) and on an 8-bit slice of the tied lm_head
 * (the embedding is 8-bit in the 4-bit checkpoint), and prints ms per
 * product and the cost of m rows as a multiple of m = 1 (a memory-bound
 * mat-vec: m rows at the same cost would be the ideal). "layer" sums one
 * layer's products (gate/up counted twice, k/v twice).
 *
 * --heads M1,M2,... (default 1,8) times the tied embedding / lm_head
 * shapes whose 6-bit g64 weights the int8 path for 6 bits exists for
 * (Llama 3.2 1B 128256 x 2048, Qwen 3 0.6B 151936 x 1024, bf16 scales),
 * each as 6-bit weights on both paths and as 4- and 8-bit ones on the
 * int8 path (the same shape, for comparison): microseconds per product
 * and GB/s of weight bytes read (codes + scales + biases), next to one
 * thread's streaming-read rate of as many bytes (bench_read), the floor
 * a one-row decode product is held to; at one thread the 6-bit int8
 * product is timed through the AVX2 kernels too. The codes are random bits, not a
 * quantized matrix: speed does not depend on their values, and quantizing
 * 300M values would take longer than the timing.
 *
 * --stack M times a whole batched decode step's products on the int8
 * path: the Gemma-3-1B shape's 26 layers (q, k, v, o, gate, up, down, each
 * layer its own 4-bit matrices, 700 MB) and its 8-bit 262144 x 1152 head
 * (320 MB), one after another at m = M rows, as the model runs them: the
 * weights come from DRAM. Then the same with one layer's matrices reused
 * 26 times (in L3). GMAC/s per kind of product and for the step; the
 * step's tok/s is what a B = M decode would make if nothing but its
 * products took time. Random codes, as --heads.
 *
 * usage: bench_qmm [--reps N] [-m ROWS] [--threads N] [--sweep M1,M2,...]
 *                  [--heads M1,M2,...] [--stack M]
 */
#include "bench.h"
#include "quant/quant.h"

typedef struct shape {
  const char *name;
  int64_t rows, cols;
  int bits;
  int per_layer; /* times the product runs per layer (0: not a layer's) */
} shape;

static const shape SHAPES[] = {
    {"q_proj 1024x1152", 1024, 1152, 4, 1},
    {"gate/up 6912x1152", 6912, 1152, 4, 2},
    {"down 1152x6912", 1152, 6912, 4, 1},
    {"head8 16384x1152", 16384, 1152, 8, 0},
};

static const shape SWEEP_SHAPES[] = {
    {"q 1024x1152", 1024, 1152, 4, 1},       {"k/v 256x1152", 256, 1152, 4, 2},
    {"o 1152x1024", 1152, 1024, 4, 1},       {"gate/up 6912x1152", 6912, 1152, 4, 2},
    {"down 1152x6912", 1152, 6912, 4, 1},    {"head8 16384x1152", 16384, 1152, 8, 0},
};

enum { SWEEP_MAX = 16 };

typedef struct qmm_case {
  rlm_qmat w;
  float *x, *xsum, *y;
  void *scratch;
  int64_t m;
} qmm_case;

static void case_make(qmm_case *c, const shape *s, int64_t m) {
  const int bits = s->bits, g = 64;
  const int64_t rows = s->rows, cols = s->cols, ng = cols / g;
  uint64_t rng = 99;
  float *wf = xmalloc((size_t)(rows * cols) * sizeof *wf);
  for (int64_t i = 0; i < rows * cols; i++) wf[i] = rng_float(&rng);
  c->w = (rlm_qmat){xmalloc((size_t)(rows * rlm__quant_row_words(cols, bits)) * 4),
                    xmalloc((size_t)(rows * ng) * 2), xmalloc((size_t)(rows * ng) * 2),
                    RLM_DTYPE_BF16, rows, cols, bits, g};
  uint16_t *wb = xmalloc((size_t)(rows * cols) * 2); /* scales take the input's dtype */
  rlm__convert(wf, RLM_DTYPE_F32, wb, RLM_DTYPE_BF16, rows * cols);
  rlm__quant_kernels()->quantize_rows(wb, RLM_DTYPE_BF16, rows, cols, bits, g, (uint32_t *)c->w.wq,
                                      (void *)c->w.scales, (void *)c->w.biases);
  free(wf), free(wb);
  c->m = m;
  c->x = xmalloc((size_t)(m * cols) * sizeof *c->x);
  for (int64_t i = 0; i < m * cols; i++) c->x[i] = rng_float(&rng);
  c->xsum = xmalloc((size_t)(m * ng) * sizeof *c->xsum);
  c->y = xmalloc((size_t)(m * rows) * sizeof *c->y);
  c->scratch = xmalloc(rlm__qmatmul_q8_bytes(m, cols, g));
}

static void case_free(qmm_case *c) {
  free((void *)c->w.wq), free((void *)c->w.scales), free((void *)c->w.biases);
  free(c->x), free(c->xsum), free(c->y), free(c->scratch);
}

/* Seconds per product, median of reps; q8 selects the int8 path. */
static double time_product(qmm_case *c, rlm_pool *pool, bool q8, int reps) {
  double t[64];
  for (int r = 0; r < reps; r++) {
    double t0 = now_s();
    if (q8) rlm__qmatmul_q8(pool, &c->w, c->x, c->m, c->scratch, c->y);
    else rlm__qmatmul(pool, &c->w, c->x, c->m, c->xsum, c->y);
    t[r] = now_s() - t0;
  }
  return median(t, reps);
}

/* A head-sized matrix of random codes (bits, g64, bf16 scales near 0.01,
 * biases near 0) and m rows of x, without quantizing (see the top). */
static void head_make(qmm_case *c, int64_t rows, int64_t cols, int bits, int64_t m) {
  const int g = 64;
  const int64_t ng = cols / g;
  uint64_t rng = 7;
  const size_t nw = (size_t)(rows * rlm__quant_row_words(cols, bits)), ns = (size_t)(rows * ng);
  uint32_t *wq = xmalloc(nw * 4);
  uint16_t *sc = xmalloc(ns * 2), *bi = xmalloc(ns * 2);
  for (size_t i = 0; i < nw; i++) wq[i] = (uint32_t)rng_next(&rng);
  for (size_t i = 0; i < ns; i++) {
    const float s = 0.01f * (1.0f + 0.5f * rng_float(&rng)), b = 0.3f * rng_float(&rng);
    rlm__convert(&s, RLM_DTYPE_F32, sc + i, RLM_DTYPE_BF16, 1);
    rlm__convert(&b, RLM_DTYPE_F32, bi + i, RLM_DTYPE_BF16, 1);
  }
  c->w = (rlm_qmat){wq, sc, bi, RLM_DTYPE_BF16, rows, cols, bits, g};
  c->m = m;
  c->x = xmalloc((size_t)(m * cols) * sizeof *c->x);
  for (int64_t i = 0; i < m * cols; i++) c->x[i] = rng_float(&rng);
  c->xsum = xmalloc((size_t)(m * ng) * sizeof *c->xsum);
  c->y = xmalloc((size_t)(m * rows) * sizeof *c->y);
  c->scratch = xmalloc(rlm__qmatmul_q8_bytes(m, cols, g));
}

#if defined(__x86_64__) || defined(__i386__)
/* Seconds per one-thread product through the AVX2 kernels called directly
 * (6 bits; what a CPU without AVX-512 VNNI runs), median of reps. */
static double time_avx2(qmm_case *c, int reps) {
  double t[64];
  const int64_t cols = c->w.cols;
  const size_t stride = (rlm__q8act_bytes(cols) + 63) & ~(size_t)63;
  float *xsum = (float *)((char *)c->scratch + (size_t)c->m * stride);
  for (int r = 0; r < reps; r++) {
    double t0 = now_s();
    rlm__group_sums(c->x, c->m, cols, c->w.group_size, xsum);
    for (int64_t i = 0; i < c->m; i++)
      rlm__q8act_quantize_w6_avx2(c->x + i * cols, cols, (char *)c->scratch + (size_t)i * stride);
    if (c->m == 1) rlm__qmv_q8_avx2(&c->w, c->scratch, xsum, 0, c->w.rows, c->y);
    else rlm__qmm_q8_avx2(&c->w, c->scratch, stride, xsum, c->m, 0, c->w.rows, c->y);
    t[r] = now_s() - t0;
  }
  return median(t, reps);
}
#endif

/* The --heads table (see the top). */
static void heads(rlm_pool *pool, const int64_t *ms, int n_m, int reps, int threads) {
  static const struct {
    const char *name;
    int64_t rows, cols;
  } H[] = {{"llama3.2-1b 128256x2048", 128256, 2048}, {"qwen3-0.6b 151936x1024", 151936, 1024}};
  static const int BITS[] = {6, 4, 8};
  printf("bench_qmm --heads: g64 bf16 scales, %d thread(s), median of %d; us per product, GB/s of weight bytes\n",
         threads, reps);
  for (int h = 0; h < 2; h++) {
    const double b6 = (double)H[h].rows * ((double)H[h].cols * 6 / 8 + (double)(H[h].cols / 64) * 4);
    printf("  %s: one thread streams %.0f MB at %.1f GB/s\n", H[h].name, b6 / 1e6, bench_read((size_t)b6, 5));
    for (int k = 0; k < n_m; k++)
      for (int bi = 0; bi < 3; bi++) {
        qmm_case c;
        head_make(&c, H[h].rows, H[h].cols, BITS[bi], ms[k]);
        const double bytes = (double)H[h].rows * ((double)H[h].cols * BITS[bi] / 8 + (double)(H[h].cols / 64) * 4);
        const double tq = time_product(&c, pool, true, reps);
        printf("    %d-bit m=%-2lld int8 %9.0f us %6.1f GB/s", BITS[bi], (long long)ms[k], tq * 1e6, bytes / tq / 1e9);
        if (BITS[bi] == 6) {
          const double te = time_product(&c, pool, false, reps);
          printf("   f32 path %9.0f us %6.1f GB/s   int8 %.2fx", te * 1e6, bytes / te / 1e9, te / tq);
#if defined(__x86_64__) || defined(__i386__)
          if (threads == 1 && rlm__cpu_avx2()) {
            const double ta = time_avx2(&c, reps);
            printf("   avx2 int8 %9.0f us %6.1f GB/s", ta * 1e6, bytes / ta / 1e9);
          }
#endif
        }
        printf("\n");
        fflush(stdout);
        case_free(&c);
      }
  }
}

/* The --stack table (see the top). */
static void stack(rlm_pool *pool, int64_t m, int reps, int threads) {
  enum { LAYERS = 26, KINDS = 8 }; /* 7 a layer, then the head */
  static const struct {
    const char *name;
    int64_t rows, cols;
    int bits;
  } K[KINDS] = {{"q", 1024, 1152, 4},    {"k", 256, 1152, 4},    {"v", 256, 1152, 4},
                {"o", 1152, 1024, 4},    {"gate", 6912, 1152, 4}, {"up", 6912, 1152, 4},
                {"down", 1152, 6912, 4}, {"head8", 262144, 1152, 8}};
  qmm_case *c = xmalloc(sizeof *c * (LAYERS * (KINDS - 1) + 1));
  for (int l = 0; l < LAYERS; l++)
    for (int k = 0; k < KINDS - 1; k++) head_make(&c[l * (KINDS - 1) + k], K[k].rows, K[k].cols, K[k].bits, m);
  qmm_case *head = &c[LAYERS * (KINDS - 1)];
  head_make(head, K[KINDS - 1].rows, K[KINDS - 1].cols, K[KINDS - 1].bits, m);
  printf("bench_qmm --stack: Gemma-3-1B shape, m = %lld, %d thread(s), %d steps after one unmeasured\n",
         (long long)m, threads, reps);
  for (int hot = 0; hot < 2; hot++) {
    double t[KINDS] = {0}, macs[KINDS] = {0};
    for (int r = 0; r <= reps; r++)
      for (int i = 0; i <= LAYERS * (KINDS - 1); i++) {
        const int k = i == LAYERS * (KINDS - 1) ? KINDS - 1 : i % (KINDS - 1);
        qmm_case *q = k == KINDS - 1 ? head : &c[hot ? k : i];
        const double t0 = now_s();
        rlm__qmatmul_q8(pool, &q->w, q->x, q->m, q->scratch, q->y);
        if (r > 0) t[k] += now_s() - t0, macs[k] += (double)m * (double)q->w.rows * (double)q->w.cols;
      }
    double tt = 0, mm = 0;
    printf("  %s:", hot ? "one layer's weights reused (L3)" : "every layer's own weights (DRAM)");
    for (int k = 0; k < KINDS; k++) printf(" %s %.0f", K[k].name, macs[k] / t[k] / 1e9), tt += t[k], mm += macs[k];
    printf(" GMAC/s; step %.0f GMAC/s, %.2f ms, %.1f tok/s\n", mm / tt / 1e9, tt / reps * 1e3,
           (double)m * reps / tt);
  }
  for (int i = 0; i <= LAYERS * (KINDS - 1); i++) case_free(&c[i]);
  free(c);
}

/* "1,2,4" -> ms[]; returns the count (at most SWEEP_MAX, each >= 1). */
static int parse_list(const char *s, int64_t *ms) {
  int n = 0;
  for (char *end; *s && n < SWEEP_MAX; s = *end ? end + 1 : end) {
    ms[n] = strtoll(s, &end, 10);
    if (end == s || ms[n] < 1) return 0;
    n++;
  }
  return n;
}

/* The --sweep table: one line per shape, ms per product for each m and
 * t(m) / t(1) when m = 1 is listed first; the layer line sums. */
static void sweep(rlm_pool *pool, const int64_t *ms, int n_m, int reps) {
  double layer[SWEEP_MAX] = {0};
  printf("  %-20s", "ms (x m=1)");
  for (int k = 0; k < n_m; k++) printf("   m=%-2lld          ", (long long)ms[k]);
  printf("\n");
  for (size_t s = 0; s < sizeof SWEEP_SHAPES / sizeof *SWEEP_SHAPES; s++) {
    double t[SWEEP_MAX];
    for (int k = 0; k < n_m; k++) {
      qmm_case c;
      case_make(&c, &SWEEP_SHAPES[s], ms[k]);
      t[k] = time_product(&c, pool, false, reps);
      layer[k] += SWEEP_SHAPES[s].per_layer * t[k];
      case_free(&c);
    }
    printf("  %-20s", SWEEP_SHAPES[s].name);
    for (int k = 0; k < n_m; k++) printf(" %8.3f (%5.2fx)", t[k] * 1e3, t[k] / t[0]);
    printf("\n");
  }
  printf("  %-20s", "layer");
  for (int k = 0; k < n_m; k++) printf(" %8.3f (%5.2fx)", layer[k] * 1e3, layer[k] / layer[0]);
  printf("\n");
}

int main(int argc, char **argv) {
  int reps = 5, threads = 1, n_sweep = 0, n_heads = 0;
  int64_t m = 512, ms[SWEEP_MAX], mh[SWEEP_MAX], m_stack = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-m") && i + 1 < argc) m = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--sweep"))
      n_sweep = parse_list(i + 1 < argc && argv[i + 1][0] != '-' ? argv[++i] : "1,2,4,8,16", ms);
    else if (!strcmp(argv[i], "--heads"))
      n_heads = parse_list(i + 1 < argc && argv[i + 1][0] != '-' ? argv[++i] : "1,8", mh);
    else if (!strcmp(argv[i], "--stack") && i + 1 < argc && atoll(argv[i + 1]) >= 1) m_stack = atoll(argv[++i]);
    else n_sweep = -1;
    if (n_sweep < 0 || (!strcmp(argv[i], "--sweep") && n_sweep == 0) || (!strcmp(argv[i], "--heads") && n_heads == 0)) {
      fprintf(stderr,
              "usage: %s [--reps N] [-m ROWS] [--threads N] [--sweep M1,M2,...] [--heads M1,M2,...] [--stack M]\n",
              argv[0]);
      return 2;
    }
  }
  reps = reps < 1 ? 1 : reps > 64 ? 64 : reps;
  m = m < 1 ? 1 : m;
  rlm_pool *pool = NULL;
  if (threads > 1 && rlm__pool_create(&pool, threads, NULL)) {
    fprintf(stderr, "bench_qmm: cannot create a pool of %d threads\n", threads);
    return 1;
  }
  if (m_stack > 0) {
    stack(pool, m_stack, reps, threads);
    rlm__pool_free(pool);
    return 0;
  }
  if (n_heads > 0) {
    heads(pool, mh, n_heads, reps, threads);
    rlm__pool_free(pool);
    return 0;
  }
  if (n_sweep > 0) {
    printf("bench_qmm --sweep: 4-bit (head: 8-bit) g64 bf16 scales, exact path, %d thread(s), "
           "median of %d\n", threads, reps);
    sweep(pool, ms, n_sweep, reps);
    rlm__pool_free(pool);
    return 0;
  }
  printf("bench_qmm: 4-bit (head8: 8-bit) g64 bf16 scales, m = %lld, %d thread(s), median of %d\n",
         (long long)m, threads, reps);
  for (size_t s = 0; s < sizeof SHAPES / sizeof *SHAPES; s++) {
    qmm_case c;
    case_make(&c, &SHAPES[s], m);
    const double macs = (double)m * (double)c.w.rows * (double)c.w.cols;
    const double te = time_product(&c, pool, false, reps), tq = time_product(&c, pool, true, reps);
    printf("  %-20s exact %7.2f GMAC/s   int8 %7.2f GMAC/s  %5.2fx\n", SHAPES[s].name, macs / te / 1e9,
           macs / tq / 1e9, te / tq);
    case_free(&c);
  }
  rlm__pool_free(pool);
  return 0;
}
