/* api.c -- public entry points that are thin wrappers over internal
 * layers: the read-only weights view (rlm_weights over safetensors). The
 * quantization entry points live in quant/quant.c, model quantization in
 * model/quantize_model.c. */
#include "model/safetensors.h"

struct rlm_weights {
  rlm_safetensors *st;
};

rlm_status rlm_weights_open(rlm_weights **out, const char *path, rlm_error *err) {
  if (!out || !path) return rlm__err(err, RLM_ERR_INVALID, "rlm_weights_open: NULL argument");
  *out = NULL;
  rlm_weights *w = rlm__calloc(1, sizeof *w);
  if (!w) return rlm__err_nomem(err, "rlm_weights", sizeof *w);
  rlm_status rc = rlm__st_open(&w->st, path, err);
  if (rc) {
    rlm__free(w);
    return rc;
  }
  *out = w;
  return RLM_OK;
}

void rlm_weights_free(rlm_weights *w) {
  if (!w) return;
  rlm__st_free(w->st);
  rlm__free(w);
}

size_t rlm_weights_count(const rlm_weights *w) { return w ? rlm__st_count(w->st) : 0; }

static void fill_info(const rlm_weights *w, const rlm_st_tensor *t, rlm_tensor_info *info) {
  memset(info, 0, sizeof *info);
  info->name = t->name;
  info->dtype = t->dtype;
  info->ndim = t->ndim;
  memcpy(info->shape, t->shape, sizeof t->shape);
  info->data = t->data;
  info->nbytes = t->nbytes;
  info->file = rlm__st_file_path(w->st, t->file_index);
}

rlm_status rlm_weights_get(const rlm_weights *w, size_t i, rlm_tensor_info *info,
                           rlm_error *err) {
  if (!w || !info) return rlm__err(err, RLM_ERR_INVALID, "rlm_weights_get: NULL argument");
  if (i >= rlm__st_count(w->st))
    return rlm__err(err, RLM_ERR_INVALID, "rlm_weights_get: index %zu out of range (%zu tensors)",
                    i, rlm__st_count(w->st));
  fill_info(w, rlm__st_at(w->st, i), info);
  return RLM_OK;
}

rlm_status rlm_weights_find(const rlm_weights *w, const char *name, rlm_tensor_info *info,
                            rlm_error *err) {
  if (!w || !name || !info) return rlm__err(err, RLM_ERR_INVALID, "rlm_weights_find: NULL argument");
  const rlm_st_tensor *t = rlm__st_find(w->st, name);
  if (!t)
    return rlm__err(err, RLM_ERR_NOT_FOUND, "%s: no tensor named '%s'",
                    rlm__st_file_path(w->st, 0), name);
  fill_info(w, t, info);
  return RLM_OK;
}
