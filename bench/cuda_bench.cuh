/* cuda_bench.cuh -- what the standalone CUDA benchmarks of bench/ share
 * (cuda_read_floor.cu, cuda_sync_cost.cu; each built alone with nvcc):
 * the checked CUDA call and the median time of a launch. */
#ifndef RLM_CUDA_BENCH_CUH
#define RLM_CUDA_BENCH_CUH

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

/* A benchmark has nothing to recover: a failed call ends it, named. */
#define CU(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));       \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)

/* The median of `runs` (at most 32) timings of launch() on st, after 3
 * unrecorded, in ms; an even count takes the mean of the middle two. */
template <typename F>
static double median_ms(F launch, cudaStream_t st, int runs) {
  cudaEvent_t a, b;
  CU(cudaEventCreate(&a));
  CU(cudaEventCreate(&b));
  float ms[32];
  for (int r = -3; r < runs; r++) {
    CU(cudaEventRecord(a, st));
    launch();
    CU(cudaEventRecord(b, st));
    CU(cudaEventSynchronize(b));
    if (r >= 0) CU(cudaEventElapsedTime(&ms[r], a, b));
  }
  for (int i = 1; i < runs; i++)
    for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
      const float x = ms[j];
      ms[j] = ms[j - 1], ms[j - 1] = x;
    }
  cudaEventDestroy(a), cudaEventDestroy(b);
  return runs % 2 ? ms[runs / 2] : 0.5 * (ms[runs / 2 - 1] + ms[runs / 2]);
}

#endif
