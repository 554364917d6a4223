/* bench_attn.c -- one decode step of attention for one layer of a
 * Llama-3-8B-like model: 8 kv heads, 4 query heads per kv head (GQA),
 * head_dim 128, one thread. Each step is 8 calls of the fused kernel (one
 * per kv head, n_q = 4 query rows) over the whole cache: 4096, 16384 and
 * 65536 positions, stored as
 *
 *   f16        dense K and V                      512 bytes per slot
 *   q8 g64     8-bit codes, f16 scales and biases 272 bytes per slot
 *   q4 g64     4-bit codes, f16 scales and biases 144 bytes per slot
 *
 * Per row: time per step, steps per second, bytes of K + V read per step
 * (codes, scales and biases) and the resulting GB/s. The reference kernel
 * (allocating, dequantizing) runs at 4096 only, for scale. The headline is
 * 4-bit / f16 fused speed at 16384: decode attention should be bound by
 * the bytes it reads, so fewer bytes must mean faster steps.
 *
 * Then int8 queries (attn.h's int8_q, what act_bits 8 turns on) against
 * the exact scores, for 4-bit K and V g64 at 16384 positions in two
 * shapes: head_dim 128 with 8 kv heads (Llama-like, as above) and
 * head_dim 256 with one kv head (Gemma 3 1B's global layers), 4 query
 * rows each. The two run alternately, each repetition walking all copies
 * once, so drifts in the machine's speed hit both alike; the rows give
 * the median time per call of the fused kernel (one kv head) and the
 * ratio.
 *
 * Every number is the median of several repetitions (the machine is
 * shared). When one copy of the cache would fit in the last-level cache,
 * the step rotates over enough copies to make ~256 MB, so every step reads
 * from memory as it would in a real model (where the other layers evict
 * this one). A streaming-read baseline is printed for comparison.
 *
 * usage: bench_attn [--quick] [--reps N] [--isa scalar|avx2|avx512|avx512vnni]
 *                   [--int8-only]
 * (default: the variant rlm__attn_fused uses on this CPU; --int8-only:
 * only the int8-query comparison)
 */
#include "bench.h"
#include "attn/attn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum {
  N_KV = 8,      /* kv heads (Llama-like shape)        */
  N_REP = 4,     /* query heads per kv head           */
  HEAD_DIM = 128,
  DIM_MAX = 256, /* largest head_dim (int8 section)    */
  GROUP = 64,    /* quantization group                */
  MAX_COPIES = 64,
};

typedef struct bench_opts {
  int reps;
  bool quick;
  bool int8_only;
  const char *isa;       /* NULL: the kernel rlm__attn_fused picks */
  rlm_attn_fused_fn fn;
} bench_opts;

/* One layer's cache, `copies` times, with the segments that view it. */
typedef struct cache {
  int bits;              /* 0: f16 dense                 */
  int dim;               /* head_dim                     */
  int n_kv;              /* kv heads                     */
  int64_t n;             /* positions                    */
  int copies;
  size_t bytes;          /* K + V bytes of one copy      */
  uint8_t *mem;
  int32_t *pos;          /* [n] 0..n-1                   */
  rlm_attn_seg *segs;    /* [copies][n_kv]               */
} cache;



/* ---- the cache ------------------------------------------------------------- */

/* Bytes of one slot of K (or V): codes or f16 elements, plus f16 scales
 * and biases. */
static size_t slot_bytes(int bits, int dim) {
  if (!bits) return (size_t)dim * 2;
  return (size_t)dim * (size_t)bits / 8 + 2 * 2 * (size_t)(dim / GROUP);
}

/* Fills one copy: f16 values in [-1, 1), or random codes with f16 scales
 * ~0.02 and biases ~-0.3 (speed does not depend on the values, but
 * NaNs and subnormals could, so the f16 bits are real numbers). */
static void fill_copy(uint8_t *p, size_t bytes, int bits, int dim, int n_kv, int64_t n) {
  uint64_t rng = 42;
  const size_t sb = (size_t)n * (size_t)(dim / GROUP) * 2; /* scales (or biases) of one matrix */
  const size_t codes = (size_t)n * (size_t)dim * (size_t)bits / 8;
  uint16_t *h = (uint16_t *)p;
  if (!bits) {
    for (size_t i = 0; i < bytes / 2; i++) h[i] = rlm__f32_to_f16(rng_float(&rng));
    return;
  }
  for (size_t m = 0; m < 2 * (size_t)n_kv; m++) { /* K and V of every head: codes, scales, biases */
    uint8_t *c = p + m * (codes + 2 * sb);
    for (size_t i = 0; i < codes / 8; i++) ((uint64_t *)c)[i] = rng_next(&rng);
    uint16_t *s = (uint16_t *)(c + codes), *b = (uint16_t *)(c + codes + sb);
    for (size_t i = 0; i < sb / 2; i++) {
      s[i] = rlm__f32_to_f16(0.02f * (1.0f + 0.5f * rng_float(&rng)));
      b[i] = rlm__f32_to_f16(-0.3f * (1.0f + 0.5f * rng_float(&rng)));
    }
  }
}

static rlm_attn_mat mat_at(const uint8_t *base, int bits, int dim, int64_t n) {
  if (!bits) return (rlm_attn_mat){.dtype = RLM_DTYPE_F16, .data = base, .row_stride = dim};
  const size_t codes = (size_t)n * (size_t)dim * (size_t)bits / 8;
  const size_t sb = (size_t)n * (size_t)(dim / GROUP) * 2;
  return (rlm_attn_mat){.bits = bits, .dtype = RLM_DTYPE_F16, .group_size = GROUP, .data = base,
                        .scales = base + codes, .biases = base + codes + sb,
                        .row_stride = dim * bits / 32, .sb_stride = dim / GROUP};
}

static void cache_make(cache *c, int bits, int dim, int n_kv, int64_t n, size_t rotate_bytes) {
  c->bits = bits;
  c->dim = dim;
  c->n_kv = n_kv;
  c->n = n;
  c->bytes = (size_t)n * (size_t)n_kv * 2 * slot_bytes(bits, dim);
  c->copies = (int)((rotate_bytes + c->bytes - 1) / c->bytes);
  c->copies = c->copies < 1 ? 1 : c->copies > MAX_COPIES ? MAX_COPIES : c->copies;
  c->mem = xmalloc(c->bytes * (size_t)c->copies);
  fill_copy(c->mem, c->bytes, bits, dim, n_kv, n);
  for (int k = 1; k < c->copies; k++) memcpy(c->mem + k * c->bytes, c->mem, c->bytes);
  c->pos = xmalloc((size_t)n * sizeof *c->pos);
  for (int64_t i = 0; i < n; i++) c->pos[i] = (int32_t)i;
  c->segs = xmalloc((size_t)c->copies * (size_t)n_kv * sizeof *c->segs);
  const size_t mat = c->bytes / (2 * (size_t)n_kv);
  for (int k = 0; k < c->copies; k++)
    for (int h = 0; h < n_kv; h++) {
      const uint8_t *kb = c->mem + k * c->bytes + (size_t)(2 * h) * mat;
      c->segs[k * n_kv + h] = (rlm_attn_seg){.n = n, .pos = c->pos, .k = mat_at(kb, bits, dim, n),
                                             .v = mat_at(kb + mat, bits, dim, n)};
    }
}

static void cache_free(cache *c) {
  free(c->mem);
  free(c->pos);
  free(c->segs);
}

/* ---- one decode step ---------------------------------------------------------- */

typedef struct step_io {
  float *q;       /* [n_kv][N_REP][dim] (at most N_KV x DIM_MAX) */
  float *out;     /* [n_kv][N_REP][dim]                          */
  float *scratch;
  int64_t q_pos[N_REP];
  bool int8_q;    /* attn.h's int8_q for every call               */
} step_io;

/* All heads of copy k; ref: the reference kernel instead. */
static void step(const cache *c, int k, step_io *io, rlm_attn_fused_fn fn, bool ref) {
  const size_t rows = (size_t)N_REP * (size_t)c->dim;
  for (int h = 0; h < c->n_kv; h++) {
    rlm_attn_args a = {.segs = &c->segs[k * c->n_kv + h], .n_segs = 1, .dim_k = c->dim,
                       .dim_v = c->dim, .q = io->q + h * rows, .q_pos = io->q_pos,
                       .n_q = N_REP, .scale = 1.0f / sqrtf((float)c->dim),
                       .out = io->out + h * rows, .int8_q = io->int8_q};
    if (!ref) fn(&a, io->scratch);
    else if (rlm__attn_ref(&a)) {
      fprintf(stderr, "bench_attn: reference failed\n");
      exit(1);
    }
  }
}

/* Median seconds per step: each repetition walks all copies once. */
static double time_steps(const cache *c, step_io *io, rlm_attn_fused_fn fn, bool ref, int reps) {
  double t[64];
  for (int k = 0; k < c->copies && !ref; k++) step(c, k, io, fn, ref); /* warm-up */
  const int copies = ref ? 1 : c->copies;
  for (int r = 0; r < reps; r++) {
    double t0 = now_s();
    for (int k = 0; k < copies; k++) step(c, k, io, fn, ref);
    t[r] = (now_s() - t0) / copies;
  }
  return median(t, reps);
}

static const char *storage_name(int bits) {
  return bits == 0 ? "f16" : bits == 8 ? "q8 g64 f16" : "q4 g64 f16";
}

/* Exact and int8-query steps alternately, reps times: the median seconds
 * per step of each (sec[0] exact, sec[1] int8). */
static void time_alternating(const cache *c, step_io *io, rlm_attn_fused_fn fn, int reps,
                             double sec[2]) {
  double t[2][64];
  for (int r = -1; r < reps; r++) /* r = -1: warm-up */
    for (int v = 0; v < 2; v++) {
      io->int8_q = v == 1;
      const double t0 = now_s();
      for (int k = 0; k < c->copies; k++) step(c, k, io, fn, false);
      if (r >= 0) t[v][r] = (now_s() - t0) / c->copies;
    }
  io->int8_q = false;
  for (int v = 0; v < 2; v++) sec[v] = median(t[v], reps);
}

static double print_row(const cache *c, double sec, const char *suffix) {
  const double mb = (double)c->bytes / 1e6;
  printf("  %9lld  %-11s%-6s %9.3f %9.1f %9.2f %8.2f\n", (long long)c->n, storage_name(c->bits),
         suffix, sec * 1e3, 1.0 / sec, mb, mb / 1e3 / sec);
  return 1.0 / sec;
}

/* ---- baseline ----------------------------------------------------------------- */


/* ---- main ----------------------------------------------------------------------- */

static bench_opts parse_args(int argc, char **argv) {
  bench_opts o = {.reps = 9, .quick = false, .isa = NULL, .fn = NULL};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) o.quick = true, o.reps = 3;
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) o.reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--isa") && i + 1 < argc) o.isa = argv[++i];
    else if (!strcmp(argv[i], "--int8-only")) o.int8_only = true;
    else {
      fprintf(stderr,
              "usage: %s [--quick] [--reps N] [--isa scalar|avx2|avx512|avx512vnni] [--int8-only]\n",
              argv[0]);
      exit(2);
    }
  }
  o.reps = o.reps < 1 ? 1 : o.reps > 64 ? 64 : o.reps;
  if (o.isa && !(o.fn = rlm__attn_fused_isa(o.isa))) {
    fprintf(stderr, "bench_attn: isa '%s' unknown or not supported by this CPU\n", o.isa);
    exit(2);
  }
  static const char *const fastest_first[4] = {"avx512vnni", "avx512", "avx2", "scalar"};
  for (int i = 0; i < 4 && !o.fn; i++) /* the order rlm__attn_fused picks in */
    if ((o.fn = rlm__attn_fused_isa(fastest_first[i]))) o.isa = fastest_first[i];
  return o;
}

static void io_init(step_io *io) {
  uint64_t rng = 7;
  const size_t nq = N_KV * N_REP * DIM_MAX;
  io->q = xmalloc(nq * sizeof *io->q);
  io->out = xmalloc(nq * sizeof *io->out);
  io->scratch = xmalloc(rlm__attn_scratch_floats(N_REP, DIM_MAX, DIM_MAX) * sizeof(float));
  io->int8_q = false;
  for (size_t i = 0; i < nq; i++) io->q[i] = rng_float(&rng);
}

/* The int8-query section (see the top of the file). */
static void bench_int8(const bench_opts *o, step_io *io, size_t rotate) {
  static const struct { int dim, n_kv; const char *name; } shapes[2] = {
      {128, N_KV, "Llama-like"}, {256, 1, "Gemma 3 1B global"}};
  const int64_t n = 16384;
  printf("  int8 queries vs exact scores, q4 g64 K and V, %lld positions, %d query rows per kv head\n",
         (long long)n, N_REP);
  printf("  %4s %4s %-18s %12s %12s %8s %9s\n", "dim", "kv", "shape", "exact us", "int8 us",
         "speedup", "GB/s int8");
  for (int s = 0; s < 2; s++) {
    cache c;
    cache_make(&c, 4, shapes[s].dim, shapes[s].n_kv, n, rotate);
    for (int r = 0; r < N_REP; r++) io->q_pos[r] = n;
    double sec[2];
    time_alternating(&c, io, o->fn, o->reps, sec);
    const double per_call = 1e6 / shapes[s].n_kv;
    printf("  %4d %4d %-18s %12.1f %12.1f %7.2fx %9.2f\n", shapes[s].dim, shapes[s].n_kv,
           shapes[s].name, sec[0] * per_call, sec[1] * per_call, sec[0] / sec[1],
           (double)c.bytes / 1e9 / sec[1]);
    cache_free(&c);
  }
}

static void io_free(step_io *io) {
  free(io->q);
  free(io->out);
  free(io->scratch);
}

int main(int argc, char **argv) {
  const bench_opts o = parse_args(argc, argv);
  const int64_t lens[3] = {4096, 16384, 65536};
  const int bits[3] = {0, 8, 4};
  const size_t rotate = (o.quick ? 128u : 256u) << 20;
  step_io io;
  io_init(&io);
  if (o.int8_only) {
    printf("bench_attn: 1 thread, isa %s\n", o.isa);
    bench_int8(&o, &io, rotate);
    io_free(&io);
    return 0;
  }
  printf("bench_attn: decode step, %d kv heads x %d query rows, head_dim %d, 1 thread, isa %s\n",
         N_KV, N_REP, HEAD_DIM, o.isa);
  printf("  streaming read baseline: %.2f GB/s\n", bench_read(rotate, o.reps));
  printf("  %9s  %-17s %9s %9s %9s %8s\n", "positions", "storage", "ms/step", "steps/s", "MB/step",
         "GB/s");
  double f16_16k = 0, q4_16k = 0;
  for (int li = 0; li < 3; li++) {
    for (int bi = 0; bi < 3; bi++) {
      cache c;
      cache_make(&c, bits[bi], HEAD_DIM, N_KV, lens[li], rotate);
      for (int r = 0; r < N_REP; r++) io.q_pos[r] = lens[li]; /* sees every slot */
      const double sps = print_row(&c, time_steps(&c, &io, o.fn, false, o.reps), "");
      if (lens[li] == 16384 && bits[bi] == 0) f16_16k = sps;
      if (lens[li] == 16384 && bits[bi] == 4) q4_16k = sps;
      if (lens[li] == 4096) /* the reference, for scale */
        print_row(&c, time_steps(&c, &io, o.fn, true, o.quick ? 1 : 3), "(ref)");
      cache_free(&c);
    }
  }
  printf("  4-bit / f16 fused speed at 16384 positions: %.2fx (bytes read: %.2fx fewer)\n",
         q4_16k / f16_16k, (double)slot_bytes(0, HEAD_DIM) / (double)slot_bytes(4, HEAD_DIM));
  bench_int8(&o, &io, rotate);
  io_free(&io);
  return 0;
}
