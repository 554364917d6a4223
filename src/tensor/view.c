/* view.c -- shapes and strided views. Pure index arithmetic; no view owns
 * memory. Every function checks its dims and returns false on a bad one so
 * that callers parsing outside data can turn it into RLM_ERR_INVALID. */
#include "tensor/tensor.h"

static void set_contiguous_strides(rlm_tensor *t) {
  int64_t s = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    t->stride[d] = s;
    s *= t->shape[d];
  }
}

bool rlm__tensor_init(rlm_tensor *t, rlm_dtype dtype, int ndim,
                      const int64_t *shape, void *data) {
  if (ndim < 0 || ndim > RLM_MAX_DIMS || rlm_dtype_size(dtype) == 0) return false;
  if (rlm__shape_nbytes(dtype, ndim, shape) < 0) return false;
  memset(t, 0, sizeof *t);
  t->dtype = dtype;
  t->ndim = ndim;
  for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
  set_contiguous_strides(t);
  t->data = data;
  return true;
}

int64_t rlm__tensor_numel(const rlm_tensor *t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
  return n;
}

int64_t rlm__shape_nbytes(rlm_dtype dtype, int ndim, const int64_t *shape) {
  int64_t n = (int64_t)rlm_dtype_size(dtype);
  if (n == 0 || ndim < 0 || ndim > RLM_MAX_DIMS) return -1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0) return -1;
    if (shape[d] && n > INT64_MAX / shape[d]) return -1;
    n *= shape[d];
  }
  return n;
}

bool rlm__tensor_is_contiguous(const rlm_tensor *t) {
  int64_t s = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] != 1 && t->stride[d] != s) return false;
    s *= t->shape[d];
  }
  return true;
}

bool rlm__tensor_slice(rlm_tensor *out, const rlm_tensor *t, int dim,
                       int64_t start, int64_t len) {
  if (dim < 0 || dim >= t->ndim || start < 0 || len < 0 || start > t->shape[dim] ||
      len > t->shape[dim] - start)
    return false;
  rlm_tensor v = *t;
  v.shape[dim] = len;
  v.data = (char *)t->data + start * t->stride[dim] * (int64_t)rlm_dtype_size(t->dtype);
  *out = v;
  return true;
}

bool rlm__tensor_transpose(rlm_tensor *out, const rlm_tensor *t, int d0, int d1) {
  if (d0 < 0 || d1 < 0 || d0 >= t->ndim || d1 >= t->ndim) return false;
  rlm_tensor v = *t;
  v.shape[d0] = t->shape[d1];
  v.shape[d1] = t->shape[d0];
  v.stride[d0] = t->stride[d1];
  v.stride[d1] = t->stride[d0];
  *out = v;
  return true;
}

bool rlm__tensor_reshape(rlm_tensor *out, const rlm_tensor *t, int ndim,
                         const int64_t *shape) {
  if (!rlm__tensor_is_contiguous(t)) return false;
  rlm_tensor v;
  if (!rlm__tensor_init(&v, t->dtype, ndim, shape, t->data)) return false;
  if (rlm__tensor_numel(&v) != rlm__tensor_numel(t)) return false;
  *out = v;
  return true;
}

void *rlm__tensor_at(const rlm_tensor *t, const int64_t *idx) {
  int64_t off = 0;
  for (int d = 0; d < t->ndim; d++) off += idx[d] * t->stride[d];
  return (char *)t->data + off * (int64_t)rlm_dtype_size(t->dtype);
}

void rlm__tensor_copy_to(const rlm_tensor *t, void *dst, rlm_dtype dt) {
  int64_t idx[RLM_MAX_DIMS] = {0};
  int64_t n = rlm__tensor_numel(t);
  for (int64_t i = 0; i < n; i++) {
    rlm__store_f(dst, dt, i, rlm__load_f(rlm__tensor_at(t, idx), t->dtype, 0));
    for (int d = t->ndim - 1; d >= 0; d--) { /* odometer increment */
      if (++idx[d] < t->shape[d]) break;
      idx[d] = 0;
    }
  }
}
