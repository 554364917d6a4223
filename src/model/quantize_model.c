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
 * "quantization_config" = {"group_size", "bits", "mode": "affine"} added
 * to the input's text (every other byte kept), and every other plain file
 * (tokenizer, generation config) copied. Shard indexes are not copied: the
 * output is one file.
 *
 * The output appears whole or not at all (see "where the output goes"):
 * never over the input, never merged into an existing folder.
 */
#include "model/safetensors.h"
#include "quant/quant.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

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
                               .n_threads = 0, .overwrite = false};
}

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

static bool ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* The index of the first override whose match the name contains, or -1. */
static int override_for(const rlm_quantize_params *p, const char *name) {
  for (int i = 0; i < p->n_overrides; i++)
    if (strstr(name, p->overrides[i].match)) return i;
  return -1;
}

/* A matrix quantization may touch: a 2-D float "*.weight" that is not a norm. */
static bool is_matrix(const rlm_st_tensor *t) {
  return t->ndim == 2 && rlm__dtype_is_float(t->dtype) && ends_with(t->name, ".weight") &&
         !strstr(t->name, "norm");
}

/* Whether t is quantized, and with which bits and group size; counts the
 * override that matched it first. */
static bool should_quantize(qm_ctx *c, const rlm_st_tensor *t, int *bits, int *gs) {
  const rlm_quantize_params *p = c->p;
  if (!is_matrix(t)) return false;
  int io = override_for(p, t->name);
  const rlm_quantize_override *o = io >= 0 ? &p->overrides[io] : NULL;
  if (o) c->stats->n_override_hits[io]++;
  if (!p->quantize_embeddings && strstr(t->name, "embed")) return false;
  *bits = o ? o->bits : p->bits;
  *gs = o && o->group_size ? o->group_size : p->group_size;
  return *bits && t->shape[1] > 0 && t->shape[1] % *gs == 0;
}

/* Notes a tensor an override touched under its layer prefix. */
static rlm_status note_layer(qm_ctx *c, const char *name, int bits, int gs, rlm_error *err) {
  if (override_for(c->p, name) < 0) return RLM_OK;
  char prefix[1024];
  snprintf(prefix, sizeof prefix, "%.*s", (int)(strlen(name) - strlen(".weight")), name);
  json_t *v = bits ? json_pack("{s:i, s:i}", "group_size", gs, "bits", bits) : json_false();
  if (!v || json_object_set_new(c->per_layer, prefix, v))
    return rlm__err_nomem(err, "config.json", 0);
  return RLM_OK;
}

/* One more tensor quantized as (bits, gs), for the summary. */
static void count_format(rlm_quantize_stats *s, int bits, int gs) {
  int i = 0;
  while (i < s->n_formats && (s->formats[i].bits != bits || s->formats[i].group_size != gs)) i++;
  if (i == N_OF(s->formats)) return; /* unreachable: check_params allows 6 x 3 */
  if (i == s->n_formats) s->formats[s->n_formats++] = (rlm_quantize_format){bits, gs, 0};
  s->formats[i].n_tensors++;
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

static rlm_status quantize_tensor(qm_ctx *c, const rlm_st_tensor *t, int bits, int gs,
                                  rlm_error *err) {
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
  count_format(c->stats, bits, gs);
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
  bool q = should_quantize(c, t, &bits, &gs);
  rlm_status rc = ends_with(t->name, ".weight") && t->ndim == 2
                      ? note_layer(c, t->name, q ? bits : 0, gs, err)
                      : RLM_OK;
  if (rc) return rc;
  if (q) return quantize_tensor(c, t, bits, gs, err);
  if (is_matrix(t)) c->stats->n_kept_dense++;
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

/* ---- config.json, edited as text ---------------------------------------
 * jansson re-spells every real it reads (1e-05 comes out as
 * 1.0000000000000001e-05), and people and other tools read these files, so
 * the output is the input's text with only "quantization" inserted after
 * the last top-level member, and "quantization_config" inserted too or its
 * value replaced. The scanner below walks the top-level members of text
 * that jansson has already parsed (so it is valid JSON); the edited text is
 * parsed again and every other member compared with the input's before it
 * is written. New entries are laid out like the file: on their own lines
 * with its indent, or on one line.
 * ---------------------------------------------------------------------- */

typedef struct cfg_text {
  const char *s;
  size_t n;
  size_t end;              /* just past the last member's value, or the '{' */
  size_t qc_begin, qc_end; /* the value of "quantization_config"; 0, 0: none */
  size_t indent;           /* spaces before the first key (0: one line)       */
  bool empty;              /* no member at all                                */
} cfg_text;

static size_t skip_ws(const cfg_text *t, size_t i) {
  while (i < t->n && (t->s[i] == ' ' || t->s[i] == '\t' || t->s[i] == '\r' || t->s[i] == '\n'))
    i++;
  return i;
}

/* Past the string that opens at s[i] ('"'). */
static size_t skip_string(const cfg_text *t, size_t i) {
  for (i++; i < t->n && t->s[i] != '"'; i++)
    if (t->s[i] == '\\') i++;
  return i < t->n ? i + 1 : t->n;
}

/* Past the value that starts at s[i]. */
static size_t skip_value(const cfg_text *t, size_t i) {
  if (i < t->n && t->s[i] == '"') return skip_string(t, i);
  if (i < t->n && t->s[i] != '{' && t->s[i] != '[') {
    while (i < t->n && !strchr(",}] \t\r\n", t->s[i])) i++;
    return i;
  }
  for (int depth = 0; i < t->n;) {
    char ch = t->s[i];
    if (ch == '"') {
      i = skip_string(t, i);
      continue;
    }
    i++;
    if (ch == '{' || ch == '[') depth++;
    else if ((ch == '}' || ch == ']') && --depth == 0) return i;
  }
  return t->n;
}

/* Spaces between the start of key's line and key; 0 if key shares a line. */
static size_t indent_of(const cfg_text *t, size_t from, size_t key) {
  size_t j = key;
  while (j > from && t->s[j - 1] == ' ') j--;
  return j > from && t->s[j - 1] == '\n' ? key - j : 0;
}

static void scan_members(cfg_text *t) {
  static const char qc[] = "\"quantization_config\"";
  size_t i = skip_ws(t, 0) + 1; /* past '{' */
  t->end = i;
  t->empty = true;
  for (;;) {
    size_t k = skip_ws(t, i);
    if (k >= t->n || t->s[k] != '"') return;
    if (t->empty) t->indent = indent_of(t, i, k);
    size_t ke = skip_string(t, k);
    size_t v = skip_ws(t, skip_ws(t, ke) + 1); /* past ':' */
    t->end = skip_value(t, v);
    t->empty = false;
    if (ke - k == sizeof qc - 1 && !memcmp(t->s + k, qc, sizeof qc - 1)) {
      t->qc_begin = v;
      t->qc_end = t->end;
    }
    i = skip_ws(t, t->end);
    if (i >= t->n || t->s[i] != ',') return;
    i++;
  }
}

/* A growing output text; `failed` once an allocation failed. */
typedef struct text_buf {
  char *p;
  size_t n, cap;
  bool failed;
} text_buf;

static void tb_put(text_buf *b, const char *s, size_t n) {
  if (b->failed) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = (b->n + n + 1) * 2;
    char *p = rlm__realloc(b->p, cap);
    if (!p) {
      b->failed = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

static void tb_spaces(text_buf *b, size_t n) {
  for (size_t i = 0; i < n; i++) tb_put(b, " ", 1);
}

/* Whether new members go on lines of their own (jansson indents by <= 31). */
static bool on_lines(const cfg_text *t) { return t->indent > 0 && t->indent < 32; }

/* v as JSON, laid out like a top-level member's value of the file. */
static void tb_value(text_buf *b, const cfg_text *t, const json_t *v) {
  char *d = rlm__json_dumps(v, on_lines(t) ? JSON_INDENT(t->indent) : 0);
  if (!d) {
    b->failed = true;
    return;
  }
  for (const char *s = d; *s; s++) {
    tb_put(b, s, 1);
    if (*s == '\n') tb_spaces(b, t->indent);
  }
  rlm__free(d);
}

/* A new `"key": value` member after a separator, on its own line or not. */
static void tb_member(text_buf *b, const cfg_text *t, const char *key, const json_t *v) {
  tb_put(b, on_lines(t) ? "\n" : " ", 1);
  tb_spaces(b, on_lines(t) ? t->indent : 0);
  tb_put(b, "\"", 1);
  tb_put(b, key, strlen(key));
  tb_put(b, "\": ", 3);
  tb_value(b, t, v);
}

/* The input text with q as "quantization" and "quantization_config". */
static void edit_text(text_buf *b, const cfg_text *t, const json_t *q) {
  size_t upto = t->qc_end ? t->qc_begin : t->end;
  tb_put(b, t->s, upto);
  if (t->qc_end) {
    tb_value(b, t, q);
    tb_put(b, t->s + t->qc_end, t->end - t->qc_end);
  }
  if (!t->empty) tb_put(b, ",", 1);
  tb_member(b, t, "quantization", q);
  if (!t->qc_end) {
    tb_put(b, ",", 1);
    tb_member(b, t, "quantization_config", q);
  }
  tb_put(b, t->s + t->end, t->n - t->end);
}

/* The edited text parses, has both entries, and every other member of cfg
 * unchanged; proof that only the quantization entries were touched. */
static rlm_status check_edit(const json_t *cfg, const text_buf *b, const char *path,
                             rlm_error *err) {
  json_t *got;
  rlm_error e2;
  if (rlm__json_load_buf(b->p, b->n, "the edited text", &got, &e2))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: cannot add \"quantization\": %s", path, e2.msg);
  bool had_qc = json_object_get(cfg, "quantization_config") != NULL;
  bool ok = json_object_size(got) == json_object_size(cfg) + (had_qc ? 1 : 2) &&
            json_is_object(json_object_get(got, "quantization")) &&
            json_is_object(json_object_get(got, "quantization_config"));
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)cfg, key, v) {
    if (strcmp(key, "quantization_config") && !json_equal(v, json_object_get(got, key)))
      ok = false;
  }
  json_decref(got);
  if (!ok)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: cannot add \"quantization\" without changing other "
                    "entries (unusual key spelling?)", path);
  return RLM_OK;
}

/* mlx-lm's entry: the defaults, then each overridden layer. */
static json_t *quant_entry(const rlm_quantize_params *p, json_t *per_layer) {
  json_t *q = json_pack("{s:i, s:i, s:s}", "group_size", p->group_size, "bits", p->bits, "mode",
                        "affine");
  if (q && json_object_update(q, per_layer)) {
    json_decref(q);
    return NULL;
  }
  return q;
}

static rlm_status save_text(const char *path, const text_buf *b, rlm_error *err) {
  rlm_file_writer w;
  rlm_status rc = rlm__writer_open(&w, path, err);
  if (rc) return rc;
  if ((rc = rlm__writer_write(&w, b->p, b->n, err))) {
    rlm__writer_abort(&w);
    return rc;
  }
  return rlm__writer_commit(&w, err);
}

/* The input config's text `s` (parsed as cfg) plus q, saved to out. */
static rlm_status write_edited(const char *in, const char *out, const char *s, size_t n,
                               const json_t *cfg, const json_t *q, rlm_error *err) {
  cfg_text t = {.s = s, .n = n};
  text_buf b = {0};
  scan_members(&t);
  edit_text(&b, &t, q);
  rlm_status rc = b.failed ? rlm__err_nomem(err, out, b.cap) : check_edit(cfg, &b, in, err);
  if (!rc) rc = save_text(out, &b, err);
  rlm__free(b.p);
  return rc;
}

/* The config's text and its parse; refuses a non-object or a quantized one. */
static rlm_status read_config(const char *in, char **text, size_t *n, json_t **cfg,
                              rlm_error *err) {
  rlm_status rc = rlm__file_read_all(in, text, n, err);
  if (rc) return rc;
  if ((rc = rlm__json_load_buf(*text, *n, in, cfg, err))) return rc;
  if (!json_is_object(*cfg)) return rlm__err(err, RLM_ERR_FORMAT, "%s: not a JSON object", in);
  if (json_object_get(*cfg, "quantization"))
    return rlm__err(err, RLM_ERR_INVALID, "%s: the model is already quantized", in);
  return RLM_OK;
}

static rlm_status write_config(const char *in_dir, const char *out_dir,
                               const rlm_quantize_params *p, json_t *per_layer, rlm_error *err) {
  char *in = rlm__path_join(in_dir, "config.json"), *out = rlm__path_join(out_dir, "config.json");
  char *text = NULL;
  size_t n = 0;
  json_t *cfg = NULL, *q = NULL;
  rlm_status rc = RLM_OK;
  if (!in || !out) {
    rc = rlm__err_nomem(err, "path", 0);
    goto out_free_paths;
  }
  if (!rlm__path_exists(in)) goto out_free_paths; /* a bare weights folder */
  if ((rc = read_config(in, &text, &n, &cfg, err))) goto out_free_config;
  if (!(q = quant_entry(p, per_layer))) {
    rc = rlm__err_nomem(err, "config.json", 0);
    goto out_free_config;
  }
  rc = write_edited(in, out, text, n, cfg, q, err);
out_free_config:
  json_decref(q);
  json_decref(cfg);
  rlm__free(text);
out_free_paths:
  rlm__free(in);
  rlm__free(out);
  return rc;
}

/* ---- the folder around the weights ------------------------------------ */

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

/* Everything the output folder holds, written into the (new, empty) dir. */
static rlm_status fill_folder(const char *in, const char *dir, qm_ctx *c, rlm_error *err) {
  char *weights = rlm__path_join(dir, "model.safetensors");
  if (!weights) return rlm__err_nomem(err, "path", 0);
  rlm_status rc = write_weights(in, weights, c, err);
  if (!rc) rc = write_config(in, dir, c->p, c->per_layer, err);
  if (!rc) rc = copy_side_files(in, dir, err);
  rlm__free(weights);
  return rc;
}

/* ---- where the output goes ---------------------------------------------
 * The output appears whole or not at all. A folder is built in a fresh
 * sibling "<OUT>.tmp.<pid>.<n>" (the same filesystem, so the last step is
 * one rename) and renamed into place; any failure removes that folder. A
 * single file goes through the atomic writer (temp file + rename). An
 * existing output is refused unless overwrite; then the new one takes its
 * place in one atomic swap once complete, and the old one is removed after.
 * The output must not be the input (same device and inode), lie inside it
 * (a later run would read it as input files) or contain it (replacing it
 * would delete the input): each is checked on real paths and inodes, so
 * symlinks, "..", hard links and bind mounts do not hide it.
 * ---------------------------------------------------------------------- */

#ifndef RENAME_NOREPLACE /* a libc without renameat2: rename_flags says ENOSYS */
#define RENAME_NOREPLACE (1u << 0)
#define RENAME_EXCHANGE (1u << 1)
#endif

static int rename_flags(const char *from, const char *to, unsigned flags) {
#if defined(__linux__) && defined(__GLIBC__)
  return renameat2(AT_FDCWD, from, AT_FDCWD, to, flags);
#else
  (void)from;
  (void)to;
  (void)flags;
  errno = ENOSYS;
  return -1;
#endif
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)ftw;
  if (flag == FTW_DP) rmdir(path);
  else unlink(path);
  return 0; /* keep going: remove all that can be */
}

/* rm -rf without following symlinks or crossing into other filesystems. */
static void remove_tree(const char *path) {
  if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) != 0)
    RLM_LOGW("%s: could not remove it all: %s", path, strerror(errno));
}

static bool same_file(const struct stat *a, const struct stat *b) {
  return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* Whether the real path `dir`, or a folder above it, is the file `anc`. */
static bool path_within(const char *dir, const struct stat *anc) {
  char buf[PATH_MAX];
  size_t n = (size_t)snprintf(buf, sizeof buf, "%s", dir);
  for (struct stat st;;) {
    if (stat(buf, &st) == 0 && same_file(&st, anc)) return true;
    if (n <= 1 || n >= sizeof buf) return false;
    while (n > 1 && buf[n - 1] != '/') n--; /* drop the last component */
    if (n > 1) n--;                          /* and its slash, unless root */
    buf[n] = 0;
  }
}

/* The real path of the folder that holds `path` (libc malloc), or NULL. */
static char *real_parent(const char *path) {
  char *copy = rlm__strdup(path);
  if (!copy) return NULL;
  char *slash = strrchr(copy, '/');
  if (slash == copy) slash[1] = 0;
  else if (slash) *slash = 0;
  char *real = realpath(slash ? copy : ".", NULL);
  rlm__free(copy);
  return real;
}

/* Refuses an output that is the input, inside it or around it, whose
 * folder does not exist, or that exists (unless overwrite). */
static rlm_status check_output(const char *in, const char *target, bool overwrite,
                               rlm_error *err) {
  struct stat si, so, sl;
  if (stat(in, &si) != 0) return rlm__err(err, RLM_ERR_IO, "%s: no such file or folder", in);
  char *parent = real_parent(target), *rin = realpath(in, NULL);
  bool exists = lstat(target, &sl) == 0, resolves = stat(target, &so) == 0;
  rlm_status rc = RLM_OK;
  if (!parent)
    rc = rlm__err(err, RLM_ERR_IO, "%s: its folder does not exist: %s", target, strerror(errno));
  else if (!rin)
    rc = rlm__err(err, RLM_ERR_IO, "%s: cannot resolve the path: %s", in, strerror(errno));
  else if (resolves && same_file(&si, &so))
    rc = rlm__err(err, RLM_ERR_INVALID, "%s: is the input %s itself; choose another output",
                  target, in);
  else if (path_within(parent, &si))
    rc = rlm__err(err, RLM_ERR_INVALID, "%s: lies inside the input %s; choose another output",
                  target, in);
  else if (resolves && S_ISDIR(so.st_mode) && path_within(rin, &so))
    rc = rlm__err(err, RLM_ERR_INVALID, "%s: contains the input %s; choose another output",
                  target, in);
  else if (exists && !overwrite)
    rc = rlm__err(err, RLM_ERR_INVALID, "%s: already exists (--force replaces it)", target);
  free(parent); /* realpath's malloc */
  free(rin);
  return rc;
}

/* A fresh folder beside target, made with mkdir's mode (umask applies). */
static rlm_status make_temp_dir(const char *target, char **tmp, rlm_error *err) {
  size_t n = strlen(target) + 48;
  if (!(*tmp = rlm__malloc(n))) return rlm__err_nomem(err, target, n);
  for (int i = 0; i < 1000; i++) {
    snprintf(*tmp, n, "%s.tmp.%ld.%d", target, (long)getpid(), i);
    if (mkdir(*tmp, 0755) == 0) return RLM_OK;
    if (errno != EEXIST) break;
  }
  rlm_status rc = rlm__err(err, RLM_ERR_IO, "%s: cannot create a folder beside it: %s", target,
                           strerror(errno));
  rlm__free(*tmp);
  *tmp = NULL;
  return rc;
}

/* Without an atomic swap: the old output aside, the new in, the old gone. */
static rlm_status replace_by_renames(const char *tmp, const char *target, rlm_error *err) {
  size_t n = strlen(tmp) + 8;
  char *old = rlm__malloc(n);
  if (!old) return rlm__err_nomem(err, tmp, n);
  snprintf(old, n, "%s.old", tmp);
  rlm_status rc = RLM_OK;
  if (rename(target, old) != 0) {
    rc = rlm__err(err, RLM_ERR_IO, "%s: cannot move it aside: %s", target, strerror(errno));
  } else if (rename(tmp, target) != 0) {
    rc = rlm__err(err, RLM_ERR_IO, "%s: cannot rename %s into place: %s", target, tmp,
                  strerror(errno));
    rename(old, target); /* put the old output back */
  } else {
    remove_tree(old);
  }
  rlm__free(old);
  return rc;
}

/* The finished folder tmp becomes target; an existing target (overwrite
 * only) is swapped out atomically and then removed. */
static rlm_status move_into_place(const char *tmp, const char *target, bool overwrite,
                                  rlm_error *err) {
  struct stat st;
  bool exists = lstat(target, &st) == 0;
  if (exists && !overwrite) /* appeared while we worked */
    return rlm__err(err, RLM_ERR_INVALID, "%s: already exists (--force replaces it)", target);
  unsigned flags = exists ? RENAME_EXCHANGE : RENAME_NOREPLACE;
  if (rename_flags(tmp, target, flags) == 0) {
    if (exists) remove_tree(tmp); /* the swap left the old output there */
    return RLM_OK;
  }
  if (errno == EEXIST)
    return rlm__err(err, RLM_ERR_INVALID, "%s: already exists (--force replaces it)", target);
  if (errno != EINVAL && errno != ENOSYS) /* not the filesystem lacking the flag */
    return rlm__err(err, RLM_ERR_IO, "%s: cannot rename %s into place: %s", target, tmp,
                    strerror(errno));
  if (exists) return replace_by_renames(tmp, target, err);
  if (rename(tmp, target) == 0) return RLM_OK;
  return rlm__err(err, RLM_ERR_IO, "%s: cannot rename %s into place: %s", target, tmp,
                  strerror(errno));
}

static rlm_status quantize_folder(const char *in, const char *target, qm_ctx *c,
                                  rlm_error *err) {
  char *tmp;
  rlm_status rc = make_temp_dir(target, &tmp, err);
  if (rc) return rc;
  rc = fill_folder(in, tmp, c, err);
  if (!rc) rc = move_into_place(tmp, target, c->p->overwrite, err);
  if (rc) remove_tree(tmp);
  rlm__free(tmp);
  return rc;
}

/* The path the output takes: `out` without trailing slashes ("q/" names q,
 * not an entry in it), or out/model.safetensors for a file put into an
 * existing folder. */
static char *output_path(const char *in, const char *out) {
  size_t n = strlen(out);
  while (n > 1 && out[n - 1] == '/') n--;
  char *o = rlm__malloc(n + 1);
  if (!o) return NULL;
  memcpy(o, out, n);
  o[n] = 0;
  if (rlm__path_is_dir(in) || !rlm__path_is_dir(o)) return o;
  char *t = rlm__path_join(o, "model.safetensors");
  rlm__free(o);
  return t;
}

/* ---------------------------------------------------------------------- */

static rlm_status check_params(const rlm_quantize_params *p, rlm_error *err) {
  if (!rlm__quant_bits_ok(p->bits))
    return rlm__err(err, RLM_ERR_INVALID, "quantize: --bits %d: must be 2, 3, 4, 5, 6 or 8",
                    p->bits);
  if (!rlm__quant_group_ok(p->group_size))
    return rlm__err(err, RLM_ERR_INVALID, "quantize: --group-size %d: must be 32, 64 or 128",
                    p->group_size);
  if (p->n_overrides < 0 || p->n_overrides > RLM_QUANTIZE_MAX_OVERRIDES ||
      (p->n_overrides && !p->overrides))
    return rlm__err(err, RLM_ERR_INVALID, "quantize: %d overrides (at most %d)", p->n_overrides,
                    RLM_QUANTIZE_MAX_OVERRIDES);
  for (int i = 0; i < p->n_overrides; i++) {
    const rlm_quantize_override *o = &p->overrides[i];
    if (!o->match || !o->match[0] || (o->bits && !rlm__quant_bits_ok(o->bits)) ||
        (o->group_size && !rlm__quant_group_ok(o->group_size)))
      return rlm__err(err, RLM_ERR_INVALID, "quantize: override '%s' has bits %d, group size %d",
                      o->match ? o->match : "", o->bits, o->group_size);
  }
  return RLM_OK;
}

static rlm_status quantize_to(const char *in, const char *target, qm_ctx *c, rlm_error *err) {
  rlm_status rc = check_output(in, target, c->p->overwrite, err);
  if (rc) return rc;
  if ((rc = rlm__pool_create(&c->pool, c->p->n_threads, err))) return rc;
  if (rlm__path_is_dir(in)) rc = quantize_folder(in, target, c, err);
  else rc = write_weights(in, target, c, err); /* the atomic writer: all or nothing */
  rlm__pool_free(c->pool);
  c->pool = NULL;
  return rc;
}

rlm_status rlm_quantize_model(const char *in, const char *out,
                              const rlm_quantize_params *params,
                              rlm_quantize_stats *stats, rlm_error *err) {
  rlm_quantize_params p = params ? *params : rlm_quantize_params_default();
  rlm_quantize_stats st_local;
  if (!stats) stats = &st_local;
  memset(stats, 0, sizeof *stats);
  if (!in || !out || !out[0])
    return rlm__err(err, RLM_ERR_INVALID, "quantize: missing input or output path");
  rlm_status rc = check_params(&p, err);
  if (rc) return rc;
  if (!rlm__path_exists(in)) return rlm__err(err, RLM_ERR_IO, "%s: no such file or folder", in);
  qm_ctx c = {&p, json_object(), NULL, NULL, stats, in};
  char *target = output_path(in, out);
  if (!c.per_layer || !target) rc = rlm__err_nomem(err, "quantize", 0);
  else rc = quantize_to(in, target, &c, err);
  rlm__free(target);
  json_decref(c.per_layer);
  return rc;
}
