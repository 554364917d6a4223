/* quantize_model.c -- `ringlm quantize`: turn a safetensors model into
 * MLX's affine-quantized layout, as mlx-lm's convert/quantize writes it.
 *
 * Which tensors: a 2-D float tensor whose name ends in ".weight", is not a
 * norm, is not an embedding (unless asked), and whose last dimension is a
 * multiple of the group size (mlx-lm skips the others the same way). It
 * becomes three tensors under the same prefix:
 *   <p>.weight  u32   [out][in * bits / 32]
 *   <p>.scales  dtype [out][in / group_size]
 *   <p>.biases  dtype [out][in / group_size]
 * with scales and biases in the input dtype. Everything else is copied
 * unchanged (zero-copy from the input mapping into the writer). Overrides
 * give matching tensors other bits / group sizes (or leave them dense);
 * config.json records each such layer by its prefix, as mlx-lm does.
 *
 * A folder in gives a folder out: one model.safetensors (metadata
 * {"format": "mlx"}), config.json with "quantization" and its mirror
 * "quantization_config" = {"group_size", "bits", "mode": "affine"}, and
 * every other plain file (tokenizer, generation config) copied. Shard
 * indexes are not copied: the output is one file.
 */
#include "model/safetensors.h"
#include "quant/quant.h"

#include <dirent.h>
#include <jansson.h>

typedef struct qm_ctx {
  const rlm_quantize_params *p;
  json_t *per_layer;   /* prefix -> {"bits", "group_size"} or false */
  rlm_st_writer *w;
  rlm_pool *pool;
  rlm_quantize_stats *stats;
  const char *in_path; /* for messages */
} qm_ctx;

rlm_quantize_params rlm_quantize_params_default(void) {
  return (rlm_quantize_params){.bits = 4, .group_size = 64, .quantize_embeddings = false,
                               .n_threads = 0};
}

static bool ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* The first override whose match the name contains, or NULL. */
static const rlm_quantize_override *override_for(const rlm_quantize_params *p, const char *name) {
  for (int i = 0; i < p->n_overrides; i++)
    if (strstr(name, p->overrides[i].match)) return &p->overrides[i];
  return NULL;
}

/* Whether t is quantized, and with which bits and group size. */
static bool should_quantize(const rlm_st_tensor *t, const rlm_quantize_params *p, int *bits, int *gs) {
  if (t->ndim != 2 || !rlm__dtype_is_float(t->dtype) || !ends_with(t->name, ".weight"))
    return false;
  if (strstr(t->name, "norm")) return false;
  if (!p->quantize_embeddings && strstr(t->name, "embed")) return false;
  const rlm_quantize_override *o = override_for(p, t->name);
  *bits = o ? o->bits : p->bits;
  *gs = o && o->group_size ? o->group_size : p->group_size;
  return *bits && t->shape[1] > 0 && t->shape[1] % *gs == 0;
}

/* Notes a tensor an override touched under its layer prefix. */
static rlm_status note_layer(qm_ctx *c, const char *name, int bits, int gs, rlm_error *err) {
  if (!override_for(c->p, name)) return RLM_OK;
  char prefix[1024];
  snprintf(prefix, sizeof prefix, "%.*s", (int)(strlen(name) - strlen(".weight")), name);
  json_t *v = bits ? json_pack("{s:i, s:i}", "group_size", gs, "bits", bits) : json_false();
  if (!v || json_object_set_new(c->per_layer, prefix, v)) return rlm__err_nomem(err, "config.json", 0);
  return RLM_OK;
}

/* ---- quantizing one tensor over the pool ------------------------------ */

struct rows_job {
  const rlm_quant_kernels *k;
  const char *x;
  rlm_dtype dt;
  int64_t cols;
  int bits, gs;
  uint32_t *wq;
  char *scales, *biases;
};

static void quantize_range(void *ctx, int64_t r0, int64_t r1, int ith, int nth) {
  const struct rows_job *j = ctx;
  size_t es = rlm_dtype_size(j->dt);
  int64_t ng = j->cols / j->gs, words = rlm__quant_row_words(j->cols, j->bits);
  j->k->quantize_rows(j->x + (size_t)(r0 * j->cols) * es, j->dt, r1 - r0, j->cols, j->bits,
                      j->gs, j->wq + r0 * words, j->scales + (size_t)(r0 * ng) * es,
                      j->biases + (size_t)(r0 * ng) * es);
}

/* "<prefix>.weight" -> "<prefix><suffix>" in buf. */
static void sibling_name(char *buf, size_t n, const char *name, const char *suffix) {
  snprintf(buf, n, "%.*s%s", (int)(strlen(name) - strlen(".weight")), name, suffix);
}

static rlm_status quantize_tensor(qm_ctx *c, const rlm_st_tensor *t, int bits, int gs, rlm_error *err) {
  const int64_t rows = t->shape[0], cols = t->shape[1];
  const size_t es = rlm_dtype_size(t->dtype);
  const size_t n_wq = (size_t)(rows * rlm__quant_row_words(cols, bits)) * 4;
  const size_t n_sb = (size_t)(rows * (cols / gs)) * es;
  void *x = NULL;
  uint32_t *wq = rlm__malloc(n_wq);
  void *scales = rlm__malloc(n_sb), *biases = rlm__malloc(n_sb);
  rlm_status rc = RLM_OK;
  if (!wq || !scales || !biases) {
    rc = rlm__err_nomem(err, t->name, n_wq + 2 * n_sb);
    goto out_free_buffers;
  }
  /* mmap'd data may sit at any offset; kernels want natural alignment. */
  const void *src = t->data;
  if ((uintptr_t)src % es) {
    if (!(x = rlm__malloc(t->nbytes))) {
      rc = rlm__err_nomem(err, t->name, t->nbytes);
      goto out_free_buffers;
    }
    memcpy(x, src, t->nbytes);
    src = x;
  }
  struct rows_job j = {rlm__quant_kernels(), src, t->dtype, cols, bits, gs, wq, scales, biases};
  rlm__pool_for(c->pool, rows, 1, 0, quantize_range, &j);
  rlm__free(x);
  char name[1024];
  int64_t shape_wq[2] = {rows, cols * bits / 32}, shape_sb[2] = {rows, cols / gs};
  rc = rlm__st_writer_add_owned(c->w, t->name, RLM_DTYPE_U32, 2, shape_wq, wq, n_wq, err);
  sibling_name(name, sizeof name, t->name, ".scales");
  if (!rc) rc = rlm__st_writer_add_owned(c->w, name, t->dtype, 2, shape_sb, scales, n_sb, err);
  else rlm__free(scales);
  sibling_name(name, sizeof name, t->name, ".biases");
  if (!rc) rc = rlm__st_writer_add_owned(c->w, name, t->dtype, 2, shape_sb, biases, n_sb, err);
  else rlm__free(biases);
  c->stats->n_quantized++;
  c->stats->n_tensors += 3;
  c->stats->bytes_out += (int64_t)(n_wq + 2 * n_sb);
  return rc;
out_free_buffers:
  rlm__free(wq);
  rlm__free(scales);
  rlm__free(biases);
  return rc;
}

static rlm_status add_tensor(qm_ctx *c, const rlm_st_tensor *t, rlm_error *err) {
  c->stats->bytes_in += (int64_t)t->nbytes;
  if (ends_with(t->name, ".scales"))
    return rlm__err(err, RLM_ERR_INVALID, "%s: tensor '%s': the model is already quantized",
                    c->in_path, t->name);
  int bits = 0, gs = 0;
  bool q = should_quantize(t, c->p, &bits, &gs);
  rlm_status rc = ends_with(t->name, ".weight") && t->ndim == 2 ? note_layer(c, t->name, q ? bits : 0, gs, err)
                                                                 : RLM_OK;
  if (rc) return rc;
  if (q) return quantize_tensor(c, t, bits, gs, err);
  c->stats->n_tensors++;
  c->stats->bytes_out += (int64_t)t->nbytes;
  return rlm__st_writer_add(c->w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes,
                            err);
}

/* Reads every tensor of `in` (file or folder) and writes `out_file`. */
static rlm_status write_weights(const char *in, const char *out_file, qm_ctx *c,
                               rlm_error *err) {
  rlm_safetensors *st;
  rlm_status rc = rlm__st_open(&st, in, err);
  if (rc) return rc;
  if ((rc = rlm__st_writer_create(&c->w, err))) goto out_free_st;
  if ((rc = rlm__st_writer_set_metadata(c->w, "format", "mlx", err))) goto out_free_writer;
  for (size_t i = 0; i < rlm__st_count(st) && !rc; i++)
    rc = add_tensor(c, rlm__st_at(st, i), err);
  if (!rc) rc = rlm__st_writer_save(c->w, out_file, err);
out_free_writer:
  rlm__st_writer_free(c->w); /* before unmapping: it borrows tensor data */
  c->w = NULL;
out_free_st:
  rlm__st_free(st);
  return rc;
}

/* ---- the folder around the weights ------------------------------------ */

static rlm_status write_config(const char *in_dir, const char *out_dir,
                               const rlm_quantize_params *p, json_t *per_layer, rlm_error *err) {
  char *in = rlm__path_join(in_dir, "config.json"), *out = rlm__path_join(out_dir, "config.json");
  json_t *cfg = NULL, *q = NULL;
  rlm_status rc = RLM_OK;
  if (!in || !out) {
    rc = rlm__err_nomem(err, "path", 0);
    goto out_free_paths;
  }
  if (!rlm__path_exists(in)) goto out_free_paths; /* a bare weights folder */
  if ((rc = rlm__json_load_file(in, &cfg, err))) goto out_free_paths;
  if (!json_is_object(cfg)) {
    rc = rlm__err(err, RLM_ERR_FORMAT, "%s: not a JSON object", in);
    goto out_free_json;
  }
  if (json_object_get(cfg, "quantization")) {
    rc = rlm__err(err, RLM_ERR_INVALID, "%s: the model is already quantized", in);
    goto out_free_json;
  }
  q = json_pack("{s:i, s:i, s:s}", "group_size", p->group_size, "bits", p->bits, "mode",
                "affine");
  if (!q || json_object_update(q, per_layer) || json_object_set(cfg, "quantization", q) ||
      json_object_set(cfg, "quantization_config", q)) {
    rc = rlm__err_nomem(err, "config.json", 0);
    goto out_free_json;
  }
  rc = rlm__json_save_file(cfg, out, err);
out_free_json:
  json_decref(q);
  json_decref(cfg);
out_free_paths:
  rlm__free(in);
  rlm__free(out);
  return rc;
}

static bool is_side_file(const char *name) {
  return name[0] != '.' && !ends_with(name, ".safetensors") &&
         !ends_with(name, ".safetensors.index.json") && strcmp(name, "config.json") != 0;
}

static rlm_status copy_side_files(const char *in_dir, const char *out_dir, rlm_error *err) {
  DIR *d = opendir(in_dir);
  if (!d) return rlm__err(err, RLM_ERR_IO, "%s: cannot list the folder", in_dir);
  rlm_status rc = RLM_OK;
  for (struct dirent *e; !rc && (e = readdir(d));) {
    if (!is_side_file(e->d_name)) continue;
    char *src = rlm__path_join(in_dir, e->d_name), *dst = rlm__path_join(out_dir, e->d_name);
    if (!src || !dst) rc = rlm__err_nomem(err, "path", 0);
    else if (!rlm__path_is_dir(src)) rc = rlm__file_copy(src, dst, err);
    rlm__free(src);
    rlm__free(dst);
  }
  closedir(d);
  return rc;
}

static rlm_status check_params(const rlm_quantize_params *p, rlm_error *err) {
  if (!rlm__quant_bits_ok(p->bits))
    return rlm__err(err, RLM_ERR_INVALID, "quantize: --bits %d (allowed: 2, 3, 4, 5, 6, 8)", p->bits);
  if (!rlm__quant_group_ok(p->group_size))
    return rlm__err(err, RLM_ERR_INVALID, "quantize: --group-size %d (allowed: 32, 64, 128)",
                    p->group_size);
  for (int i = 0; i < p->n_overrides; i++) {
    const rlm_quantize_override *o = &p->overrides[i];
    if (!o->match || !o->match[0] || (o->bits && !rlm__quant_bits_ok(o->bits)) ||
        (o->group_size && !rlm__quant_group_ok(o->group_size)))
      return rlm__err(err, RLM_ERR_INVALID, "quantize: override '%s' has bits %d, group size %d",
                      o->match ? o->match : "", o->bits, o->group_size);
  }
  return RLM_OK;
}

static rlm_status quantize_folder(const char *in, const char *out, qm_ctx *c, rlm_error *err) {
  rlm_status rc = rlm__mkdir(out, err);
  if (rc) return rc;
  char *weights = rlm__path_join(out, "model.safetensors");
  if (!weights) return rlm__err_nomem(err, "path", 0);
  rc = write_weights(in, weights, c, err);
  if (!rc) rc = write_config(in, out, c->p, c->per_layer, err);
  if (!rc) rc = copy_side_files(in, out, err);
  rlm__free(weights);
  return rc;
}

rlm_status rlm_quantize_model(const char *in, const char *out,
                              const rlm_quantize_params *params,
                              rlm_quantize_stats *stats, rlm_error *err) {
  rlm_quantize_params p = params ? *params : rlm_quantize_params_default();
  rlm_quantize_stats st_local;
  if (!stats) stats = &st_local;
  memset(stats, 0, sizeof *stats);
  if (!in || !out) return rlm__err(err, RLM_ERR_INVALID, "quantize: missing input or output path");
  rlm_status rc = check_params(&p, err);
  if (rc) return rc;
  if (!rlm__path_exists(in)) return rlm__err(err, RLM_ERR_IO, "%s: no such file or folder", in);
  qm_ctx c = {&p, json_object(), NULL, NULL, stats, in};
  if (!c.per_layer) return rlm__err_nomem(err, "quantize", 0);
  if ((rc = rlm__pool_create(&c.pool, p.n_threads, err))) {
    json_decref(c.per_layer);
    return rc;
  }
  if (rlm__path_is_dir(in)) {
    rc = quantize_folder(in, out, &c, err);
  } else {
    char *weights = rlm__path_is_dir(out) ? rlm__path_join(out, "model.safetensors") : rlm__strdup(out);
    rc = weights ? write_weights(in, weights, &c, err) : rlm__err_nomem(err, "path", 0);
    rlm__free(weights);
  }
  rlm__pool_free(c.pool);
  json_decref(c.per_layer);
  return rc;
}
