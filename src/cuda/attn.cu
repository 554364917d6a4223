/* attn.cu -- the KV cache's write and attention over it (cuda_ops.h):
 * rlm__cuda_kv_write, rlm__cuda_attend.
 *
 * The cache is cuda_ops.h's rlm_cuda_kv: [n_rows][n_kv][cap][dim] for K
 * and for V, position p of a row in slot p (plain, or p < keep) or
 * keep + (p - keep) % ring, a query at qp seeing kp <= qp with window == 0,
 * kp < keep or qp - kp < window - keep (attn.h's rlm__attn_visible).
 *
 * WHAT A QUERY SEES, in position order, is at most two runs:
 *
 *     sinks [0, sink_end)   then   window [lo, qp]
 *     lo = window ? max(0, qp - (window - keep) + 1) : 0,  sink_end = min(keep, lo)
 *
 * numbered t = 0 .. N-1 (N = sink_end + qp + 1 - lo). Window positions map
 * to consecutive slots that wrap once from cap to keep, so slot(t) is one
 * add and one compare from slot(lo), no division per key.
 *
 * FLASH-DECODING, two kernels:
 *   1. attend_kernel, a block per (token j, kv head, up to GQ of its query
 *      heads, part s of S): part s is t in [N s / S, N (s+1) / S), from
 *      tok_pos on the device, so the launch is the same every step. Each
 *      K and V row is read once for all the block's query heads (GQA).
 *      A key's row (dim elements) is read as 16-byte vectors by a group of
 *      lanes (`kLanes`, up to the warp); the groups of the block take keys
 *      in turn, kUnroll at once (the next step's loads in flight during
 *      this one's arithmetic), each keeping its own running max m, sum
 *      l and o[dim] (online softmax, scores in log2 units so exp2f does
 *      the exponentials). The groups merge in shared memory; the block
 *      writes its part's m, l and unnormalised o per head to scratch. An
 *      empty part writes m = -inf, l = 0, o = 0.
 *   2. merge_kernel, a block per (token, head): out = sum_s o_s 2^(m_s - M)
 *      / sum_s l_s 2^(m_s - M), M = max m_s; a query that sees nothing
 *      (every m_s = -inf) gets zeros.
 * S depends only on the launch's n and n_heads (n_splits), never on the
 * positions; scratch is n * n_heads * S * (dim + 2) floats. A query uses
 * only its first ceil(N / 64) parts (parts_used, from tok_pos, so still
 * the same launch every step): the others return at once and the merge
 * reads only the used ones, so a short context pays for one part.
 */
#include "cuda_ops.h"

#include "common.cuh"

#include <cuda_runtime.h>

namespace {

using namespace rlm_cuda;

/* The shape of the work; RLM_CUDA_ATTN_* override them to compare variants. */
#ifndef RLM_CUDA_ATTN_WARPS
#define RLM_CUDA_ATTN_WARPS 4
#endif
#ifndef RLM_CUDA_ATTN_UNROLL
#define RLM_CUDA_ATTN_UNROLL 2
#endif
constexpr int kAttnWarps = RLM_CUDA_ATTN_WARPS; /* warps per block                          */
constexpr int kUnroll = RLM_CUDA_ATTN_UNROLL;   /* keys per lane group in flight            */
constexpr int kMaxDim = 512;
constexpr int kMaxSplits = 128;
/* (token, head, part) triples to aim for: with one token of 32 heads,
 * 128 parts, 1024 blocks of Llama-8B's 8 kv heads; prefill chunks of
 * hundreds of tokens get 1 part, nothing to merge. */
constexpr int64_t kSplitTarget = 4096;
constexpr int kMergeThreads = 128;
/* Keys a part takes at least: a query that sees few positions uses fewer
 * parts than the launch has (the rest exit at once, and the merge reads
 * only the parts used), so a short context costs little beyond one pass. */
constexpr int64_t kMinKeys = 64;
constexpr float kLog2e = 1.4426950408889634f;

int n_splits(int n, int n_heads) {
  const int64_t th = (int64_t)n * n_heads;
  int s = 1;
  while (s < kMaxSplits && th * s < kSplitTarget) s *= 2;
  return s;
}

/* *p = v in the cache's dtype, rounded to nearest even (rlm__convert). */
__device__ __forceinline__ void put(float *p, float v) { *p = v; }
__device__ __forceinline__ void put(__half *p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void put(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

__device__ __forceinline__ int64_t slot_of(int64_t p, int64_t ring, int keep) {
  return ring == 0 || p < keep ? p : keep + (p - keep) % ring;
}

/* ---- the write ------------------------------------------------------------ */

/* Block (token j, kv head h), threads over dim. A negative row or
 * position, or a plain cache's position at or past cap, has no slot: the
 * token is not written (a padded token of a fixed-size pass). */
template <typename T>
__global__ void kv_write_kernel(rlm_cuda_kv c, const float *__restrict__ k, const float *__restrict__ v,
                                const int32_t *__restrict__ tok_row, const int64_t *__restrict__ tok_pos) {
  const int64_t j = blockIdx.x;
  const int h = blockIdx.y;
  const int64_t p = tok_pos[j];
  const int row = tok_row[j];
  if (p < 0 || row < 0) return;
  const int64_t slot = slot_of(p, c.ring, c.keep);
  if (slot >= c.cap) return;
  const int64_t dst = (((int64_t)row * c.n_kv + h) * c.cap + slot) * c.dim, src = (j * c.n_kv + h) * c.dim;
  T *kd = static_cast<T *>(c.k) + dst, *vd = static_cast<T *>(c.v) + dst;
  for (int d = threadIdx.x; d < c.dim; d += blockDim.x) {
    put(kd + d, k[src + d]);
    put(vd + d, v[src + d]);
  }
}

/* ---- attention: the parts ------------------------------------------------- */

/* The positions a query at qp sees, as the two runs of the header. The
 * clamps only matter for a cache that breaks its contract: a plain one
 * never reads past cap, a ring never more than ring window positions (so
 * every slot read is inside the row). */
/* Parts a query seeing n positions uses, of the launch's n_parts (>= 1). */
__device__ __forceinline__ int parts_used(int64_t n, int n_parts) {
  const int64_t want = (n + kMinKeys - 1) / kMinKeys;
  return want < 1 ? 1 : want < n_parts ? (int)want : n_parts;
}

struct Runs {
  int64_t sink_end, lo, n; /* [0, sink_end) then [lo, lo + n - sink_end) */
  int64_t slot_lo;         /* slot of lo                                 */
};

__device__ __forceinline__ Runs runs_of(const rlm_cuda_kv &c, int64_t qp) {
  Runs r = {0, 0, 0, 0};
  if (qp < 0) return r;
  int64_t hi = qp + 1, lo = c.window > 0 ? qp - (c.window - c.keep) + 1 : 0;
  if (c.ring == 0 && hi > c.cap) hi = c.cap;
  if (c.ring > 0 && lo < hi - c.ring) lo = hi - c.ring;
  lo = lo < 0 ? 0 : lo > hi ? hi : lo;
  r.sink_end = c.keep < lo ? c.keep : lo;
  r.lo = lo;
  r.n = r.sink_end + hi - lo;
  r.slot_lo = slot_of(lo, c.ring, c.keep);
  return r;
}

/* Slot of the t-th visible position. */
__device__ __forceinline__ int64_t slot_at(const Runs &r, const rlm_cuda_kv &c, int64_t t) {
  if (t < r.sink_end) return t;
  const int64_t s = r.slot_lo + (t - r.sink_end);
  return c.ring > 0 && s >= c.cap ? s - c.ring : s;
}

/* K and V of keys t = tb + u * kGroups (u < kUnroll) of this lane's
 * group, as 16-byte vectors sub + k * kLanes of each row; zeros past t1
 * (no load) and past the row's nv vectors. */
template <typename T, int kPer, int kLanes, int kGroups>
__device__ __forceinline__ void load_keys(uint4 (&kr)[kUnroll][kPer], uint4 (&vr)[kUnroll][kPer], const T *kb,
                                          const T *vb, const Runs &r, const rlm_cuda_kv &c, int64_t tb, int64_t t1,
                                          int sub, int nv) {
#pragma unroll
  for (int u = 0; u < kUnroll; u++) {
    const int64_t t = tb + (int64_t)u * kGroups;
    const int64_t at = t < t1 ? slot_at(r, c, t) * c.dim : 0;
#pragma unroll
    for (int k = 0; k < kPer; k++) {
      const int vec = sub + k * kLanes;
      const bool in = t < t1 && vec < nv;
      kr[u][k] = in ? __ldg(reinterpret_cast<const uint4 *>(kb + at) + vec) : make_uint4(0, 0, 0, 0);
      vr[u][k] = in ? __ldg(reinterpret_cast<const uint4 *>(vb + at) + vec) : make_uint4(0, 0, 0, 0);
    }
  }
}

/* The per-shape constants of attend_kernel: a key row of DIM (the bucket;
 * the cache's dim <= DIM, the vectors past it masked) in 16-byte vectors. */
template <typename T, int DIM>
struct Shape {
  static constexpr int kVe = 16 / (int)sizeof(T);              /* elements per vector   */
  static constexpr int kVecs = DIM / kVe;                      /* vectors per key row   */
  static constexpr int kLanes = kVecs < kWarp ? kVecs : kWarp; /* lanes per key         */
  static constexpr int kPer = kVecs / kLanes;                  /* vectors per lane      */
  static constexpr int kEl = kPer * kVe;                       /* elements per lane     */
  static constexpr int kGroups = kWarp / kLanes * kAttnWarps;  /* lane groups per block */
  /* q and o of GQ heads stay in registers: 2 * GQ * kEl floats, so the
   * widest rows (16 elements a lane) take at most 4 heads a block. */
  static constexpr int kMaxGq = kEl >= 16 ? 4 : 8;
};

/* See the header. q_per_kv query heads share a kv head; `chunks` blocks of
 * up to GQ of them cover it (blockIdx.y = kv head * chunks + chunk). */
template <typename T, int DIM, int GQ>
__global__ void __launch_bounds__(kWarp *kAttnWarps)
    attend_kernel(rlm_cuda_kv c, const float *__restrict__ q, int n_heads, int q_per_kv, int chunks, float scale2,
                  const int32_t *__restrict__ tok_row, const int64_t *__restrict__ tok_pos, int n_parts,
                  float *__restrict__ part_o, float *__restrict__ part_ml) {
  using S = Shape<T, DIM>;
  constexpr int kVe = S::kVe, kLanes = S::kLanes, kPer = S::kPer, kEl = S::kEl, kGroups = S::kGroups;
  __shared__ float sm_o[kGroups][GQ][DIM];
  __shared__ float sm_m[kGroups][GQ], sm_l[kGroups][GQ], sm_w[kGroups][GQ];
  const int64_t j = blockIdx.x;
  const int part = blockIdx.z, kvh = blockIdx.y / chunks, g0 = (blockIdx.y % chunks) * GQ;
  const int h0 = kvh * q_per_kv + g0, ng = q_per_kv - g0 < GQ ? q_per_kv - g0 : GQ;
  const int sub = threadIdx.x % kLanes, grp = threadIdx.x / kLanes, dim = c.dim, nv = dim / kVe;

  const int row = tok_row[j];
  const Runs r = runs_of(c, row < 0 ? -1 : tok_pos[j]);
  const int used = parts_used(r.n, n_parts);
  if (part >= used) return; /* the whole block: the merge does not read it */
  const int64_t t0 = r.n * part / used, t1 = r.n * (part + 1) / used;
  const int64_t head_off = ((int64_t)(row < 0 ? 0 : row) * c.n_kv + kvh) * c.cap * dim;
  const T *kb = static_cast<const T *>(c.k) + head_off, *vb = static_cast<const T *>(c.v) + head_off;

  /* This lane's elements: vectors sub + k * kLanes of the row. */
  float qf[GQ][kEl], o[GQ][kEl], m[GQ], l[GQ];
#pragma unroll
  for (int g = 0; g < GQ; g++) {
    m[g] = -INFINITY, l[g] = 0.f;
#pragma unroll
    for (int k = 0; k < kPer; k++)
#pragma unroll
      for (int e = 0; e < kVe; e++) {
        const int vec = sub + k * kLanes;
        qf[g][k * kVe + e] = g < ng && vec < nv ? q[(j * n_heads + h0 + g) * dim + vec * kVe + e] : 0.f;
        o[g][k * kVe + e] = 0.f;
      }
  }

  /* The trip count is the block's, not the group's: the shuffles below
   * need every lane of the warp; keys past t1 are masked. Each step's
   * loads are issued before the previous step's arithmetic (two steps of
   * K and V in registers), so the lanes always have bytes in flight. */
  constexpr int64_t kStep = (int64_t)kGroups * kUnroll;
  uint4 kr[kUnroll][kPer], vr[kUnroll][kPer];
  load_keys<T, kPer, kLanes, kGroups>(kr, vr, kb, vb, r, c, t0 + grp, t1, sub, nv);
  for (int64_t base = t0; base < t1; base += kStep) {
    const int64_t tb = base + grp;
    uint4 kn[kUnroll][kPer], vn[kUnroll][kPer];
    load_keys<T, kPer, kLanes, kGroups>(kn, vn, kb, vb, r, c, tb + kStep, t1, sub, nv);
    /* Scores: this lane's part of each dot, summed over the key's lanes
     * (xor offsets below kLanes stay inside the lane group). */
    float sc[kUnroll][GQ];
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
      float kf[kEl];
#pragma unroll
      for (int k = 0; k < kPer; k++) widen16<T>(kr[u][k], kf + k * kVe);
#pragma unroll
      for (int g = 0; g < GQ; g++) {
        float d = 0.f;
#pragma unroll
        for (int e = 0; e < kEl; e++) d = fmaf(qf[g][e], kf[e], d);
        sc[u][g] = d;
      }
    }
#pragma unroll
    for (int off = kLanes / 2; off > 0; off /= 2)
#pragma unroll
      for (int u = 0; u < kUnroll; u++)
#pragma unroll
        for (int g = 0; g < GQ; g++) sc[u][g] += __shfl_xor_sync(0xffffffffu, sc[u][g], off);
    float vf[kUnroll][kEl];
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
      const bool live = tb + (int64_t)u * kGroups < t1;
#pragma unroll
      for (int g = 0; g < GQ; g++) sc[u][g] = live ? sc[u][g] * scale2 : -INFINITY;
#pragma unroll
      for (int k = 0; k < kPer; k++) widen16<T>(vr[u][k], vf[u] + k * kVe);
    }
#pragma unroll
    for (int g = 0; g < GQ; g++) {
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < kUnroll; u++) mx = fmaxf(mx, sc[u][g]);
      if (mx == -INFINITY) continue; /* nothing live yet: keep -inf, 0, 0 (no inf - inf) */
      const float corr = exp2f(m[g] - mx);
      float p[kUnroll], ps = 0.f;
#pragma unroll
      for (int u = 0; u < kUnroll; u++) p[u] = exp2f(sc[u][g] - mx), ps += p[u];
      l[g] = fmaf(l[g], corr, ps);
      m[g] = mx;
#pragma unroll
      for (int e = 0; e < kEl; e++) {
        float a = o[g][e] * corr;
#pragma unroll
        for (int u = 0; u < kUnroll; u++) a = fmaf(p[u], vf[u][e], a);
        o[g][e] = a;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; u++)
#pragma unroll
      for (int k = 0; k < kPer; k++) kr[u][k] = kn[u][k], vr[u][k] = vn[u][k];
  }

  /* Merge the lane groups: every lane of a group holds the same m and l. */
#pragma unroll
  for (int g = 0; g < GQ; g++) {
    if (sub == 0) sm_m[grp][g] = m[g], sm_l[grp][g] = l[g];
#pragma unroll
    for (int k = 0; k < kPer; k++)
#pragma unroll
      for (int e = 0; e < kVe; e++) sm_o[grp][g][(sub + k * kLanes) * kVe + e] = o[g][k * kVe + e];
  }
  __syncthreads();
  const int64_t first = (j * n_heads + h0) * n_parts + part; /* (j, h0, part); heads n_parts apart */
  if (threadIdx.x < GQ) {
    const int g = threadIdx.x;
    float mx = -INFINITY, ls = 0.f;
    for (int i = 0; i < kGroups; i++) mx = fmaxf(mx, sm_m[i][g]);
    for (int i = 0; i < kGroups; i++) {
      const float w = mx == -INFINITY ? 0.f : exp2f(sm_m[i][g] - mx);
      sm_w[i][g] = w;
      ls = fmaf(sm_l[i][g], w, ls);
    }
    if (g < ng) part_ml[(first + (int64_t)g * n_parts) * 2] = mx, part_ml[(first + (int64_t)g * n_parts) * 2 + 1] = ls;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < GQ * DIM; idx += blockDim.x) {
    const int g = idx / DIM, d = idx % DIM;
    if (g >= ng || d >= dim) continue;
    float a = 0.f;
    for (int i = 0; i < kGroups; i++) a = fmaf(sm_o[i][g][d], sm_w[i][g], a);
    part_o[(first + (int64_t)g * n_parts) * dim + d] = a;
  }
}

/* ---- attention: the merge ------------------------------------------------- */

/* Block (token, head): the weights of the parts by one warp, then threads
 * over dim. */
__global__ void __launch_bounds__(kMergeThreads)
    merge_kernel(rlm_cuda_kv c, const int32_t *__restrict__ tok_row, const int64_t *__restrict__ tok_pos, int n_heads,
                 const float *__restrict__ part_o, const float *__restrict__ part_ml, int n_parts, int dim,
                 float *__restrict__ out) {
  __shared__ float w[kMaxSplits];
  __shared__ float l_sh;
  const int64_t th = blockIdx.x, j = th / n_heads;
  const int used = parts_used(runs_of(c, tok_row[j] < 0 ? -1 : tok_pos[j]).n, n_parts);
  const float *ml = part_ml + th * n_parts * 2;
  if (threadIdx.x < kWarp) {
    const int lane = threadIdx.x;
    float mx = -INFINITY, ls = 0.f;
    for (int s = lane; s < used; s += kWarp) mx = fmaxf(mx, ml[2 * s]);
#pragma unroll
    for (int o = kWarp / 2; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    for (int s = lane; s < used; s += kWarp) {
      const float ws = mx == -INFINITY ? 0.f : exp2f(ml[2 * s] - mx);
      w[s] = ws;
      ls = fmaf(ml[2 * s + 1], ws, ls);
    }
#pragma unroll
    for (int o = kWarp / 2; o > 0; o /= 2) ls += __shfl_xor_sync(0xffffffffu, ls, o);
    if (lane == 0) l_sh = ls;
  }
  __syncthreads();
  const float ls = l_sh;
  const float *po = part_o + th * n_parts * dim;
  for (int d = threadIdx.x; d < dim; d += kMergeThreads) {
    float a[4] = {0.f, 0.f, 0.f, 0.f}; /* four loads in flight, not one */
    int s = 0;
    for (; s + 4 <= used; s += 4)
#pragma unroll
      for (int u = 0; u < 4; u++) a[u] = fmaf(po[(int64_t)(s + u) * dim + d], w[s + u], a[u]);
    for (; s < used; s++) a[0] = fmaf(po[(int64_t)s * dim + d], w[s], a[0]);
    const float sum = (a[0] + a[1]) + (a[2] + a[3]);
    out[th * dim + d] = ls > 0.f ? __fdiv_rn(sum, ls) : 0.f; /* sees nothing: zeros */
  }
}

/* ---- dispatch ------------------------------------------------------------- */

struct AttendArgs {
  rlm_cuda_kv c;
  const float *q;
  int n_heads, q_per_kv, n;
  float scale2;
  const int32_t *tok_row;
  const int64_t *tok_pos;
  int n_parts;
  float *part_o, *part_ml;
};

template <typename T, int DIM, int GQ>
void launch_attend(const AttendArgs &a, cudaStream_t st) {
  const int chunks = (a.q_per_kv + GQ - 1) / GQ;
  const dim3 grid((unsigned)a.n, (unsigned)(a.c.n_kv * chunks), (unsigned)a.n_parts);
  attend_kernel<T, DIM, GQ><<<grid, kWarp * kAttnWarps, 0, st>>>(a.c, a.q, a.n_heads, a.q_per_kv, chunks, a.scale2,
                                                                 a.tok_row, a.tok_pos, a.n_parts, a.part_o, a.part_ml);
}

/* Query heads per block: the kv head's q_per_kv rounded up to a power of
 * two, at most 8, or 4 for rows wider than 256 (Shape::kMaxGq); wider
 * groups take several blocks. */
int gq_for(int dim, int q_per_kv) {
  const int max_gq = dim > 256 ? 4 : 8;
  int gq = 1;
  while (gq < q_per_kv && gq < max_gq) gq *= 2;
  return gq;
}

template <typename T, int DIM>
void launch_gq(const AttendArgs &a, cudaStream_t st) {
  static_assert(Shape<T, DIM>::kMaxGq == (DIM > 256 ? 4 : 8), "gq_for must agree with Shape");
  switch (gq_for(a.c.dim, a.q_per_kv)) {
  case 1: launch_attend<T, DIM, 1>(a, st); break;
  case 2: launch_attend<T, DIM, 2>(a, st); break;
  case 4: launch_attend<T, DIM, 4>(a, st); break;
  default:
    if constexpr (Shape<T, DIM>::kMaxGq >= 8) launch_attend<T, DIM, 8>(a, st);
    break;
  }
}

template <typename T>
void launch_dim(const AttendArgs &a, cudaStream_t st) {
  const int d = a.c.dim;
  if (d <= 32) launch_gq<T, 32>(a, st);
  else if (d <= 64) launch_gq<T, 64>(a, st);
  else if (d <= 128) launch_gq<T, 128>(a, st);
  else if (d <= 256) launch_gq<T, 256>(a, st);
  else launch_gq<T, 512>(a, st);
}

bool cache_ok(const rlm_cuda_kv *c) {
  return c->k && c->v && c->n_kv >= 1 && c->dim >= 1 && c->cap >= 1 && c->keep >= 0 && c->window >= 0 &&
         (c->ring == 0 || (c->ring == c->cap - c->keep && c->ring > 0));
}

bool dtype_ok(rlm_dtype t) { return t == RLM_DTYPE_F32 || t == RLM_DTYPE_F16 || t == RLM_DTYPE_BF16; }

rlm_status launched(const char *fn, rlm_error *err) {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? RLM_OK : fail(err, RLM_ERR_INTERNAL, fn, "%s", cudaGetErrorString(e));
}

} // namespace

extern "C" rlm_status rlm__cuda_kv_write(const rlm_cuda_kv *c, const float *k, const float *v, const int32_t *tok_row,
                                         const int64_t *tok_pos, int n, rlm_cuda_stream st, rlm_error *err) {
  const char *fn = "rlm__cuda_kv_write";
  if (!c || !k || !v || !tok_row || !tok_pos || n < 0 || !cache_ok(c))
    return fail(err, RLM_ERR_INVALID, fn, "NULL argument, n < 0 or a bad cache (cap, ring, keep, window)");
  if (!dtype_ok(c->dtype))
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "a cache of dtype %d is not supported (f32, f16, bf16 are)",
                (int)c->dtype);
  if (c->n_kv > 65535) return fail(err, RLM_ERR_UNSUPPORTED, fn, "%d kv heads: at most 65535", c->n_kv);
  if (n == 0) return RLM_OK;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(st);
  const dim3 grid((unsigned)n, (unsigned)c->n_kv);
  const int threads = c->dim >= 128 ? 128 : (c->dim + kWarp - 1) / kWarp * kWarp;
  switch (c->dtype) {
  case RLM_DTYPE_F16: kv_write_kernel<__half><<<grid, threads, 0, s>>>(*c, k, v, tok_row, tok_pos); break;
  case RLM_DTYPE_BF16: kv_write_kernel<__nv_bfloat16><<<grid, threads, 0, s>>>(*c, k, v, tok_row, tok_pos); break;
  default: kv_write_kernel<float><<<grid, threads, 0, s>>>(*c, k, v, tok_row, tok_pos); break;
  }
  return launched(fn, err);
}

extern "C" size_t rlm__cuda_attend_scratch_bytes(int n, int n_heads, int dim) {
  if (n < 1 || n_heads < 1 || dim < 1) return 0;
  return (size_t)n * (size_t)n_heads * (size_t)n_splits(n, n_heads) * ((size_t)dim + 2) * sizeof(float);
}

extern "C" rlm_status rlm__cuda_attend(const rlm_cuda_kv *c, const float *q, int n_heads, float scale,
                                       const int32_t *tok_row, const int64_t *tok_pos, int n, float *out, void *scratch,
                                       rlm_cuda_stream st, rlm_error *err) {
  const char *fn = "rlm__cuda_attend";
  if (!c || !q || !tok_row || !tok_pos || !out || !scratch || n < 0 || !cache_ok(c))
    return fail(err, RLM_ERR_INVALID, fn, "NULL argument, n < 0 or a bad cache (cap, ring, keep, window)");
  if (!dtype_ok(c->dtype))
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "a cache of dtype %d is not supported (f32, f16, bf16 are)",
                (int)c->dtype);
  if (c->dim > kMaxDim || c->dim % 8) /* 16-byte vectors of any dtype */
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "head dim %d: a multiple of 8 up to %d is needed", c->dim, kMaxDim);
  if (n_heads < c->n_kv || n_heads % c->n_kv)
    return fail(err, RLM_ERR_INVALID, fn, "%d query heads over %d kv heads", n_heads, c->n_kv);
  const int q_per_kv = n_heads / c->n_kv;
  const int gq = gq_for(c->dim, q_per_kv);
  if ((int64_t)c->n_kv * ((q_per_kv + gq - 1) / gq) > 65535)
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "%d query heads: too many for one launch", n_heads);
  if ((reinterpret_cast<uintptr_t>(c->k) | reinterpret_cast<uintptr_t>(c->v)) & 15u)
    return fail(err, RLM_ERR_INVALID, fn, "K and V must be 16-byte aligned");
  if (n == 0) return RLM_OK;
  const int parts = n_splits(n, n_heads);
  float *part_o = static_cast<float *>(scratch);
  float *part_ml = part_o + (size_t)n * (size_t)n_heads * (size_t)parts * (size_t)c->dim;
  const AttendArgs a = {*c, q, n_heads, q_per_kv, n, scale * kLog2e, tok_row, tok_pos, parts, part_o, part_ml};
  cudaStream_t s = reinterpret_cast<cudaStream_t>(st);
  switch (c->dtype) {
  case RLM_DTYPE_F16: launch_dim<__half>(a, s); break;
  case RLM_DTYPE_BF16: launch_dim<__nv_bfloat16>(a, s); break;
  default: launch_dim<float>(a, s); break;
  }
  rlm_status rc = launched("rlm__cuda_attend (attend_kernel)", err);
  if (rc) return rc;
  merge_kernel<<<(unsigned)((int64_t)n * n_heads), kMergeThreads, 0, s>>>(*c, tok_row, tok_pos, n_heads, part_o,
                                                                          part_ml, parts, c->dim, out);
  return launched("rlm__cuda_attend (merge_kernel)", err);
}
