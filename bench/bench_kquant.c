/* bench_kquant.c -- products straight over GGUF blocks (quant/kquant.h):
 * y[m][rows] = x[m][cols] W^T for Q4_K, Q5_K, Q6_K, Q8_0 and Q5_0 matrices of random
 * blocks, on Gemma-3-1B-like shapes, beside the MLX 4-bit g32 (bf16
 * scales) int8 path (rlm__qmatmul_q8) on the same shape.
 *
 *   f32    rlm__kq_matmul     (f32 activations)
 *   int8   rlm__kq_matmul_q8  (activations quantized per block of 32)
 *   mlx4   rlm__qmatmul_q8    (4-bit g32 bf16: 5 bits per weight)
 *
 * Each figure is a median of repetitions, in us per product, and as GB/s
 * of weight bytes read (the decode bound: m = 1 should approach the
 * streaming read bandwidth printed first) and GMAC/s.
 *
 * Gemma 3 1B's hidden size 1152 is not a multiple of 256, so its 6912 x
 * 1152 gate/up and 262144 x 1152 tied head cannot be Q4_K / Q6_K; llama.cpp
 * quantizes them as Q5_0 and Q8_0 (llama-quant.cpp's fallback). The K
 * shapes with 1152 columns are replaced by 1024 here, and the Q8_0 head is
 * measured at its real shape.
 *
 * --cold N cycles each product through N copies of the weights (and of
 * the MLX ones), so that they come from memory rather than the caches
 * (this machine's L3 holds 480 MB: N copies should exceed it).
 *
 * --head: the two tied heads above; --llama: Llama-3.2-1B's shapes; --q5:
 * the Q5_0 and Q5_K shapes only.
 *
 * --isa NAME times that kernel table (default: the CPU's fastest); the
 * mlx4 column is always the default path.
 *
 * usage: bench_kquant [--reps N] [--threads N] [-m M1,M2,...] [--head | --llama | --q5] [--cold N]
 *                     [--isa ref|avx2|avx512vnni]
 */
#include "bench.h"
#include "quant/kquant.h"
#include "quant/quant.h"

typedef struct shape {
  const char *name;
  rlm_kq_type type;
  int64_t rows, cols;
} shape;

static const shape SHAPES[] = {
    {"Q4_K down 1152x6912", RLM_KQ_Q4_K, 1152, 6912},
    {"Q4_K gate 6912x1024", RLM_KQ_Q4_K, 6912, 1024},
    {"Q6_K down 1152x6912", RLM_KQ_Q6_K, 1152, 6912},
    {"Q8_0 gate 6912x1152", RLM_KQ_Q8_0, 6912, 1152},
    {"Q5_0 gate/up 6912x1152", RLM_KQ_Q5_0, 6912, 1152},
    {"Q5_0 1152x6912", RLM_KQ_Q5_0, 1152, 6912},
};

/* --q5: the Q5_0 shapes (Gemma 3's gate/up as llama.cpp's Q4_K_M stores
 * them, and the transposed shape) and Q5_K ones (Q5_K_M files). */
static const shape Q5[] = {
    {"Q5_0 gate/up 6912x1152", RLM_KQ_Q5_0, 6912, 1152},
    {"Q5_0 1152x6912", RLM_KQ_Q5_0, 1152, 6912},
    {"Q5_K down 1152x6912", RLM_KQ_Q5_K, 1152, 6912},
    {"Q5_K gate 6912x1024", RLM_KQ_Q5_K, 6912, 1024},
};

/* Llama-3.2-1B Q4_K_M (hidden 2048: every K shape fits): q/o, gate/up,
 * down (Q6_K in half the layers), the tied head (Q6_K). */
static const shape LLAMA[] = {
    {"Q4_K q/o 2048x2048", RLM_KQ_Q4_K, 2048, 2048},
    {"Q4_K gate/up 8192x2048", RLM_KQ_Q4_K, 8192, 2048},
    {"Q4_K down 2048x8192", RLM_KQ_Q4_K, 2048, 8192},
    {"Q6_K down 2048x8192", RLM_KQ_Q6_K, 2048, 8192},
    {"Q6_K head 128256x2048", RLM_KQ_Q6_K, 128256, 2048},
};

static const shape HEADS[] = {
    {"Q6_K head 262144x1024", RLM_KQ_Q6_K, 262144, 1024},
    {"Q8_0 head 262144x1152", RLM_KQ_Q8_0, 262144, 1152},
};

static void fill_random(uint8_t *p, size_t n, uint64_t *rng) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t r = rng_next(rng);
    memcpy(p + i, &r, 8);
  }
  for (; i < n; i++) p[i] = (uint8_t)rng_next(rng);
}

/* Random blocks with small finite f16 scales. */
static rlm_kqmat make_mat(const shape *s, uint64_t *rng) {
  const size_t n = (size_t)s->rows * rlm__kq_row_bytes(s->type, s->cols);
  uint8_t *p = xmalloc(n);
  fill_random(p, n, rng);
  const size_t bb = (size_t)rlm__kq_block_bytes(s->type);
  const uint16_t d = 0x2000; /* f16 ~0.0078 */
  for (size_t b = 0; b < n / bb; b++) {
    uint8_t *blk = p + b * bb;
    if (s->type == RLM_KQ_Q6_K) memcpy(blk + 208, &d, 2);
    else memcpy(blk, &d, 2);
    if (s->type == RLM_KQ_Q4_K || s->type == RLM_KQ_Q5_K) memcpy(blk + 2, &d, 2);
  }
  return (rlm_kqmat){p, s->type, s->rows, s->cols};
}

/* The same shape as MLX 4-bit g32 bf16 (random codes and scales). */
static rlm_qmat make_mlx(const shape *s, uint64_t *rng) {
  const int64_t rows = s->rows, cols = s->cols, ng = cols / 32;
  uint32_t *wq = xmalloc((size_t)(rows * cols / 8) * 4);
  uint16_t *sc = xmalloc((size_t)(rows * ng) * 2), *bi = xmalloc((size_t)(rows * ng) * 2);
  fill_random((uint8_t *)wq, (size_t)(rows * cols / 2), rng);
  for (int64_t i = 0; i < rows * ng; i++) sc[i] = 0x3c00, bi[i] = 0xbc00; /* bf16 ~1.0e-?: any finite */
  return (rlm_qmat){wq, sc, bi, RLM_DTYPE_BF16, rows, cols, 4, 32};
}

enum { MAX_M = 8 };

enum { MAX_COPIES = 512 };

static const rlm_kq_kernels *g_kern; /* --isa: the table timed */

typedef struct run {
  const rlm_kqmat *w; /* [copies] */
  const rlm_qmat *q;  /* [copies] */
  int copies;
  const float *x;
  int64_t m;
  void *scratch;
  float *y;
  rlm_pool *pool;
} run;

static double time_it(const run *r, int which, int reps) {
  double t[64];
  for (int k = 0; k < reps; k++) {
    static int next; /* across calls: a copy is reused only after all others */
    const int c = next++ % r->copies;
    const double t0 = now_s();
    if (which == 0) rlm__kq_matmul_with(g_kern, r->pool, &r->w[c], r->x, r->m, r->y);
    else if (which == 1) rlm__kq_matmul_q8_with(g_kern, r->pool, &r->w[c], r->x, r->m, r->scratch, r->y);
    else rlm__qmatmul_q8(r->pool, &r->q[c], r->x, r->m, r->scratch, r->y);
    t[k] = now_s() - t0;
  }
  return median(t, reps);
}

static rlm_kqmat g_w[MAX_COPIES];
static rlm_qmat g_q[MAX_COPIES];

static void bench_shape(const shape *s, const int64_t *ms, int n_m, rlm_pool *pool, int reps, int copies,
                        uint64_t *rng) {
  const bool mlx = s->cols % 128 == 0; /* rlm__q8act_ok */
  for (int c = 0; c < copies; c++) {
    g_w[c] = make_mat(s, rng);
    if (mlx) g_q[c] = make_mlx(s, rng);
  }
  const double wbytes = (double)s->rows * (double)rlm__kq_row_bytes(s->type, s->cols);
  const double mbytes = (double)s->rows * (double)s->cols * 5.0 / 8.0;
  int64_t mmax = 1;
  for (int k = 0; k < n_m; k++) mmax = ms[k] > mmax ? ms[k] : mmax;
  float *x = xmalloc((size_t)(mmax * s->cols) * sizeof *x), *y = xmalloc((size_t)(mmax * s->rows) * sizeof *y);
  for (int64_t i = 0; i < mmax * s->cols; i++) x[i] = rng_float(rng);
  size_t sb = rlm__kq_matmul_q8_bytes(mmax, s->cols), sq = rlm__qmatmul_q8_bytes(mmax, s->cols, 32);
  void *scratch = aligned_alloc(64, ((sb > sq ? sb : sq) + 63) / 64 * 64);
  printf("%s: %.2f MB (%.3f bits/weight; mlx4 g32 %.2f MB)\n", s->name, wbytes / 1e6,
         wbytes * 8 / ((double)s->rows * (double)s->cols), mbytes / 1e6);
  for (int k = 0; k < n_m; k++) {
    run r = {g_w, g_q, copies, x, ms[k], scratch, y, pool};
    const int rp = reps;
    const double tf = time_it(&r, 0, rp), t8 = time_it(&r, 1, rp), tm = mlx ? time_it(&r, 2, rp) : 0;
    const double macs = (double)ms[k] * (double)s->rows * (double)s->cols;
    printf("  m=%-3lld f32 %9.1f us %6.2f GB/s %6.2f GMAC/s | int8 %9.1f us %6.2f GB/s %6.2f GMAC/s", (long long)ms[k],
           tf * 1e6, wbytes / tf / 1e9, macs / tf / 1e9, t8 * 1e6, wbytes / t8 / 1e9, macs / t8 / 1e9);
    if (mlx) printf(" | mlx4 %9.1f us %6.2f GB/s", tm * 1e6, mbytes / tm / 1e9);
    printf("\n");
  }
  free(x), free(y), free(scratch);
  for (int c = 0; c < copies; c++) {
    free((void *)g_w[c].blocks);
    if (mlx) free((void *)g_q[c].wq), free((void *)g_q[c].scales), free((void *)g_q[c].biases);
  }
}

/* "1,2,4" -> ms[]; returns the count. */
static int parse_list(const char *s, int64_t *ms, int cap) {
  int n = 0;
  for (char *end; *s && n < cap; s = *end ? end + 1 : end) {
    ms[n] = strtoll(s, &end, 10);
    if (end == s || ms[n] < 1) return 0;
    n++;
  }
  return n;
}

int main(int argc, char **argv) {
  int reps = 15, threads = 1, n_m = 5, head = 0, copies = 1;
  int64_t ms[16] = {1, 2, 4, 8, 64};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-m") && i + 1 < argc) n_m = parse_list(argv[++i], ms, 16);
    else if (!strcmp(argv[i], "--head")) head = 1;
    else if (!strcmp(argv[i], "--llama")) head = 2;
    else if (!strcmp(argv[i], "--q5")) head = 3;
    else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
      const char *isa = argv[++i];
      g_kern = !strcmp(isa, "ref") ? &rlm__kq_kernels_ref : !strcmp(isa, "avx2") ? rlm__kq_kernels_avx2()
               : !strcmp(isa, "avx512vnni") ? rlm__kq_kernels_avx512() : NULL;
      if (!g_kern) n_m = 0;
    }
    else if (!strcmp(argv[i], "--cold") && i + 1 < argc) copies = atoi(argv[++i]);
    else n_m = 0;
    if (n_m == 0) {
      fprintf(stderr, "usage: %s [--reps N] [--threads N] [-m M1,M2,...] [--head | --llama | --q5] [--cold N] [--isa ref|avx2|avx512vnni]\n", argv[0]);
      return 2;
    }
  }
  if (!g_kern) g_kern = rlm__kq_kernels();
  reps = reps < 1 ? 1 : reps > 64 ? 64 : reps;
  copies = copies < 1 ? 1 : copies > MAX_COPIES ? MAX_COPIES : copies;
  rlm_pool *pool = NULL;
  if (threads > 1 && rlm__pool_create(&pool, threads, NULL)) {
    fprintf(stderr, "bench_kquant: cannot create a pool of %d threads\n", threads);
    return 1;
  }
  printf("bench_kquant: kernels %s, %d thread(s), median of %d, %d cop%s; streaming read %.1f GB/s (1 thread)\n",
         g_kern->name, threads, reps, copies, copies > 1 ? "ies" : "y", bench_read((size_t)256 << 20, 5));
  uint64_t rng = 42;
  const shape *list = head == 1 ? HEADS : head == 2 ? LLAMA : head == 3 ? Q5 : SHAPES;
  const int n = head == 1 ? (int)(sizeof HEADS / sizeof *HEADS)
                : head == 2 ? (int)(sizeof LLAMA / sizeof *LLAMA)
                : head == 3 ? (int)(sizeof Q5 / sizeof *Q5) : (int)(sizeof SHAPES / sizeof *SHAPES);
  for (int s = 0; s < n; s++) bench_shape(&list[s], ms, n_m, pool, reps, copies, &rng);
  rlm__pool_free(pool);
  return 0;
}
