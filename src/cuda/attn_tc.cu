/* attn_tc.cu -- prefill attention on the tensor cores (cuda_ops.h:
 * rlm__cuda_attend_prefill): the many queries of one row's chunk against
 * a cache of f16 or bf16 elements, or of 2-8-bit codes with f16 or bf16
 * scales (K and V at their own widths), head dims 64, 128 and 256.
 *
 * WHY. attn.cu's flash-decoding kernel serves every pass; at prefill it
 * does the work of 512 queries a layer on the CUDA cores, a third of a
 * Llama-8B bf16 pp512 pass (ncu, docs/performance.md). Here the scores
 * and the weighted sum of V are mma.sync m16n8k16 products instead.
 *
 * THE WORK. A block is 16 consecutive tokens of the pass (all of one row:
 * the caller's promise) and one kv head; its 4 warps take 4 of that kv
 * head's query heads (grid.z covers the rest; at head dim 256, 2 heads of
 * 2 warps, each warp summing P V for half of the dims), so each K and V
 * tile read into shared memory serves all of them (GQA). A warp holds its 16 queries
 * as A fragments (q rounded to the cache's type) and walks the keys the
 * block's queries see, 64 at a time (32 at head dim 256):
 *     S = Q K^T          (fragments of K read from shared memory, row-major)
 *     mask, scale to log2 units, online softmax per query row (max, sum)
 *     O += P V           (P rounded to the cache's type, from S's own
 *                         registers; V stored transposed in shared memory
 *                         so that a B fragment is two 32-bit loads)
 * and writes O / l. The keys: attn.cu's rule (a query at qp sees kp <= qp;
 * with a window, kp < keep or qp - kp < window - keep), walked as the
 * union of the block's runs, sinks [0, min(keep, lo)) then [lo, hi], each
 * key masked per query by its own runs (attn_rows.cuh's runs_of, clamps
 * included, so no slot outside the row is read); slots by slot_of.
 *
 * QUANTIZED CACHES: each key's codes are widened as attn.cu widens them
 * (attn_rows.cuh: code * scale + bias in f32) and rounded to the scales'
 * type as the tile is stored; the products are then the dense ones.
 *
 * NUMERICS. Scores accumulate in f32 from q and K in the cache's type (q
 * rounded once), the softmax is f32 (exp2 of log2-scaled scores, max
 * subtracted), P is rounded to the cache's type for P V, accumulated in
 * f32: within bf16's rounding of the exact result (test_cuda_ops
 * attend_prefill_tc_matches_reference), as llama.cpp's flash attention
 * rounds to f16. A query that sees nothing gets zeros.
 */
#include "cuda_ops.h"

#include "attn_rows.cuh"
#include "common.cuh"

#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

namespace {

using namespace rlm_cuda;

constexpr int kTok = 16;  /* tokens a block (an m16 tile)   */
constexpr int kWarps = 4; /* warps a block                  */
/* The shape per head dim D: keys a tile (the tiles stay within 48 KB of
 * shared memory), and warps a query head (at 256 two warps share a head,
 * each summing P V for half of the dims, so that a lane's accumulators
 * stay 64 registers; both compute the head's scores). */
template <int D> struct shape {
  static constexpr int keys = D == 256 ? 32 : 64, split = D == 256 ? 2 : 1, heads = kWarps / split;
};
constexpr float kLog2e = 1.4426950408889634f;

/* D += A B, m16n8k16, f32 accumulators, A and B of type T (f16 or bf16). */
#define RLM_MMA_16816(TY)                                                                                           \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, " \
               "{%0,%1,%2,%3};\n"                                                                                   \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                                     \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
template <typename T>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same<T, __half>::value) RLM_MMA_16816("f16");
  else RLM_MMA_16816("bf16");
}
#undef RLM_MMA_16816

template <typename T> __device__ __forceinline__ T to_t(float f);
template <> __device__ __forceinline__ __half to_t<__half>(float f) { return __float2half_rn(f); }
template <> __device__ __forceinline__ __nv_bfloat16 to_t<__nv_bfloat16>(float f) { return __float2bfloat16_rn(f); }

/* Two floats rounded to T, the first in the low half (the lower column). */
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t u;
  if constexpr (std::is_same<T, __half>::value) {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&u, &v, 4);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&u, &v, 4);
  }
  return u;
}

/* The row's K and V of 64 keys (virtual index t0 + i: the sinks, then the
 * run from lo) into ks [key][D + 8] and vt [D][64 + 8] (V transposed), in
 * T: dense rows as stored, quantized ones widened (attn_rows.cuh) and
 * rounded to T; keys past nk are zeros. Thread i takes key i % 64, so
 * consecutive lanes store consecutive keys of vt (no bank conflicts) and
 * distinct rows of ks. */
template <typename T, int D, int kKeys, typename RK, typename RV>
__device__ __forceinline__ void load_tile(const RK &kr_, const RV &vr_, const rlm_cuda_kv &g, int64_t t0, int64_t nk,
                                          int64_t sink_end, int64_t lo, T (*ks)[D + 8], T (*vt)[kKeys + 8]) {
  constexpr int kVe = RK::kVe;
  static_assert(RV::kVe == kVe, "K and V rows of one vector width");
  for (int i = threadIdx.x; i < kKeys * (D / kVe); i += kWarps * kWarp) {
    const int kr = i % kKeys, v = i / kKeys;
    const int64_t t = t0 + kr;
    const bool in = t < nk;
    const int64_t slot = in ? slot_of(t < sink_end ? t : lo + (t - sink_end), g.ring, g.keep) : 0;
    if constexpr (std::is_same<RK, DenseRows<T>>::value) { /* 16 bytes of T: stored as they are */
      const uint4 kv = in ? kr_.load(slot, v) : RK::zero(), vv = in ? vr_.load(slot, v) : RV::zero();
      *reinterpret_cast<uint4 *>(&ks[kr][v * kVe]) = kv;
      const T *ve = reinterpret_cast<const T *>(&vv);
#pragma unroll
      for (int e = 0; e < kVe; e++) vt[v * kVe + e][kr] = ve[e];
    } else {
      float fk[kVe], fv[kVe];
      kr_.widen(in ? kr_.load(slot, v) : RK::zero(), fk);
      vr_.widen(in ? vr_.load(slot, v) : RV::zero(), fv);
#pragma unroll
      for (int e = 0; e < kVe; e += 2) {
        const uint32_t k2 = pack2<T>(fk[e], fk[e + 1]);
        memcpy(&ks[kr][v * kVe + e], &k2, 4);
        vt[v * kVe + e][kr] = to_t<T>(fv[e]), vt[v * kVe + e + 1][kr] = to_t<T>(fv[e + 1]);
      }
    }
  }
}

template <typename T, int D, typename RK, typename RV>
__global__ void __launch_bounds__(kWarps *kWarp)
    attend_tc_kernel(rlm_cuda_kv geo, const float *__restrict__ q,
                     int n_heads, int q_per_kv, int n, float scale_log2, const int32_t *__restrict__ tok_row,
                     const int64_t *__restrict__ tok_pos, float *__restrict__ out) {
  constexpr int kKeys = shape<D>::keys, kSplit = shape<D>::split, DO = D / kSplit; /* DO: this warp's dims */
  __shared__ __align__(16) T ks[kKeys][D + 8];
  __shared__ __align__(16) T vt[D][kKeys + 8];
  __shared__ int64_t qse[kTok], qlo[kTok], qhi[kTok]; /* each query's runs: [0, se), [lo, hi) */
  pdl_enter();
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, c = lane % 4;
  const int j0 = blockIdx.x * kTok, kvh = blockIdx.y, hi = blockIdx.z * shape<D>::heads + warp / kSplit;
  const int d0 = (warp % kSplit) * (DO / 8); /* this warp's first n-tile of dims */
  const bool active = hi < q_per_kv;
  const int h = kvh * q_per_kv + (active ? hi : 0);
  if (threadIdx.x < kTok) {
    const Runs r = runs_of(geo, j0 + (int)threadIdx.x < n ? tok_pos[j0 + threadIdx.x] : -1);
    qse[threadIdx.x] = r.sink_end, qlo[threadIdx.x] = r.lo, qhi[threadIdx.x] = r.lo + r.n - r.sink_end;
  }
  __syncthreads();
  /* the block's keys: the union of its queries' runs */
  int64_t top = -1, lo = INT64_MAX;
  for (int i = 0; i < kTok; i++)
    if (qhi[i] > qlo[i] || qse[i] > 0) top = max(top, qhi[i] - 1), lo = min(lo, qlo[i]);
  const int64_t sink_end = top < 0 ? 0 : min((int64_t)geo.keep, lo), nk = top < 0 ? 0 : sink_end + top - lo + 1;
  const int64_t head = (int64_t)tok_row[j0] * geo.n_kv + kvh;
  const RK kr(geo, Tensor{geo.k, geo.ks, geo.kb, geo.k_bits}, head);
  const RV vr(geo, Tensor{geo.v, geo.vs, geo.vb, geo.v_bits}, head);

  /* this warp's 16 queries as A fragments: rows g and g + 8 */
  uint32_t qa[D / 16][4];
  {
    const bool in0 = j0 + g < n, in1 = j0 + g + 8 < n;
    const float *q0 = q + ((size_t)(j0 + g) * n_heads + h) * D, *q1 = q0 + (size_t)8 * n_heads * D;
#pragma unroll
    for (int s = 0; s < D / 16; s++) {
      const int k0 = s * 16 + 2 * c;
      const float2 a = in0 ? *reinterpret_cast<const float2 *>(q0 + k0) : make_float2(0, 0);
      const float2 b = in1 ? *reinterpret_cast<const float2 *>(q1 + k0) : make_float2(0, 0);
      const float2 a8 = in0 ? *reinterpret_cast<const float2 *>(q0 + k0 + 8) : make_float2(0, 0);
      const float2 b8 = in1 ? *reinterpret_cast<const float2 *>(q1 + k0 + 8) : make_float2(0, 0);
      qa[s][0] = pack2<T>(a.x, a.y), qa[s][1] = pack2<T>(b.x, b.y);
      qa[s][2] = pack2<T>(a8.x, a8.y), qa[s][3] = pack2<T>(b8.x, b8.y);
    }
  }
  const int64_t se0 = qse[g], lo0 = qlo[g], hi0 = qhi[g], se1 = qse[g + 8], lo1 = qlo[g + 8], hi1 = qhi[g + 8];
  float o[DO / 8][4] = {};
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f; /* l: this lane's share */

  for (int64_t t0 = 0; t0 < nk; t0 += kKeys) {
    __syncthreads(); /* the previous tile is consumed */
    load_tile<T, D, kKeys>(kr, vr, geo, t0, nk, sink_end, lo, ks, vt);
    __syncthreads();
    if (!active) continue;
    float s[kKeys / 8][4] = {};
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; nt++)
#pragma unroll
      for (int k = 0; k < D / 16; k++) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t *>(&ks[nt * 8 + g][k * 16 + 2 * c]);
        const uint32_t b1 = *reinterpret_cast<const uint32_t *>(&ks[nt * 8 + g][k * 16 + 8 + 2 * c]);
        mma<T>(s[nt], qa[k], b0, b1);
      }
    float x0 = -INFINITY, x1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int64_t t = t0 + nt * 8 + 2 * c + (e & 1);
        const int64_t kp = t < sink_end ? t : lo + (t - sink_end);
        const bool vis = t < nk && (e < 2 ? kp < se0 || (kp >= lo0 && kp < hi0) : kp < se1 || (kp >= lo1 && kp < hi1));
        s[nt][e] = vis ? s[nt][e] * scale_log2 : -INFINITY;
        if (e < 2) x0 = fmaxf(x0, s[nt][e]);
        else x1 = fmaxf(x1, s[nt][e]);
      }
#pragma unroll
    for (int d = 1; d <= 2; d <<= 1) {
      x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, d));
      x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, d));
    }
    const float n0 = fmaxf(m0, x0), n1 = fmaxf(m1, x1);
    const float base0 = n0 == -INFINITY ? 0.0f : n0, base1 = n1 == -INFINITY ? 0.0f : n1;
    const float r0 = exp2f(m0 - base0), r1 = exp2f(m1 - base1); /* 0 from -inf, 1 while nothing is seen */
    m0 = n0, m1 = n1, l0 *= r0, l1 *= r1;
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; nt++) {
      s[nt][0] = exp2f(s[nt][0] - base0), s[nt][1] = exp2f(s[nt][1] - base0);
      s[nt][2] = exp2f(s[nt][2] - base1), s[nt][3] = exp2f(s[nt][3] - base1);
      l0 += s[nt][0] + s[nt][1], l1 += s[nt][2] + s[nt][3];
    }
#pragma unroll
    for (int d = 0; d < DO / 8; d++) o[d][0] *= r0, o[d][1] *= r0, o[d][2] *= r1, o[d][3] *= r1;
#pragma unroll
    for (int k = 0; k < kKeys / 16; k++) {
      const uint32_t pa[4] = {pack2<T>(s[2 * k][0], s[2 * k][1]), pack2<T>(s[2 * k][2], s[2 * k][3]),
                              pack2<T>(s[2 * k + 1][0], s[2 * k + 1][1]), pack2<T>(s[2 * k + 1][2], s[2 * k + 1][3])};
#pragma unroll
      for (int d = 0; d < DO / 8; d++) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t *>(&vt[(d0 + d) * 8 + g][k * 16 + 2 * c]);
        const uint32_t b1 = *reinterpret_cast<const uint32_t *>(&vt[(d0 + d) * 8 + g][k * 16 + 8 + 2 * c]);
        mma<T>(o[d], pa, b0, b1);
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int d = 1; d <= 2; d <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, d);
    l1 += __shfl_xor_sync(0xffffffffu, l1, d);
  }
  const float i0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, i1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
  float *o0 = out + ((size_t)(j0 + g) * n_heads + h) * D, *o1 = o0 + (size_t)8 * n_heads * D;
#pragma unroll
  for (int d = 0; d < DO / 8; d++) {
    const int e = (d0 + d) * 8 + 2 * c;
    if (j0 + g < n) *reinterpret_cast<float2 *>(o0 + e) = make_float2(o[d][0] * i0, o[d][1] * i0);
    if (j0 + g + 8 < n) *reinterpret_cast<float2 *>(o1 + e) = make_float2(o[d][2] * i1, o[d][3] * i1);
  }
}

template <typename T, int D, typename R>
void launch_tc(const rlm_cuda_kv *c, const float *q, int n_heads, float scale, const int32_t *tok_row,
               const int64_t *tok_pos, int n, float *out, cudaStream_t st) {
  const int q_per_kv = n_heads / c->n_kv;
  constexpr int H = shape<D>::heads;
  const dim3 grid((unsigned)((n + kTok - 1) / kTok), (unsigned)c->n_kv, (unsigned)((q_per_kv + H - 1) / H));
  launch_k(attend_tc_kernel<T, D, R, R>, grid, kWarps * kWarp, 0, st, *c, q, n_heads, q_per_kv, n, scale * kLog2e,
           tok_row, tok_pos, out);
}

/* The instances: T the cache's type (or its scales'), D, dense or quantized rows. */
template <typename T>
void launch_typed(const rlm_cuda_kv *c, const float *q, int n_heads, float scale, const int32_t *tok_row,
                  const int64_t *tok_pos, int n, float *out, cudaStream_t st) {
  const bool quant = c->k_bits != 0;
#define RLM_TC(D)                                                                                         \
  (quant ? launch_tc<T, D, QuantRows<T>>(c, q, n_heads, scale, tok_row, tok_pos, n, out, st)              \
         : launch_tc<T, D, DenseRows<T>>(c, q, n_heads, scale, tok_row, tok_pos, n, out, st))
  if (c->dim == 64) RLM_TC(64);
  else if (c->dim == 128) RLM_TC(128);
  else RLM_TC(256);
#undef RLM_TC
}

} // namespace

extern "C" bool rlm__cuda_attend_prefill_takes(const rlm_cuda_kv *c) {
  if (!c || (c->dtype != RLM_DTYPE_BF16 && c->dtype != RLM_DTYPE_F16) || (c->dim != 64 && c->dim != 128 && c->dim != 256))
    return false;
  if (!c->k_bits && !c->v_bits) return true;
  const auto bits_ok = [](int b) { return b >= 2 && b <= 8 && b != 7; };
  return bits_ok(c->k_bits) && bits_ok(c->v_bits) && (c->group == 32 || c->group == 64 || c->group == 128) &&
         c->dim % c->group == 0 && c->ks && c->kb && c->vs && c->vb;
}

extern "C" rlm_status rlm__cuda_attend_prefill(const rlm_cuda_kv *c, const float *q, int n_heads, float scale,
                                               const int32_t *tok_row, const int64_t *tok_pos, int n, float *out,
                                               rlm_cuda_stream st, rlm_error *err) {
  const char *fn = "rlm__cuda_attend_prefill";
  if (!c || !q || !tok_row || !tok_pos || !out || n < 0 || !c->k || !c->v || c->n_kv < 1 || c->cap < 1)
    return fail(err, RLM_ERR_INVALID, fn, "NULL argument, n < 0 or an empty cache");
  if (!rlm__cuda_attend_prefill_takes(c))
    return fail(err, RLM_ERR_UNSUPPORTED, fn, "a cache of f16 or bf16 (elements, or scales of 2-8-bit codes in "
                "groups of 32-128) and head dim 64, 128 or 256 is needed (dtype %d, dim %d, bits %d/%d, group %d)",
                (int)c->dtype, c->dim, c->k_bits, c->v_bits, c->group);
  if (n_heads < c->n_kv || n_heads % c->n_kv || n_heads / c->n_kv > 65535)
    return fail(err, RLM_ERR_INVALID, fn, "%d query heads over %d kv heads", n_heads, c->n_kv);
  if ((reinterpret_cast<uintptr_t>(c->k) | reinterpret_cast<uintptr_t>(c->v)) & 15u)
    return fail(err, RLM_ERR_INVALID, fn, "K and V must be 16-byte aligned");
  if (n == 0) return RLM_OK;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(st);
  if (c->dtype == RLM_DTYPE_BF16) launch_typed<__nv_bfloat16>(c, q, n_heads, scale, tok_row, tok_pos, n, out, s);
  else launch_typed<__half>(c, q, n_heads, scale, tok_row, tok_pos, n, out, s);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? RLM_OK : fail(err, RLM_ERR_INTERNAL, fn, "%s", cudaGetErrorString(e));
}
