/* cuda_sync_cost.cu -- what a decode step's dependency points cost on
 * this GPU, as kernel boundaries (ringlm's way: a kernel per op, launched
 * with programmatic dependent launch in a CUDA graph) and as barriers
 * inside one persistent kernel (a "megakernel"): the measure under the
 * question docs/cuda-notes.md leaves open, whether a persistent decode
 * kernel would reach issue 17's single-stream goals that the kernel
 * chain has not.
 *
 * Two kinds of phase, the same device code either way:
 *   small   every block reads a 4 KB slice another block wrote in the
 *           phase before, sums it, writes its own: the shape of decode's
 *           small kernels (add + norm, RoPE and the cache write, the
 *           attention merge, the gated activation), a round trip to the
 *           L2 and a reduction after the dependency;
 *   stream  the blocks read B bytes of "weights" (16-byte streaming
 *           loads, U in flight a thread, as bench/cuda_read_floor.cu),
 *           the first U issued before the dependency, as the products'
 *           first row group is (the weights depend on nothing).
 * Measured, median of 15 (the kernels as one graph replay, the persistent
 * kernel as one cooperative launch):
 *   1. 320 small phases as 320 kernels (PDL) and as one persistent
 *      kernel with a grid barrier between phases (cooperative_groups'
 *      grid sync, or a counter-and-flag barrier), at the streams' grid
 *      and at two blocks an SM: us a phase;
 *   2. Llama-3.1-8B's decode layer pattern, 32 times, at 4 bits and bf16: stream q+k+v,
 *      three small (RoPE and write, attention, merge), stream o, small
 *      (add + norm), stream gate+up, small (activation), stream down,
 *      small (add + norm); as 320 kernels and as one kernel (both
 *      barriers); and the streams' bytes alone as one kernel (the
 *      chain's floor).
 *
 * Build: nvcc -O3 -arch=sm_90 -o /tmp/sync_cost bench/cuda_sync_cost.cu
 * Run:   /tmp/sync_cost          (prints a table; nothing is written) */
#include "cuda_bench.cuh"

#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

namespace cg = cooperative_groups;

constexpr int kThreads = 256, kU = 4, kSlice = 1024; /* floats a block's small slice */
constexpr int kMaxPhases = 512;

/* One phase: kind 0 small, 1 stream (bytes over the buffer w). */
struct Phase {
  int kind;
  const uint4 *w;
  long n16; /* 16-byte words */
};

struct Plan {
  Phase ph[kMaxPhases];
  int n;
  float *act; /* two slices a block: read one, write the other */
  unsigned *sink;
};

__device__ __forceinline__ void dep_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void dep_launch() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

/* A stream phase's first loads: issued before the dependency. */
__device__ __forceinline__ void stream_first(const Phase &p, uint4 (&v)[kU]) {
  const long stride = (long)gridDim.x * blockDim.x, i = (long)blockIdx.x * blockDim.x + threadIdx.x;
#pragma unroll
  for (int u = 0; u < kU; u++) v[u] = i + u * stride < p.n16 ? __ldcs(p.w + i + u * stride) : make_uint4(0, 0, 0, 0);
}

__device__ __forceinline__ unsigned stream_rest(const Phase &p, uint4 (&v)[kU]) {
  const long stride = (long)gridDim.x * blockDim.x;
  unsigned acc = 0;
  for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < p.n16; i += kU * stride) {
    uint4 w[kU];
    const long j = i + kU * stride;
#pragma unroll
    for (int u = 0; u < kU; u++) w[u] = j + u * stride < p.n16 ? __ldcs(p.w + j + u * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < kU; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w, v[u] = w[u];
  }
  return acc;
}

/* A small phase k: block b sums the slice block b + 1 wrote in phase
 * k - 1 (the other half of act) and writes its own. */
__device__ __forceinline__ void small_phase(float *act, int k, unsigned salt) {
  __shared__ float part[kThreads / 32];
  const int b = blockIdx.x, nb = gridDim.x;
  const float *src = act + ((size_t)((k + 1) & 1) * nb + (b + 1) % nb) * kSlice;
  float *dst = act + ((size_t)(k & 1) * nb + b) * kSlice;
  float s = 0.f;
  for (int i = threadIdx.x; i < kSlice; i += blockDim.x) s += src[i];
#pragma unroll
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
  __syncthreads();
  float t = 0.f;
  for (int i = 0; i < kThreads / 32; i++) t += part[i];
  for (int i = threadIdx.x; i < kSlice; i += blockDim.x) dst[i] = t * 1e-3f + (float)(salt & 7);
  __syncthreads(); /* part is the next phase's */
}

/* Phase k as a kernel of its own (launched with PDL). */
__global__ void __launch_bounds__(kThreads) phase_kernel(Phase p, float *act, int k, unsigned *sink) {
  uint4 v[kU];
  if (p.kind == 1) stream_first(p, v);
  dep_wait();
  dep_launch();
  if (p.kind == 1) {
    const unsigned a = stream_rest(p, v);
    if (a == 0x9e3779b9u) sink[blockIdx.x] = a; /* keeps the loads */
  } else {
    small_phase(act, k, (unsigned)k);
  }
}

/* A grid barrier of one counter and a generation: each block's thread 0
 * arrives with an atomic add, the last resets the count and bumps the
 * generation the others spin on. */
__device__ unsigned g_count, g_gen;

__device__ __forceinline__ void flag_sync() {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned *gen = &g_gen;
    const unsigned g = *gen;
    __threadfence();
    if (atomicAdd(&g_count, 1u) == gridDim.x - 1) {
      g_count = 0;
      __threadfence();
      atomicExch(&g_gen, g + 1);
    } else {
      while (*gen == g) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

/* Every phase in one kernel, a grid barrier between them (FLAG: flag_sync,
 * else cooperative_groups' grid sync); a stream phase's first loads go
 * out before the barrier that precedes it. */
template <bool FLAG>
__global__ void __launch_bounds__(kThreads) persistent_kernel(const Plan *plan) {
  cg::grid_group grid = cg::this_grid();
  uint4 v[kU];
  unsigned acc = 0;
  if (plan->ph[0].kind == 1) stream_first(plan->ph[0], v);
  for (int k = 0; k < plan->n; k++) {
    const Phase p = plan->ph[k];
    if (k > 0) {
      if (FLAG) flag_sync();
      else grid.sync();
    }
    if (p.kind == 1) acc ^= stream_rest(p, v);
    else small_phase(plan->act, k, (unsigned)k);
    if (k + 1 < plan->n && plan->ph[k + 1].kind == 1) stream_first(plan->ph[k + 1], v);
  }
  if (acc == 0x9e3779b9u) plan->sink[blockIdx.x] = acc;
}

static int g_grid;

/* The plan as one kernel a phase, PDL, in a graph: us per replay. */
static double as_kernels(const Plan &h, cudaStream_t st) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  for (int k = 0; k < h.n; k++) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = g_grid, cfg.blockDim = kThreads, cfg.stream = st, cfg.attrs = at, cfg.numAttrs = 1;
    CU(cudaLaunchKernelEx(&cfg, phase_kernel, h.ph[k], h.act, k, h.sink));
  }
  CU(cudaStreamEndCapture(st, &g));
  CU(cudaGraphInstantiate(&ge, g, 0));
  const double ms = median_ms([&] { CU(cudaGraphLaunch(ge, st)); }, st, 15);
  cudaGraphExecDestroy(ge), cudaGraphDestroy(g);
  return ms * 1e3;
}

/* The plan as one cooperative kernel, launched directly (its launch's few
 * us count against it): us per launch, median of 15. */
static double as_one_kernel(const Plan &h, Plan *dplan, cudaStream_t st, bool flag, int grid) {
  CU(cudaMemcpy(dplan, &h, sizeof h, cudaMemcpyHostToDevice));
  void *args[] = {&dplan};
  void *fn = flag ? (void *)persistent_kernel<true> : (void *)persistent_kernel<false>;
  return 1e3 * median_ms([&] { CU(cudaLaunchCooperativeKernel(fn, grid, kThreads, args, 0, st)); }, st, 15);
}

/* Llama-8B's decode layer pattern x 32 at num / den bytes a weight, each
 * layer's weights a buffer of their own (past the L2): as kernels, as one
 * kernel with either barrier, and the streams' bytes as one kernel. */
static void layer_pattern(Plan &h, Plan *dplan, cudaStream_t st, const char *name, long num, long den) {
  const long q = 4096L * 4096 * num / den, kv = 1024L * 4096 * num / den, gate = 14336L * 4096 * num / den;
  const long sizes[4] = {q + 2 * kv, q, 2 * gate, gate};
  const int smalls_after[4] = {3, 1, 1, 1};
  uint4 *all;
  long total = 0;
  for (int s = 0; s < 4; s++) total += 32 * sizes[s];
  CU(cudaMalloc((void **)&all, total));
  CU(cudaMemset(all, 1, total));
  h.n = 0;
  long off = 0;
  for (int l = 0; l < 32; l++)
    for (int s = 0; s < 4; s++) {
      h.ph[h.n++] = Phase{1, all + off / 16, sizes[s] / 16};
      off += sizes[s];
      for (int m = 0; m < smalls_after[s]; m++) h.ph[h.n++] = Phase{0, nullptr, 0};
    }
  const double a = as_kernels(h, st), b = as_one_kernel(h, dplan, st, false, g_grid),
               c = as_one_kernel(h, dplan, st, true, g_grid);
  Plan one = h;
  one.n = 1, one.ph[0] = Phase{1, all, total / 16};
  const double f = as_kernels(one, st);
  printf("\nLlama-8B %s layer pattern x 32 (%d phases, %.2f GB of streams):\n", name, h.n, total / 1e9);
  printf("  the streams' bytes as one kernel  %8.0f us\n", f);
  printf("  as %d kernels (PDL graph)        %8.0f us (%.0f%% of the one kernel's speed)\n", h.n, a, 100 * f / a);
  printf("  as one persistent kernel, grid sync %6.0f us (%.0f%% of the one kernel's speed)\n", b, 100 * f / b);
  printf("  as one persistent kernel, flags     %6.0f us (%.0f%% of the one kernel's speed)\n", c, 100 * f / c);
  printf("  a layer's 6 small phases cost %.2f us as kernels, %.2f / %.2f us in one kernel (over the streams)\n",
         (a - f) / 32, (b - f) / 32, (c - f) / 32);
  cudaFree(all);
}

int main(void) {
  cudaStream_t st;
  CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  int sms, per_k, per_p, coop;
  CU(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CU(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0));
  CU(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_k, phase_kernel, kThreads, 0));
  CU(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_p, persistent_kernel<false>, kThreads, 0));
  const int per = per_k < per_p ? per_k : per_p;
  g_grid = sms * per;
  cudaDeviceProp prop;
  CU(cudaGetDeviceProperties(&prop, 0));
  printf("%s: %d SMs, grid %d blocks of %d (%d an SM), cooperative launch %s\n", prop.name, sms, g_grid, kThreads, per,
         coop ? "yes" : "NO");
  if (!coop) return 1;

  Plan h = {};
  CU(cudaMalloc(&h.act, (size_t)2 * g_grid * kSlice * sizeof(float)));
  CU(cudaMemset(h.act, 0, (size_t)2 * g_grid * kSlice * sizeof(float)));
  CU(cudaMalloc(&h.sink, (size_t)g_grid * sizeof(unsigned)));
  Plan *dplan;
  CU(cudaMalloc(&dplan, sizeof(Plan)));

  /* 1. small phases only */
  printf("\n320 small phases, us a phase: as kernels (PDL graph); in one kernel with cooperative_groups' grid\n"
         "sync, and with a counter-and-flag barrier, at %d blocks and at %d\n", g_grid, 2 * sms);
  h.n = 320;
  for (int i = 0; i < h.n; i++) h.ph[i] = Phase{0, nullptr, 0};
  printf("  %.2f   %.2f   %.2f   %.2f   %.2f\n", as_kernels(h, st) / h.n, as_one_kernel(h, dplan, st, false, g_grid) / h.n,
         as_one_kernel(h, dplan, st, true, g_grid) / h.n, as_one_kernel(h, dplan, st, false, 2 * sms) / h.n,
         as_one_kernel(h, dplan, st, true, 2 * sms) / h.n);

  /* 2. Llama-8B decode's layer pattern, 32 layers, at 4 bits (g64, bf16
   * scales and biases: 9/16 of a byte a weight) and in bf16 */
  layer_pattern(h, dplan, st, "4-bit", 9, 16);
  layer_pattern(h, dplan, st, "bf16", 2, 1);
  cudaFree(h.act), cudaFree(h.sink), cudaFree(dplan);
  return 0;
}
