/* tensor.h -- dtypes, scalar conversions and strided views.
 *
 * A view (rlm_tensor) is a dtype, a shape, strides in elements and a data
 * pointer; it owns nothing. Weights are views into mmap'd safetensors data,
 * scratch tensors are views into arenas. Shape [d0, d1, ..., d_{n-1}] is
 * row-major: the last dimension varies fastest, as in safetensors and MLX.
 *
 * Conversions are exact IEEE: f32->bf16 and f32->f16 round to nearest even
 * (f16 with subnormals, overflow to inf, NaN kept quiet); the widening ones
 * are exact.
 */
#ifndef RLM_TENSOR_H
#define RLM_TENSOR_H

#include "base/base.h"

#include <string.h>

typedef struct rlm_tensor {
  rlm_dtype dtype;
  int ndim;
  int64_t shape[RLM_MAX_DIMS];
  int64_t stride[RLM_MAX_DIMS]; /* elements, not bytes */
  void *data;
} rlm_tensor;

/* ---- scalar conversions ------------------------------------------------ */

static inline uint32_t rlm__f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static inline float rlm__bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline float rlm__bf16_to_f32(uint16_t h) {
  return rlm__bits_f32((uint32_t)h << 16);
}

static inline uint16_t rlm__f32_to_bf16(float f) {
  uint32_t u = rlm__f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
  return (uint16_t)(u >> 16);
}

float rlm__f16_to_f32(uint16_t h);
uint16_t rlm__f32_to_f16(float f);

/* Element i of a contiguous float array of dtype t (f32, f16, bf16). */
static inline float rlm__load_f(const void *p, rlm_dtype t, int64_t i) {
  switch (t) {
  case RLM_DTYPE_F16: return rlm__f16_to_f32(((const uint16_t *)p)[i]);
  case RLM_DTYPE_BF16: return rlm__bf16_to_f32(((const uint16_t *)p)[i]);
  default: return ((const float *)p)[i];
  }
}

/* Stores v rounded to dtype t (f32, f16, bf16). */
static inline void rlm__store_f(void *p, rlm_dtype t, int64_t i, float v) {
  switch (t) {
  case RLM_DTYPE_F16: ((uint16_t *)p)[i] = rlm__f32_to_f16(v); break;
  case RLM_DTYPE_BF16: ((uint16_t *)p)[i] = rlm__f32_to_bf16(v); break;
  default: ((float *)p)[i] = v; break;
  }
}

/* Rounds v to the precision of dtype t and back (f32: identity). */
static inline float rlm__round_to(rlm_dtype t, float v) {
  switch (t) {
  case RLM_DTYPE_F16: return rlm__f16_to_f32(rlm__f32_to_f16(v));
  case RLM_DTYPE_BF16: return rlm__bf16_to_f32(rlm__f32_to_bf16(v));
  default: return v;
  }
}

static inline bool rlm__dtype_is_float(rlm_dtype t) {
  return t == RLM_DTYPE_F32 || t == RLM_DTYPE_F16 || t == RLM_DTYPE_BF16;
}

/* n elements from src (dtype st) to dst (dtype dt); float dtypes only. */
void rlm__convert(const void *src, rlm_dtype st, void *dst, rlm_dtype dt,
                  int64_t n);

/* ---- shapes and views -------------------------------------------------- */

/* Contiguous view; returns false if ndim or a dimension is out of range. */
bool rlm__tensor_init(rlm_tensor *t, rlm_dtype dtype, int ndim,
                      const int64_t *shape, void *data);
int64_t rlm__tensor_numel(const rlm_tensor *t);
/* Bytes of a contiguous tensor of this shape; -1 on overflow. */
int64_t rlm__shape_nbytes(rlm_dtype dtype, int ndim, const int64_t *shape);
bool rlm__tensor_is_contiguous(const rlm_tensor *t);
/* The sub-view t[..., start:start+len, ...] along dim. */
bool rlm__tensor_slice(rlm_tensor *out, const rlm_tensor *t, int dim,
                       int64_t start, int64_t len);
/* Swaps two dimensions (no copy). */
bool rlm__tensor_transpose(rlm_tensor *out, const rlm_tensor *t, int d0, int d1);
/* New shape over the same elements; the view must be contiguous. */
bool rlm__tensor_reshape(rlm_tensor *out, const rlm_tensor *t, int ndim,
                         const int64_t *shape);
/* Pointer to the element at idx[0..ndim). */
void *rlm__tensor_at(const rlm_tensor *t, const int64_t *idx);
/* Copies any float view into a contiguous array of dtype dt. */
void rlm__tensor_copy_to(const rlm_tensor *t, void *dst, rlm_dtype dt);

#endif /* RLM_TENSOR_H */
