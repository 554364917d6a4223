/* cuda_read_floor.cu -- how fast the H200 can merely read a decode
 * step's weights, kernel by kernel: the practical floor under ringlm's
 * decode products (docs/cuda-notes.md, "The read floor of a chain of
 * kernels").
 *
 * A decode step of Llama-3.1-8B at 4 bits reads 4.5 GB of weights in
 * some 130-230 product kernels, each followed by small ones. The floor
 * that issue 17 counts (bytes over the copy bandwidth) ignores what a
 * kernel boundary costs. This program measures, with the same launch
 * attributes the backend uses (programmatic dependent launch, a CUDA
 * graph), kernels that do nothing but read their bytes: one kernel
 * alone at each product's size, and the token's chain of them. What a
 * product kernel of ours takes above these times is its own; what these
 * take above bytes / bandwidth is the boundaries'.
 *
 * The read kernel: a persistent grid (blocks a multiprocessor x SMs),
 * 16-byte streaming loads (ld.global.cs), U of them in flight a thread,
 * an xor of everything stored per block so nothing is optimised away.
 * With PDL its first loads are issued before griddepcontrol.wait, as the
 * products' are.
 *
 * Build (bench/cuda.sh does): nvcc -O3 -arch=sm_90 -o /tmp/read_floor bench/cuda_read_floor.cu
 * Run:   /tmp/read_floor          (prints a table; nothing is written) */
#include "cuda_bench.cuh"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

template <int U>
__global__ void __launch_bounds__(256) read_kernel(const uint4 *__restrict__ p, long n, unsigned *out) {
  const long stride = (long)gridDim.x * blockDim.x;
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  uint4 v[U];
#pragma unroll
  for (int u = 0; u < U; u++) v[u] = i + u * stride < n ? __ldcs(p + i + u * stride) : make_uint4(0, 0, 0, 0);
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  for (; i < n; i += U * stride) {
    uint4 w[U];
    const long j = i + U * stride;
#pragma unroll
    for (int u = 0; u < U; u++) w[u] = j + u * stride < n ? __ldcs(p + j + u * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < U; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w, v[u] = w[u];
  }
  __shared__ unsigned red;
  if (threadIdx.x == 0) red = 0;
  __syncthreads();
  atomicXor(&red, acc);
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = red;
}

static int g_grid;
static unsigned *g_out;

static void launch(const uint4 *p, long bytes, bool pdl, cudaStream_t st) {
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = g_grid, cfg.blockDim = 256, cfg.stream = st;
  cfg.attrs = at, cfg.numAttrs = pdl ? 1 : 0;
  CU(cudaLaunchKernelEx(&cfg, read_kernel<4>, p, bytes / 16, g_out));
}

/* A token's chain: per layer the products' sizes in bytes (k of them),
 * layers times, then the head; each kernel reads its own buffer. Returns
 * the microseconds of one replay of its graph (median of 20). */
static double chain_us(uint4 *const *bufs, const long *sizes, int n, bool pdl, cudaStream_t st) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < n; i++) launch(bufs[i], sizes[i], pdl, st);
  CU(cudaStreamEndCapture(st, &g));
  CU(cudaGraphInstantiate(&ge, g, 0));
  const double ms = median_ms([&] { CU(cudaGraphLaunch(ge, st)); }, st, 20);
  cudaGraphExecDestroy(ge), cudaGraphDestroy(g);
  return ms * 1e3;
}

static double copy_gbps(cudaStream_t st) {
  const size_t n = 1ul << 30;
  void *a, *b;
  CU(cudaMalloc(&a, n));
  CU(cudaMalloc(&b, n));
  cudaEvent_t e0, e1;
  CU(cudaEventCreate(&e0));
  CU(cudaEventCreate(&e1));
  CU(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st));
  CU(cudaEventRecord(e0, st));
  for (int i = 0; i < 10; i++) CU(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st));
  CU(cudaEventRecord(e1, st));
  CU(cudaEventSynchronize(e1));
  float ms;
  CU(cudaEventElapsedTime(&ms, e0, e1));
  cudaFree(a), cudaFree(b);
  return 2.0 * 10 * n / (ms * 1e-3) / 1e9;
}

int main(void) {
  cudaStream_t st;
  CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  int sms, per;
  CU(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CU(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, read_kernel<4>, 256, 0));
  g_grid = sms * per;
  CU(cudaMalloc(&g_out, g_grid * sizeof *g_out));
  const double bw = copy_gbps(st);
  printf("copy %.0f GB/s (read + written); read kernel: %d blocks of 256, 4 loads of 16 B in flight a thread\n", bw,
         g_grid);

  /* Llama-3.1-8B at 4 bits g64 (bf16 scales and biases): 0.5625 B a weight */
  const long q = 4096L * 4096 * 9 / 16, kv = 1024L * 4096 * 9 / 16, gate = 14336L * 4096 * 9 / 16,
             down = gate, head = 128256L * 4096 * 17 / 16; /* 8-bit g64 head */
  enum { LAYERS = 32 };
  /* the backend's launches: q+k+v one, o, gate+up one, down */
  long sizes[4 * LAYERS + 1];
  int n = 0;
  for (int l = 0; l < LAYERS; l++) sizes[n++] = q + 2 * kv, sizes[n++] = q, sizes[n++] = 2 * gate, sizes[n++] = down;
  sizes[n++] = head;
  long total = 0;
  uint4 *bufs[4 * LAYERS + 1];
  for (int i = 0; i < n; i++) {
    CU(cudaMalloc((void **)&bufs[i], sizes[i]));
    CU(cudaMemset(bufs[i], i, sizes[i]));
    total += sizes[i];
  }
  const double floor_us = total / (bw * 1e3);

  printf("\none kernel alone (graph of 20 launches over distinct buffers > L2; us a launch)\n");
  printf("%-18s %10s %9s %9s %9s %9s\n", "bytes", "MB", "floor us", "plain us", "pdl us", "pdl GB/s");
  const long one[] = {q + 2 * kv, q, 2 * gate, down, head};
  const char *names[] = {"q+k+v", "o", "gate+up", "down", "head 8-bit"};
  for (int k = 0; k < 5; k++) {
    /* 20 launches each on a different layer's buffer (from the chain's) */
    uint4 *b20[20];
    long s20[20];
    for (int i = 0; i < 20; i++) b20[i] = k < 4 ? bufs[4 * i + k] : bufs[n - 1], s20[i] = one[k];
    const double p0 = chain_us(b20, s20, 20, false, st) / 20, p1 = chain_us(b20, s20, 20, true, st) / 20;
    printf("%-18s %10.1f %9.1f %9.1f %9.1f %9.0f\n", names[k], one[k] / 1e6, one[k] / (bw * 1e3), p0, p1,
           one[k] / (p1 * 1e3));
  }
  const double c0 = chain_us(bufs, sizes, n, false, st), c1 = chain_us(bufs, sizes, n, true, st);
  printf("\nthe token's chain: %d kernels, %.2f GB; floor %.0f us (%.0f tok/s)\n", n, total / 1e9, floor_us,
         1e6 / floor_us);
  printf("  plain graph %.0f us (%.0f tok/s, %.0f%% of the floor's speed)\n", c0, 1e6 / c0, 100 * floor_us / c0);
  printf("  pdl graph   %.0f us (%.0f tok/s, %.0f%% of the floor's speed)\n", c1, 1e6 / c1, 100 * floor_us / c1);
  /* the same bytes as one kernel: what the boundaries cost */
  uint4 *all;
  CU(cudaMalloc((void **)&all, total));
  uint4 *b1[1] = {all};
  long s1[1] = {total};
  const double a1 = chain_us(b1, s1, 1, false, st);
  printf("  one kernel over all of it %.0f us (%.0f%% of the floor's speed)\n", a1, 100 * floor_us / a1);
  return 0;
}
