/* bench.h -- helpers shared by the micro-benchmarks: a monotonic clock,
 * medians (the machines are shared and noisy, so every figure is a median
 * of repetitions) and allocation that faults its pages in up front. */
#ifndef RLM_BENCH_H
#define RLM_BENCH_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static inline int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static inline double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* A benchmark has nothing to recover: out of memory ends it. Pages are
 * written (not with 0: malloc+memset(0) may become calloc) so the timed
 * loops do not pay first-touch faults. */
static inline void *xmalloc(size_t n) {
  void *p = malloc(n);
  if (!p) {
    fprintf(stderr, "bench: out of memory (%zu bytes)\n", n);
    exit(1);
  }
  memset(p, 0x5a, n);
  return p;
}

static inline uint64_t rng_next(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline float rng_float(uint64_t *s) { /* uniform in [-1, 1) */
  return (float)((rng_next(s) >> 40) * 0x1p-23) - 1.0f;
}

/* Streaming-read bandwidth of n bytes (GB/s, median of reps <= 64): the
 * baseline the benchmarks' ratios are taken against. */
static volatile uint64_t bench_sink; /* keeps the read loop alive */

static inline double bench_read(size_t n, int reps) {
  uint64_t *a = xmalloc(n);
  double t[64];
  for (int r = 0; r < reps; r++) {
    double t0 = now_s();
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i < n / 8; i += 4)
      s0 += a[i], s1 += a[i + 1], s2 += a[i + 2], s3 += a[i + 3];
    bench_sink += s0 + s1 + s2 + s3;
    t[r] = now_s() - t0;
  }
  free(a);
  return (double)n / median(t, reps) / 1e9;
}

#endif
