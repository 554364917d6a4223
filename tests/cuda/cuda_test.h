/* cuda_test.h -- what the GPU test programs share: a CUDA call that must
 * succeed, the no-GPU skip, and the device-to-device copy bandwidth their
 * speed tables are measured against. */
#ifndef RLM_CUDA_TEST_H
#define RLM_CUDA_TEST_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CU(call)                                                                                 \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));     \
      exit(1);                                                                                   \
    }                                                                                            \
  } while (0)

/* Without a GPU: says so and gives the exit status (77, ctest's skip; 1
 * where RINGLM_REQUIRE_GPU is set, as scripts/test-cuda.sh sets it);
 * with one: -1. */
static inline int cuda_test_skip(void) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) == cudaSuccess && n_dev > 0) return -1;
  printf("skipped: no GPU (cudaGetDeviceCount found none); scripts/test-cuda.sh runs this on one\n");
  return getenv("RINGLM_REQUIRE_GPU") ? 1 : 77;
}

/* The skip (its status), or the GPU named and, given --bench, bench()
 * run (status 0); -1: go on to the tests. */
static inline int cuda_test_start(int argc, char **argv, void (*bench)(void)) {
  const int skip = cuda_test_skip();
  if (skip >= 0) return skip;
  struct cudaDeviceProp p;
  CU(cudaGetDeviceProperties(&p, 0));
  printf("%s, %d SMs, %.0f GB, L2 %d MB\n", p.name, p.multiProcessorCount, (double)p.totalGlobalMem / 1e9,
         p.l2CacheSize >> 20);
  if (argc > 1 && !strcmp(argv[1], "--bench")) {
    bench();
    return 0;
  }
  return -1;
}

/* GB/s of a 2 GiB device-to-device copy, read + written, best of 5. */
static inline double copy_gbps(void) {
  const size_t n = (size_t)2 << 30;
  void *a, *b;
  CU(cudaMalloc(&a, n));
  CU(cudaMalloc(&b, n));
  CU(cudaMemset(a, 1, n));
  cudaEvent_t e0, e1;
  CU(cudaEventCreate(&e0));
  CU(cudaEventCreate(&e1));
  CU(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
  float best = 1e30f;
  for (int i = 0; i < 5; i++) {
    CU(cudaEventRecord(e0, NULL));
    CU(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, NULL));
    CU(cudaEventRecord(e1, NULL));
    CU(cudaEventSynchronize(e1));
    float ms;
    CU(cudaEventElapsedTime(&ms, e0, e1));
    best = ms < best ? ms : best;
  }
  cudaFree(a), cudaFree(b);
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  return 2.0 * (double)n / (best * 1e-3) / 1e9;
}

#endif /* RLM_CUDA_TEST_H */
