/* config.c -- config.json to rlm_model_config. Reads both the transformers
 * 5 spelling ("rope_parameters") and the older one ("rope_theta" +
 * "rope_scaling"), the text_config of a multimodal config, and mlx-lm's
 * "quantization" entry.
 *
 * Every value that reaches the model is checked here, because a bad one
 * otherwise surfaces far away (a zero rope_theta or a negative
 * rms_norm_eps runs and yields NaN logits; a zero hidden_size looks like a
 * head mismatch). Each error is one line naming config.json, the field
 * (nested ones dotted: "rope_parameters.full_attention.rope_theta"), the
 * value and what would be accepted. Bad values are RLM_ERR_FORMAT; values
 * that are well-formed but name a feature ringlm lacks (a model_type, a
 * rope_type, a layer type) are RLM_ERR_UNSUPPORTED. */
#include "model/model.h"

#include <jansson.h>
#include <math.h>

enum { CFG_INT_MAX = 1 << 30 }; /* dimensions above this are corruption */

static const struct {
  const char *name;
  rlm_arch arch;
} archs[] = {{"llama", RLM_ARCH_LLAMA},
              {"qwen3", RLM_ARCH_QWEN3},
              {"mistral", RLM_ARCH_MISTRAL},
              {"gemma3_text", RLM_ARCH_GEMMA3},
              {"gemma3", RLM_ARCH_GEMMA3},
              {"gemma4_text", RLM_ARCH_GEMMA4},
              {"gemma4", RLM_ARCH_GEMMA4}};

/* ---- typed fields --------------------------------------------------------- */

/* "where.key" into buf (just key when where is NULL): the field's name in
 * messages. */
static const char *field_name(char *buf, size_t n, const char *where, const char *key) {
  if (!where) return key;
  snprintf(buf, n, "%s.%s", where, key);
  return buf;
}

static rlm_status int_range_err(const char *path, const char *name, double v, int64_t lo,
                                int64_t hi, rlm_error *err) {
  if (lo == 1 && v <= 0)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: %s is %.0f: it must be positive", path, name, v);
  return rlm__err(err, RLM_ERR_FORMAT, "%s: %s %.0f is out of range [%lld, %lld]", path, name, v,
                  (long long)lo, (long long)hi);
}

/* An integer field `name` (o's key `key`) in [lo, hi]. Absent or null
 * leaves *out alone, or is an error when required. An integral real is
 * taken as well: a config.json holding one integer beyond 64 bits is read
 * with every integer as a real (rlm__json_load_buf). */
static rlm_status get_i64(const json_t *o, const char *key, const char *name, int64_t lo,
                          int64_t hi, bool required, int64_t *out, const char *path,
                          rlm_error *err) {
  const json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) {
    if (required) return rlm__err(err, RLM_ERR_FORMAT, "%s: missing \"%s\"", path, name);
    return RLM_OK;
  }
  const double d = json_number_value(v);
  if (!json_is_number(v) || d != floor(d))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: %s is not an integer", path, name);
  if (json_is_integer(v)) {
    const json_int_t i = json_integer_value(v);
    if (i < lo || i > hi) return int_range_err(path, name, (double)i, lo, hi, err);
    *out = i;
    return RLM_OK;
  }
  if (d < (double)lo || d > (double)hi) return int_range_err(path, name, d, lo, hi, err);
  *out = (int64_t)d;
  return RLM_OK;
}

static rlm_status get_int(const json_t *o, const char *key, const char *name, int lo, int hi,
                          bool required, int *out, const char *path, rlm_error *err) {
  int64_t v = *out;
  rlm_status rc = get_i64(o, key, name ? name : key, lo, hi, required, &v, path, err);
  *out = (int)v;
  return rc;
}

/* A positive finite number, or dflt when absent or null. JSON has no NaN
 * or infinity, but a huge literal is finite and still useless. */
static rlm_status get_pos(const json_t *o, const char *key, const char *where, double dflt,
                          double *out, const char *path, rlm_error *err) {
  char buf[128];
  const char *name = field_name(buf, sizeof buf, where, key);
  const json_t *v = json_object_get(o, key);
  *out = dflt;
  if (!v || json_is_null(v)) return RLM_OK;
  if (!json_is_number(v))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: %s is not a number", path, name);
  *out = json_number_value(v);
  if (!(*out > 0) || !isfinite(*out))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: %s is %g: it must be a positive number", path, name,
                    *out);
  return RLM_OK;
}

/* ---- architecture and dimensions ------------------------------------------ */

static rlm_status parse_arch(rlm_model_config *c, const json_t *o, const char *path,
                             rlm_error *err) {
  const char *t = json_string_value(json_object_get(o, "model_type"));
  if (!t) return rlm__err(err, RLM_ERR_FORMAT, "%s: missing \"model_type\"", path);
  snprintf(c->model_type, sizeof c->model_type, "%s", t);
  for (size_t i = 0; i < sizeof archs / sizeof *archs; i++)
    if (!strcmp(t, archs[i].name)) {
      c->arch = archs[i].arch;
      return RLM_OK;
    }
  return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: unknown or unsupported model_type \"%s\"", path,
                  t);
}

/* The dimensions every architecture has, each positive. */
static rlm_status parse_sizes(rlm_model_config *c, const json_t *o, const char *path,
                              rlm_error *err) {
  rlm_status rc;
  if ((rc = get_int(o, "vocab_size", NULL, 1, CFG_INT_MAX, true, &c->vocab, path, err)) ||
      (rc = get_int(o, "hidden_size", NULL, 1, CFG_INT_MAX, true, &c->hidden, path, err)) ||
      (rc = get_int(o, "intermediate_size", NULL, 1, CFG_INT_MAX, true, &c->inter, path, err)) ||
      (rc = get_int(o, "num_hidden_layers", NULL, 1, CFG_INT_MAX, true, &c->n_layers, path,
                    err)) ||
      (rc = get_int(o, "num_attention_heads", NULL, 1, CFG_INT_MAX, true, &c->n_heads, path,
                    err)))
    return rc;
  if (c->n_layers > RLM_MAX_LAYERS)
    return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: num_hidden_layers %d: at most %d layers",
                    path, c->n_layers, RLM_MAX_LAYERS);
  return RLM_OK;
}

/* Heads and head_dim: kv heads divide the heads; head_dim (hidden_size /
 * num_attention_heads when absent, as in transformers) is even because
 * RoPE rotates pairs. */
static rlm_status parse_heads(rlm_model_config *c, const json_t *o, const char *path,
                              rlm_error *err) {
  rlm_status rc;
  c->n_kv_heads = c->n_heads;
  c->head_dim = 0;
  if ((rc = get_int(o, "num_key_value_heads", NULL, 1, CFG_INT_MAX, false, &c->n_kv_heads, path,
                    err)) ||
      (rc = get_int(o, "head_dim", NULL, 1, CFG_INT_MAX, false, &c->head_dim, path, err)))
    return rc;
  if (c->n_heads % c->n_kv_heads)
    return rlm__err(err, RLM_ERR_FORMAT,
                    "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", path,
                    c->n_heads, c->n_kv_heads);
  if (!c->head_dim && !(c->head_dim = c->hidden / c->n_heads))
    return rlm__err(err, RLM_ERR_FORMAT,
                    "%s: head_dim is not given and hidden_size %d / num_attention_heads %d is 0",
                    path, c->hidden, c->n_heads);
  if (c->head_dim % 2)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: head_dim %d must be even (RoPE rotates pairs)",
                    path, c->head_dim);
  return RLM_OK;
}

/* sliding_window: a positive width, or null/absent for none. Qwen 3 and
 * Llama never slide (Qwen 3's window is gated by use_sliding_window, off
 * in every release), so theirs is ignored. */
static rlm_status parse_window(rlm_model_config *c, const json_t *o, const char *path,
                               rlm_error *err) {
  c->sliding_window = 0;
  if (c->arch == RLM_ARCH_QWEN3 || c->arch == RLM_ARCH_LLAMA) return RLM_OK;
  return get_int(o, "sliding_window", NULL, 1, CFG_INT_MAX, false, &c->sliding_window, path,
                 err);
}

static rlm_status parse_dims(rlm_model_config *c, const json_t *o, const char *path,
                             rlm_error *err) {
  rlm_status rc;
  if ((rc = parse_sizes(c, o, path, err)) || (rc = parse_heads(c, o, path, err)) ||
      (rc = parse_window(c, o, path, err)))
    return rc;
  c->gemma = c->arch == RLM_ARCH_GEMMA3 || c->arch == RLM_ARCH_GEMMA4;
  c->norm_plus_one = c->arch == RLM_ARCH_GEMMA3;
  /* 0: not given. Only informative (a caller warns when a prompt is
   * longer), so a value past 2^53 -- exporters write 1e30 for "no limit"
   * in tokenizer configs -- counts as not given rather than refusing. */
  int64_t max_pos = 0;
  const double huge = 0x1p53;
  if (json_number_value(json_object_get(o, "max_position_embeddings")) > huge) return RLM_OK;
  rc = get_i64(o, "max_position_embeddings", "max_position_embeddings", 0, (int64_t)huge, false,
               &max_pos, path, err);
  c->max_positions = max_pos;
  return rc;
}

/* ---- RoPE ----------------------------------------------------------------- */

/* llama3 scaling: the wavelength bounds original_max / {low, high}_freq_factor
 * must be ordered, or the smoothing between them divides by zero. */
static rlm_status parse_llama3(rlm_rope *r, const json_t *rp, const char *where,
                               const char *path, rlm_error *err) {
  char buf[128];
  rlm_status rc;
  r->kind = RLM_ROPE_LLAMA3;
  if ((rc = get_pos(rp, "low_freq_factor", where, 1.0, &r->low_freq_factor, path, err)) ||
      (rc = get_pos(rp, "high_freq_factor", where, 4.0, &r->high_freq_factor, path, err)) ||
      (rc = get_pos(rp, "original_max_position_embeddings", where, 8192, &r->original_max_pos,
                    path, err)))
    return rc;
  if (!(r->high_freq_factor > r->low_freq_factor))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: %s %g must be greater than low_freq_factor %g",
                    path, field_name(buf, sizeof buf, where, "high_freq_factor"),
                    r->high_freq_factor, r->low_freq_factor);
  return RLM_OK;
}

/* One RoPE description {"rope_type", "rope_theta", "factor", ...} named
 * `where` in messages; theta is the top-level rope_theta (its default). */
static rlm_status parse_rope_obj(rlm_rope *r, const json_t *rp, double theta, const char *where,
                                 const char *path, rlm_error *err) {
  char buf[128];
  memset(r, 0, sizeof *r);
  rlm_status rc = get_pos(rp, "rope_theta", where, theta, &r->theta, path, err);
  if (rc) return rc;
  const char *type = json_string_value(json_object_get(rp, "rope_type"));
  if (!type) type = json_string_value(json_object_get(rp, "type"));
  if (!type || !strcmp(type, "default")) return RLM_OK;
  if ((rc = get_pos(rp, "factor", where, 1.0, &r->factor, path, err))) return rc;
  if (!strcmp(type, "linear")) {
    r->kind = RLM_ROPE_LINEAR;
  } else if (!strcmp(type, "proportional")) {
    r->kind = RLM_ROPE_PROPORTIONAL;
    if ((rc = get_pos(rp, "partial_rotary_factor", where, 1.0, &r->partial, path, err)))
      return rc;
    if (r->partial > 1)
      return rlm__err(err, RLM_ERR_FORMAT, "%s: %s %g is outside (0, 1]", path,
                      field_name(buf, sizeof buf, where, "partial_rotary_factor"), r->partial);
  } else if (!strcmp(type, "llama3")) {
    return parse_llama3(r, rp, where, path, err);
  } else {
    return rlm__err(err, RLM_ERR_UNSUPPORTED,
                    "%s: %s \"%s\" is not supported (supported: default, linear, llama3, "
                    "proportional)", path, field_name(buf, sizeof buf, where, "rope_type"), type);
  }
  return RLM_OK;
}

/* RoPE: rope_parameters (transformers 5; per layer type for Gemma) or the
 * older rope_theta + rope_scaling (+ rope_local_base_freq). */
static rlm_status parse_rope(rlm_model_config *c, const json_t *o, const char *path,
                             rlm_error *err) {
  const char *where = "rope_parameters";
  const json_t *rp = json_object_get(o, where);
  if (!json_is_object(rp)) {
    where = "rope_scaling";
    rp = json_object_get(o, where);
  }
  double theta;
  rlm_status rc = get_pos(o, "rope_theta", NULL, 10000.0, &theta, path, err);
  if (rc) return rc;
  const json_t *full = json_object_get(rp, "full_attention");
  const json_t *local = json_object_get(rp, "sliding_attention");
  char w_full[64], w_local[64];
  snprintf(w_full, sizeof w_full, "%s.full_attention", where);
  snprintf(w_local, sizeof w_local, "%s.sliding_attention", where);
  if (json_is_object(full))
    rc = parse_rope_obj(&c->rope, full, theta, w_full, path, err);
  else
    rc = parse_rope_obj(&c->rope, rp, theta, where, path, err);
  if (rc) return rc;
  if (json_is_object(local))
    return parse_rope_obj(&c->rope_local, local, theta, w_local, path, err);
  c->rope_local = c->rope;
  if (c->arch == RLM_ARCH_GEMMA3) { /* older configs: a plain local base */
    memset(&c->rope_local, 0, sizeof c->rope_local);
    return get_pos(o, "rope_local_base_freq", NULL, 10000.0, &c->rope_local.theta, path, err);
  }
  return RLM_OK;
}

/* ---- layer types ---------------------------------------------------------- */

/* layer_types[i]: "sliding_attention" or "full_attention". */
static rlm_status layer_type(rlm_model_config *c, const json_t *lt, int i, const char *path,
                             rlm_error *err) {
  const json_t *v = json_array_get(lt, (size_t)i);
  const char *t = json_string_value(v);
  if (!t)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: layer_types[%d] is not a string (accepted: "
                    "\"full_attention\", \"sliding_attention\")", path, i);
  if (strcmp(t, "sliding_attention") && strcmp(t, "full_attention"))
    return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: layer_types[%d] is \"%s\" (accepted: "
                    "\"full_attention\", \"sliding_attention\")", path, i, t);
  c->sliding[i] = !strcmp(t, "sliding_attention");
  return RLM_OK;
}

/* A sliding layer needs a window: Gemma's layers always name theirs, and
 * an explicit "sliding_attention" does too; Mistral's implicit all-sliding
 * with a null window means no window (v0.2 and later). */
static rlm_status check_window(const rlm_model_config *c, bool listed, const char *path,
                               rlm_error *err) {
  for (int i = 0; i < c->n_layers && !c->sliding_window; i++)
    if (c->sliding[i] && (listed || c->gemma))
      return rlm__err(err, RLM_ERR_FORMAT, "%s: layer %d slides (%s) but sliding_window is not "
                      "given", path, i, listed ? "layer_types" : "Gemma's pattern");
  return RLM_OK;
}

/* Which layers slide: "layer_types" when given, else Gemma 3's 5 local :
 * 1 global, mistral's all, none for the others. */
static rlm_status parse_layer_types(rlm_model_config *c, const json_t *o, const char *path,
                                    rlm_error *err) {
  const json_t *lt = json_object_get(o, "layer_types");
  bool listed = lt && !json_is_null(lt);
  if (listed && !json_is_array(lt))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: layer_types is not an array", path);
  if (listed && json_array_size(lt) != (size_t)c->n_layers)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: \"layer_types\" has %zu entries for %d layers",
                    path, json_array_size(lt), c->n_layers);
  for (int i = 0; i < c->n_layers; i++) {
    rlm_status rc = listed ? layer_type(c, lt, i, path, err) : RLM_OK;
    if (rc) return rc;
    if (!listed) c->sliding[i] = c->arch == RLM_ARCH_MISTRAL || (c->gemma && i % 6 != 5);
  }
  if (c->arch == RLM_ARCH_GEMMA4) c->sliding[c->n_layers - 1] = false; /* transformers forces it */
  if (c->arch == RLM_ARCH_QWEN3 || c->arch == RLM_ARCH_LLAMA) listed = false; /* never slide */
  rlm_status rc = check_window(c, listed, path, err);
  if (!c->sliding_window)
    for (int i = 0; i < c->n_layers; i++) c->sliding[i] = false;
  return rc;
}

/* ---- norms, scales, softcaps ---------------------------------------------- */

/* A logit softcap: positive, or null/absent for none (transformers divides
 * by it whenever it is not None, so 0 is not "off"). */
static rlm_status get_softcap(const json_t *o, const char *key, double *out, const char *path,
                              rlm_error *err) {
  rlm_status rc = get_pos(o, key, NULL, 0.0, out, path, err);
  if (rc && json_is_number(json_object_get(o, key)))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: %s is %g: it must be positive (null: no softcap)",
                    path, key, json_number_value(json_object_get(o, key)));
  return rc;
}

static rlm_status parse_scales(rlm_model_config *c, const json_t *o, const char *path,
                               rlm_error *err) {
  double qpas = c->head_dim, attn_cap = 0;
  rlm_status rc;
  if ((rc = get_pos(o, "rms_norm_eps", NULL, 1e-6, &c->rms_eps, path, err)) ||
      (rc = get_softcap(o, "final_logit_softcapping", &c->final_softcap, path, err)) ||
      (rc = get_softcap(o, "attn_logit_softcapping", &attn_cap, path, err)))
    return rc;
  if (attn_cap) /* Gemma 2's; Gemma 3 configs carry it as null */
    return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: attn_logit_softcapping %g is not supported "
                    "(null: none)", path, attn_cap);
  if (c->arch == RLM_ARCH_GEMMA3 &&
      (rc = get_pos(o, "query_pre_attn_scalar", NULL, c->head_dim, &qpas, path, err)))
    return rc;
  c->attn_scale = c->arch == RLM_ARCH_GEMMA4 ? 1.0 : 1.0 / sqrt(qpas);
  return RLM_OK;
}

static rlm_status parse_misc(rlm_model_config *c, const json_t *o, const char *path,
                             rlm_error *err) {
  const json_t *tie = json_object_get(o, "tie_word_embeddings");
  if (tie && !json_is_null(tie) && !json_is_boolean(tie))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: tie_word_embeddings is neither true nor false", path);
  c->tie_embeddings = json_is_boolean(tie) ? json_is_true(tie) : c->gemma;
  const char *dt = json_string_value(json_object_get(o, "dtype"));
  if (!dt) dt = json_string_value(json_object_get(o, "torch_dtype"));
  c->dtype = RLM_DTYPE_BF16;
  if (dt && !strcmp(dt, "float32")) c->dtype = RLM_DTYPE_F32;
  if (dt && !strcmp(dt, "float16")) c->dtype = RLM_DTYPE_F16;
  return RLM_OK;
}

/* ---- per-layer shapes ----------------------------------------------------- */

/* Layer i's head dim (even) and kv heads (dividing the heads), read from
 * the fields named hd_name and kv_name. */
static rlm_status check_layer(const rlm_model_config *c, int i, const char *hd_name,
                              const char *kv_name, const char *path, rlm_error *err) {
  if (c->layer_head_dim[i] % 2)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: %s %d (layer %d) must be even (RoPE rotates "
                    "pairs)", path, hd_name, c->layer_head_dim[i], i);
  if (c->n_heads % c->layer_kv_heads[i])
    return rlm__err(err, RLM_ERR_FORMAT, "%s: num_attention_heads %d is not a multiple of %s %d "
                    "(layer %d)", path, c->n_heads, kv_name, c->layer_kv_heads[i], i);
  return RLM_OK;
}

/* Gemma 4 full layer i from per_layer_config {"<i>": {"head_dim", ...}}. */
static rlm_status plc_layer(rlm_model_config *c, const json_t *plc, int i, const char *path,
                            rlm_error *err) {
  char key[16], hd[64], kv[64];
  snprintf(key, sizeof key, "%d", i);
  const json_t *l = json_object_get(plc, key);
  snprintf(hd, sizeof hd, "per_layer_config.%d.head_dim", i);
  snprintf(kv, sizeof kv, "per_layer_config.%d.num_key_value_heads", i);
  rlm_status rc;
  if ((rc = get_int(l, "head_dim", hd, 1, CFG_INT_MAX, false, &c->layer_head_dim[i], path,
                    err)) ||
      (rc = get_int(l, "num_key_value_heads", kv, 1, CFG_INT_MAX, false, &c->layer_kv_heads[i],
                    path, err)))
    return rc;
  return check_layer(c, i, json_object_get(l, "head_dim") ? hd : "head_dim",
                     json_object_get(l, "num_key_value_heads") ? kv : "num_key_value_heads", path,
                     err);
}

/* Per-layer head dims, KV heads and MLP widths. Gemma 4's full layers
 * take theirs from "per_layer_config" (transformers 5) or from
 * "global_head_dim" / "num_global_key_value_heads" (older configs;
 * transformers' default global head dim is 512). */
static rlm_status parse_layer_shapes(rlm_model_config *c, const json_t *o, const char *path,
                                     rlm_error *err) {
  const json_t *plc = json_object_get(o, "per_layer_config");
  int g_hd = 512, g_kv = 0;
  rlm_status rc;
  if ((rc = get_int(o, "global_head_dim", NULL, 1, CFG_INT_MAX, false, &g_hd, path, err)) ||
      (rc = get_int(o, "num_global_key_value_heads", NULL, 1, CFG_INT_MAX, false, &g_kv, path,
                    err)))
    return rc;
  const char *g_kv_name = c->k_eq_v && g_kv ? "num_global_key_value_heads" : "num_key_value_heads";
  for (int i = 0; i < c->n_layers && !rc; i++) {
    c->layer_head_dim[i] = c->head_dim, c->layer_kv_heads[i] = c->n_kv_heads;
    if (c->arch != RLM_ARCH_GEMMA4 || c->sliding[i]) continue;
    if (json_is_object(plc)) {
      rc = plc_layer(c, plc, i, path, err);
      continue;
    }
    c->layer_head_dim[i] = g_hd;
    if (c->k_eq_v && g_kv) c->layer_kv_heads[i] = g_kv;
    rc = check_layer(c, i, "global_head_dim", g_kv_name, path, err);
  }
  for (int i = 0; i < c->n_layers && !rc; i++) {
    c->max_head_dim = RLM_MAX(c->max_head_dim, c->layer_head_dim[i]);
    c->max_kv_heads = RLM_MAX(c->max_kv_heads, c->layer_kv_heads[i]);
  }
  return rc;
}

/* ---- Gemma 4 -------------------------------------------------------------- */

/* The MoE block's sizes: 1..1024 experts, 1..num_experts of them per
 * token, a positive expert width. */
static rlm_status parse_moe(rlm_model_config *c, const json_t *o, const char *path,
                            rlm_error *err) {
  rlm_status rc;
  if ((rc = get_int(o, "num_experts", NULL, 1, 1024, true, &c->n_experts, path, err)) ||
      (rc = get_int(o, "top_k_experts", NULL, 1, c->n_experts, true, &c->top_k_experts, path,
                    err)) ||
      (rc = get_int(o, "moe_intermediate_size", NULL, 1, CFG_INT_MAX, true, &c->moe_inter, path,
                    err)))
    return rc;
  return RLM_OK;
}

/* KV sharing: the last num_kv_shared_layers layers attend the cache of the
 * last earlier layer of their type, and may have a double-wide MLP. */
static rlm_status parse_kv_sharing(rlm_model_config *c, const json_t *o, const char *path,
                                   rlm_error *err) {
  int shared = 0;
  rlm_status rc = get_int(o, "num_kv_shared_layers", NULL, 0, c->n_layers, false, &shared, path,
                          err);
  if (rc) return rc;
  const int first = c->n_layers - shared;
  const bool wide = json_is_true(json_object_get(o, "use_double_wide_mlp"));
  for (int i = first; i < c->n_layers; i++) {
    for (int j = first - 1; j >= 0 && c->kv_donor[i] < 0; j--)
      if (c->sliding[j] == c->sliding[i]) c->kv_donor[i] = j;
    if (c->kv_donor[i] < 0)
      return rlm__err(err, RLM_ERR_FORMAT, "%s: num_kv_shared_layers %d: KV-shared layer %d has "
                      "no earlier layer of its type", path, shared, i);
    if (wide && first > 0) c->layer_inter[i] = 2 * c->inter;
  }
  return RLM_OK;
}

/* Gemma 4: KV sharing, per-layer inputs, k_eq_v, the MoE block. Refuses
 * bidirectional attention (embedding models). */
static rlm_status parse_gemma4(rlm_model_config *c, const json_t *o, const char *path,
                               rlm_error *err) {
  for (int i = 0; i < c->n_layers; i++) c->kv_donor[i] = -1, c->layer_inter[i] = c->inter;
  if (c->arch != RLM_ARCH_GEMMA4) return RLM_OK;
  const json_t *bidi = json_object_get(o, "use_bidirectional_attention");
  if (json_is_string(bidi) && !strcmp(json_string_value(bidi), "all"))
    return rlm__err(err, RLM_ERR_UNSUPPORTED, "%s: use_bidirectional_attention \"all\" is not "
                    "supported", path);
  c->v_norm = true;
  c->k_eq_v = json_is_true(json_object_get(o, "attention_k_eq_v"));
  rlm_status rc;
  if (json_is_true(json_object_get(o, "enable_moe_block")) && (rc = parse_moe(c, o, path, err)))
    return rc;
  c->ple_vocab = c->vocab;
  if ((rc = get_int(o, "hidden_size_per_layer_input", NULL, 0, CFG_INT_MAX, false, &c->ple_dim,
                    path, err)) ||
      (rc = get_int(o, "vocab_size_per_layer_input", NULL, 1, CFG_INT_MAX, false, &c->ple_vocab,
                    path, err)))
    return rc;
  return parse_kv_sharing(c, o, path, err);
}

/* mlx-lm's "quantization": {"group_size", "bits"}; 0 when absent. The
 * loader binds each matrix by the shapes it finds, so these are only
 * informative. */
static void parse_quant(rlm_model_config *c, const json_t *o) {
  const json_t *q = json_object_get(o, "quantization");
  c->q_bits = (int)json_integer_value(json_object_get(q, "bits"));
  c->q_group = (int)json_integer_value(json_object_get(q, "group_size"));
}

static rlm_status parse_all(rlm_model_config *c, const json_t *o, const char *path,
                            rlm_error *err) {
  rlm_status rc;
  if ((rc = parse_arch(c, o, path, err)) || (rc = parse_dims(c, o, path, err)) ||
      (rc = parse_rope(c, o, path, err)) || (rc = parse_layer_types(c, o, path, err)) ||
      (rc = parse_scales(c, o, path, err)))
    return rc;
  if ((rc = parse_misc(c, o, path, err)) || (rc = parse_gemma4(c, o, path, err)) ||
      (rc = parse_layer_shapes(c, o, path, err)))
    return rc;
  for (int i = 0; i < c->n_layers; i++) c->max_inter = RLM_MAX(c->max_inter, c->layer_inter[i]);
  return RLM_OK;
}

rlm_status rlm__config_parse(rlm_model_config *c, const json_t *o, const char *path, rlm_error *err) {
  memset(c, 0, sizeof *c);
  rlm_status rc = parse_all(c, o, path, err);
  if (!rc) parse_quant(c, o);
  return rc;
}

rlm_status rlm__config_load(rlm_model_config *c, const char *dir, rlm_error *err) {
  memset(c, 0, sizeof *c);
  char *path = rlm__path_join(dir, "config.json");
  if (!path) return rlm__err_nomem(err, "path", 0);
  json_t *root = NULL;
  rlm_status rc = rlm__json_load_file(path, &root, err);
  if (rc) goto out_free_path;
  const json_t *o = json_object_get(root, "text_config");
  if (!json_is_object(o)) o = root;
  if (!json_is_object(o)) {
    rc = rlm__err(err, RLM_ERR_FORMAT, "%s: not a JSON object", path);
    goto out_free_json;
  }
  rc = parse_all(c, o, path, err);
  if (!rc) parse_quant(c, json_object_get(o, "quantization") ? o : root); /* mlx-lm: top level */
out_free_json:
  json_decref(root);
out_free_path:
  rlm__free(path);
  return rc;
}
