/* bench_quant.c -- throughput of the quantization kernels against memory
 * bandwidth measured in the same run (this machine is shared and noisy:
 * every number is the median of several repetitions).
 *
 *   memcpy          N bytes copied, N = the 4-bit matrix's packed size
 *                   (larger than L3), reported as N / time
 *   read            the same N bytes summed (a read-only stream)
 *   qmatvec 4/8-bit each kernel table, GB/s of wq + scales + biases read
 *                   for one y = W x over matrices larger than L3
 *   quantize        input bytes per second, fast table vs reference
 *
 * The headline is qmatvec 4-bit (the dispatched table) / memcpy: decode
 * is one pass over the weights per token, so this ratio says how close a
 * single core gets to the memory system. It is taken from back-to-back
 * pairs so that load from other jobs hits both sides alike. A row on a
 * matrix that fits in L2 shows the kernel's compute ceiling. Single-
 * threaded unless --threads N, which adds rows for rlm__qmatmul over a
 * pool of N threads.
 *
 * usage: bench_quant [--quick] [--reps N] [--threads N]
 */
#include "bench.h"
#include "quant/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct {
  int reps;     /* repetitions per measurement (median taken) */
  int threads;  /* > 1: also the pooled product               */
  bool quick;
} bench_opts;



static void print_row(const char *what, double gbs, double base) {
  if (base > 0) printf("  %-40s %8.2f GB/s  %6.2fx memcpy\n", what, gbs, gbs / base);
  else printf("  %-40s %8.2f GB/s\n", what, gbs);
}

/* ---- baselines -------------------------------------------------------------- */

static double bench_memcpy(size_t n, int reps) {
  char *a = xmalloc(n), *b = xmalloc(n);
  memset(a, 1, n);
  double t[64];
  for (int r = 0; r < reps; r++) {
    double t0 = now_s();
    memcpy(b, a, n);
    t[r] = now_s() - t0;
  }
  free(a);
  free(b);
  return (double)n / median(t, reps) / 1e9;
}


/* ---- qmatvec ------------------------------------------------------------------ */

/* Random packed weights and f16 scales/biases: the kernels' speed does not
 * depend on the values, and quantizing 512 MB of floats would dominate. */
typedef struct {
  rlm_qmat w;
  void *mem;
  size_t bytes; /* wq + scales + biases */
  float *x, *xsum, *y;
} bench_mat;

static void mat_make(bench_mat *m, int64_t rows, int64_t cols, int bits, int g) {
  const size_t nw = (size_t)(rows * rlm__quant_row_words(cols, bits)) * 4;
  const size_t ns = (size_t)(rows * (cols / g)) * 2;
  uint8_t *mem = xmalloc(nw + 2 * ns);
  uint64_t rng = 42;
  for (size_t i = 0; i < nw / 8; i++) ((uint64_t *)mem)[i] = rng_next(&rng);
  for (size_t i = 0; i < ns / 2; i++) {
    ((uint16_t *)(mem + nw))[i] = rlm__f32_to_f16(0.01f * (1.0f + 0.5f * rng_float(&rng)));
    ((uint16_t *)(mem + nw + ns))[i] = rlm__f32_to_f16(-0.08f * (1.0f + 0.5f * rng_float(&rng)));
  }
  m->w = (rlm_qmat){(const uint32_t *)mem, mem + nw, mem + nw + ns, RLM_DTYPE_F16,
                    rows, cols, bits, g};
  m->mem = mem;
  m->bytes = nw + 2 * ns;
  m->x = xmalloc((size_t)cols * sizeof(float));
  m->xsum = xmalloc((size_t)(cols / g) * sizeof(float));
  m->y = xmalloc((size_t)rows * sizeof(float));
  for (int64_t j = 0; j < cols; j++) m->x[j] = rng_float(&rng);
  rlm__group_sums(m->x, 1, cols, g, m->xsum);
}

static void mat_free(bench_mat *m) {
  free(m->mem);
  free(m->x);
  free(m->xsum);
  free(m->y);
}

static double bench_qmatvec(bench_mat *m, const rlm_quant_kernels *k, int reps) {
  double t[64];
  k->qmatvec(&m->w, m->x, m->xsum, 0, m->w.rows, m->y); /* warm-up */
  for (int r = 0; r < reps; r++) {
    double t0 = now_s();
    k->qmatvec(&m->w, m->x, m->xsum, 0, m->w.rows, m->y);
    t[r] = now_s() - t0;
  }
  return (double)m->bytes / median(t, reps) / 1e9;
}

/* m = 4 rows of x (x repeated); GB/s of weight bytes per call. */
static double bench_qmatmul4(bench_mat *m, const rlm_quant_kernels *k, int reps) {
  const int64_t cols = m->w.cols, n_groups = cols / m->w.group_size;
  float *x = xmalloc((size_t)(4 * cols) * sizeof *x), *y = xmalloc((size_t)(4 * m->w.rows) * 4);
  float *xsum = xmalloc((size_t)(4 * n_groups) * sizeof *xsum);
  for (int i = 0; i < 4; i++) memcpy(x + i * cols, m->x, (size_t)cols * sizeof *x);
  rlm__group_sums(x, 4, cols, m->w.group_size, xsum);
  double t[64];
  for (int r = 0; r < reps; r++) {
    double t0 = now_s();
    k->qmatmul(&m->w, x, xsum, 4, 0, m->w.rows, y);
    t[r] = now_s() - t0;
  }
  free(x);
  free(y);
  free(xsum);
  return (double)m->bytes / median(t, reps) / 1e9;
}

static double bench_pooled(bench_mat *m, rlm_pool *pool, int reps) {
  double t[64];
  for (int r = 0; r < reps; r++) {
    double t0 = now_s();
    rlm__qmatmul(pool, &m->w, m->x, 1, m->xsum, m->y);
    t[r] = now_s() - t0;
  }
  return (double)m->bytes / median(t, reps) / 1e9;
}

/* Rows for every table on one matrix. */
static void qmatvec_rows(bench_mat *m, const bench_opts *o, double base, rlm_pool *pool) {
  const rlm_quant_kernels *tables[] = {rlm__quant_kernels_avx512(), rlm__quant_kernels_avx2(),
                                       &rlm__quant_kernels_ref};
  char what[96];
  for (int i = 0; i < 3; i++) {
    if (!tables[i]) continue;
    bool ref = tables[i] == &rlm__quant_kernels_ref;
    double gbs = bench_qmatvec(m, tables[i], ref ? (o->quick ? 1 : 3) : o->reps);
    snprintf(what, sizeof what, "qmatvec %d-bit %s", m->w.bits, tables[i]->name);
    print_row(what, gbs, base);
  }
  if (m->w.bits == 4) { /* batch of 4: the weights are read (and unpacked) once */
    snprintf(what, sizeof what, "qmatmul %d-bit %s, m=4", m->w.bits, rlm__quant_kernels()->name);
    print_row(what, bench_qmatmul4(m, rlm__quant_kernels(), o->reps), base);
  }
  if (pool) {
    snprintf(what, sizeof what, "qmatvec %d-bit %s, %d threads", m->w.bits,
             rlm__quant_kernels()->name, rlm__pool_size(pool));
    print_row(what, bench_pooled(m, pool, o->reps), base);
  }
}

/* The headline, measured in pairs: memcpy then the dispatched 4-bit
 * qmatvec, back to back, so both see the same background load (other
 * jobs share this machine's memory); the median of the per-pair ratios. */
static double paired_ratio(bench_mat *m, int reps) {
  const size_t n = m->bytes;
  char *a = xmalloc(n), *b = xmalloc(n);
  const rlm_quant_kernels *k = rlm__quant_kernels();
  double ratio[64];
  for (int r = 0; r < reps; r++) {
    double t0 = now_s();
    memcpy(b, a, n);
    double t1 = now_s();
    k->qmatvec(&m->w, m->x, m->xsum, 0, m->w.rows, m->y);
    double t2 = now_s();
    ratio[r] = (t1 - t0) / (t2 - t1); /* same byte count on both sides */
  }
  free(a);
  free(b);
  return median(ratio, reps);
}

/* The same 4-bit product on a 1 MiB matrix that stays in L2, repeated:
 * the kernel's compute ceiling, for reading the DRAM number against. */
static void cache_resident_row(const bench_opts *o, double base) {
  bench_mat m;
  mat_make(&m, 256, 4096, 4, 64);
  double t[64];
  const rlm_quant_kernels *k = rlm__quant_kernels();
  for (int r = 0; r < o->reps; r++) {
    double t0 = now_s();
    for (int i = 0; i < 50; i++) k->qmatvec(&m.w, m.x, m.xsum, 0, m.w.rows, m.y);
    t[r] = (now_s() - t0) / 50;
  }
  char what[96];
  snprintf(what, sizeof what, "qmatvec 4-bit %s, in L2 (256x4096)", k->name);
  print_row(what, (double)m.bytes / median(t, o->reps) / 1e9, base);
  mat_free(&m);
}

/* ---- quantize ----------------------------------------------------------------- */

static double bench_quantize(const rlm_quant_kernels *k, const void *x, rlm_dtype dt,
                             int64_t rows, int64_t cols, int bits, int g, int reps) {
  uint32_t *wq = xmalloc((size_t)(rows * rlm__quant_row_words(cols, bits)) * 4);
  const size_t ns = (size_t)(rows * (cols / g)) * 4;
  void *s = xmalloc(ns), *b = xmalloc(ns);
  double t[64];
  for (int r = 0; r < reps; r++) {
    double t0 = now_s();
    k->quantize_rows(x, dt, rows, cols, bits, g, wq, s, b);
    t[r] = now_s() - t0;
  }
  free(wq);
  free(s);
  free(b);
  return (double)(rows * cols) * (double)rlm_dtype_size(dt) / median(t, reps) / 1e9;
}

static void quantize_rows_table(const bench_opts *o, rlm_dtype dt) {
  const int64_t rows = o->quick ? 256 : 1024, cols = 8192;
  float *f = xmalloc((size_t)(rows * cols) * sizeof *f);
  uint64_t rng = 7;
  for (int64_t i = 0; i < rows * cols; i++) f[i] = rng_float(&rng);
  void *x = xmalloc((size_t)(rows * cols) * rlm_dtype_size(dt));
  rlm__convert(f, RLM_DTYPE_F32, x, dt, rows * cols);
  const rlm_quant_kernels *fast = rlm__quant_kernels();
  double gf = bench_quantize(fast, x, dt, rows, cols, 4, 64, o->reps);
  double gr = bench_quantize(&rlm__quant_kernels_ref, x, dt, rows, cols, 4, 64,
                             o->quick ? 1 : 3);
  printf("  quantize %-4s 4-bit g64 %-6s %15.2f GB/s   ref %6.2f GB/s  %5.1fx\n",
         rlm_dtype_name(dt), fast->name, gf, gr, gf / gr);
  free(f);
  free(x);
}

/* ---- main ----------------------------------------------------------------------- */

static bench_opts parse_args(int argc, char **argv) {
  bench_opts o = {.reps = 7, .threads = 1, .quick = false};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) o.quick = true, o.reps = 3;
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) o.reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) o.threads = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [--quick] [--reps N] [--threads N]\n", argv[0]);
      exit(2);
    }
  }
  o.reps = o.reps < 1 ? 1 : o.reps > 64 ? 64 : o.reps;
  return o;
}

int main(int argc, char **argv) {
  bench_opts o = parse_args(argc, argv);
  rlm_pool *pool = NULL;
  if (o.threads != 1 && rlm__pool_create(&pool, o.threads, NULL)) {
    fprintf(stderr, "bench_quant: cannot create a pool of %d threads\n", o.threads);
    return 1;
  }
  bench_mat m4, m8;
  mat_make(&m4, 16384, 8192, 4, 64); /* 64 MiB of codes: well past a 32 MiB L3 */
  mat_make(&m8, 8192, 8192, 8, 64);
  const size_t n = m4.bytes;
  printf("bench_quant: 1 thread%s, median of %d; fast table \"%s\"\n",
         pool ? " (and a pool where marked)" : "", o.reps, rlm__quant_kernels()->name);
  printf("  4-bit W 16384x8192 g64 f16 scales (%.1f MB), 8-bit W 8192x8192 (%.1f MB)\n",
         m4.bytes / 1e6, m8.bytes / 1e6);
  double mc = bench_memcpy(n, o.reps);
  print_row("memcpy", mc, 0);
  print_row("read (sum)", bench_read(n, o.reps), mc);
  qmatvec_rows(&m4, &o, mc, pool);
  cache_resident_row(&o, mc);
  double ratio = paired_ratio(&m4, o.reps);
  qmatvec_rows(&m8, &o, mc, pool);
  mat_free(&m4);
  mat_free(&m8);
  quantize_rows_table(&o, RLM_DTYPE_F32);
  quantize_rows_table(&o, RLM_DTYPE_BF16);
  printf("ratio fast_qmatvec_4bit / memcpy = %.2f  (%s, median of %d back-to-back pairs)\n",
         ratio, rlm__quant_kernels()->name, o.reps);
  rlm__pool_free(pool);
  return 0;
}
