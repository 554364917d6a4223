/* chat.c -- the chat-template API of ringlm.h: compiling a Hugging Face
 * chat template, loading one with its special tokens from a model folder
 * as transformers does, and rendering a conversation given as JSON. The
 * engine is jinja*.c (read jinja.h first).
 *
 * What a template sees, as apply_chat_template passes it: bos_token,
 * eos_token, pad_token and unk_token from tokenizer_config.json (when
 * set), the caller's extra variables (which may override them), tools and
 * documents (None unless given), messages and add_generation_prompt.
 * (From a GGUF file, gguf_tok.c sets bos_token and eos_token from the
 * token ids, as llama.cpp does.)
 */
#include "chat/jinja.h"

#include <jansson.h>

#define N_SPECIAL 4
static const char *const k_special[N_SPECIAL] = {"bos_token", "eos_token", "pad_token", "unk_token"};

struct rlm_chat_template {
  rlm_arena arena;                /* the source, its strings and the tree  */
  jj_nodes body;
  const char *special[N_SPECIAL]; /* token text, NULL when not configured  */
  size_t special_n[N_SPECIAL];
};

static rlm_chat_template *template_new(rlm_error *err) {
  rlm_chat_template *t = rlm__calloc(1, sizeof *t);
  if (!t) {
    rlm__err_nomem(err, "chat template", sizeof *t);
    return NULL;
  }
  rlm__arena_init(&t->arena, 64 << 10);
  return t;
}

void rlm_chat_template_free(rlm_chat_template *t) {
  if (!t) return;
  rlm__arena_free(&t->arena);
  rlm__free(t);
}

/* what names the source in messages ("chat template", or the file). */
static rlm_status compile(rlm_chat_template *t, const char *src, size_t len, const char *what,
                          rlm_error *err) {
  size_t bad;
  if (len > JJ_MAX_SOURCE)
    return rlm__err(err, RLM_ERR_INVALID, "%s is larger than %u MiB", what, JJ_MAX_SOURCE >> 20);
  if (!rlm__jj_utf8_valid(src, len, &bad))
    return rlm__err(err, RLM_ERR_FORMAT, "%s is not valid UTF-8 (byte %zu)", what, bad);
  jj_token *toks;
  size_t n;
  rlm_status rc = rlm__jj_lex(&t->arena, src, len, what, &toks, &n, err);
  if (rc) return rc;
  jj_parser p = {.t = toks, .arena = &t->arena, .err = err, .what = what};
  rc = rlm__jj_parse(&p, &t->body);
  rlm__free(toks);
  return rc;
}

rlm_status rlm__chat_template_parse_named(rlm_chat_template **out, const char *src, size_t len,
                                          const char *what, rlm_error *err) {
  if (!out) return rlm__err(err, RLM_ERR_INVALID, "rlm_chat_template_parse: out is NULL");
  *out = NULL;
  if (!src && len) return rlm__err(err, RLM_ERR_INVALID, "rlm_chat_template_parse: src is NULL");
  rlm_chat_template *t = template_new(err);
  if (!t) return RLM_ERR_NOMEM;
  rlm_status rc = compile(t, src ? src : "", len, what, err);
  if (rc) {
    rlm_chat_template_free(t);
    return rc;
  }
  *out = t;
  return RLM_OK;
}

rlm_status rlm_chat_template_parse(rlm_chat_template **out, const char *src, size_t len,
                                   rlm_error *err) {
  return rlm__chat_template_parse_named(out, src, len, "chat template", err);
}

rlm_status rlm__chat_template_set_special(rlm_chat_template *t, const char *name, const char *s, size_t n,
                                          rlm_error *err) {
  for (int i = 0; i < N_SPECIAL; i++) {
    if (strcmp(k_special[i], name)) continue;
    char *copy = rlm__arena_strndup(&t->arena, s, n);
    if (!copy) return rlm__err_nomem(err, "special token", n);
    t->special[i] = copy;
    t->special_n[i] = n;
    return RLM_OK;
  }
  return rlm__err(err, RLM_ERR_INVALID, "chat template: '%s' is not a special-token variable", name);
}

/* ------------------------------------------------------------------------
 * Loading from a model folder.
 * ---------------------------------------------------------------------- */

/* bos_token & co.: a string, or an AddedToken object {"content": ...}. */
static rlm_status read_special(rlm_chat_template *t, const json_t *cfg, rlm_error *err) {
  for (int i = 0; i < N_SPECIAL; i++) {
    const json_t *v = json_object_get(cfg, k_special[i]);
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) continue;
    t->special_n[i] = json_string_length(v);
    t->special[i] = rlm__arena_strndup(&t->arena, json_string_value(v), t->special_n[i]);
    if (!t->special[i]) return rlm__err_nomem(err, "special token", t->special_n[i]);
  }
  return RLM_OK;
}

/* chat_template: a string, or a list of {"name", "template"} of which we
 * take "default" (as transformers does when no name is asked for). */
static rlm_status pick_template(const json_t *cfg, const char *path, const json_t **src, rlm_error *err) {
  const json_t *v = json_object_get(cfg, "chat_template");
  *src = NULL;
  if (json_is_string(v)) *src = v;
  for (size_t i = 0; json_is_array(v) && i < json_array_size(v) && !*src; i++) {
    const json_t *e = json_array_get(v, i), *name = json_object_get(e, "name");
    if (json_is_string(name) && !strcmp(json_string_value(name), "default")) *src = json_object_get(e, "template");
  }
  if (json_is_array(v) && !json_is_string(*src))
    return rlm__err(err, RLM_ERR_NOT_FOUND, "%s: chat_template has no template named \"default\"", path);
  if (!*src && v && !json_is_null(v))
    return rlm__err(err, RLM_ERR_FORMAT, "%s: chat_template is neither a string nor a list of templates", path);
  return RLM_OK;
}

/* The template text: chat_template.jinja when present (it overrides the
 * config's, as in transformers), else the config's chat_template. */
static rlm_status load_source(rlm_chat_template *t, const char *dir, const char *cfg_path, const json_t *cfg,
                              rlm_error *err) {
  char *jinja = rlm__path_join(dir, "chat_template.jinja"), what[1100];
  if (!jinja) return rlm__err_nomem(err, "path", strlen(dir));
  rlm_status rc = RLM_OK;
  const json_t *src = NULL;
  if (rlm__path_exists(jinja)) {
    char *text;
    size_t len;
    if (!(rc = rlm__file_read_all(jinja, &text, &len, err))) {
      rc = compile(t, text, len, jinja, err);
      rlm__free(text);
    }
  } else if (cfg && !(rc = pick_template(cfg, cfg_path, &src, err)) && src) {
    snprintf(what, sizeof what, "%s: chat_template", cfg_path);
    rc = compile(t, json_string_value(src), json_string_length(src), what, err);
  } else if (!rc) {
    rc = rlm__err(err, RLM_ERR_NOT_FOUND, "%s: no chat_template (and no chat_template.jinja in %s)", cfg_path, dir);
  }
  rlm__free(jinja);
  return rc;
}

/* tokenizer_config.json may hold integers past 64 bits (Llama 3's
 * model_max_length is 1e30), which jansson refuses; read numbers as reals,
 * since only strings are used here. Duplicate keys: the last wins, as in
 * Python. */
static rlm_status load_config(const char *path, json_t **out, rlm_error *err) {
  char *text;
  size_t len;
  json_error_t je;
  bool nomem;
  rlm_status rc = rlm__file_read_all(path, &text, &len, err);
  if (rc) return rc;
  *out = rlm__json_parse(text, len, JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, &je, &nomem);
  rlm__free(text);
  if (nomem) return rlm__err(err, RLM_ERR_NOMEM, "%s: out of memory parsing JSON", path);
  if (!*out)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s", path, je.line, je.column,
                    je.text);
  if (json_is_object(*out)) return RLM_OK;
  json_decref(*out);
  *out = NULL;
  return rlm__err(err, RLM_ERR_FORMAT, "%s: not a JSON object", path);
}

/* rlm_chat_template_load (src/model/gguf_tok.c) for what is not a GGUF
 * file. */
rlm_status rlm__chat_template_load_hf(rlm_chat_template **out, const char *dir, rlm_error *err) {
  if (!out) return rlm__err(err, RLM_ERR_INVALID, "rlm_chat_template_load: out is NULL");
  *out = NULL;
  if (!dir) return rlm__err(err, RLM_ERR_INVALID, "rlm_chat_template_load: dir is NULL");
  if (!rlm__path_is_dir(dir)) return rlm__err(err, RLM_ERR_NOT_FOUND, "%s: no such folder", dir);
  char *cfg_path = rlm__path_join(dir, "tokenizer_config.json");
  if (!cfg_path) return rlm__err_nomem(err, "path", strlen(dir));
  json_t *cfg = NULL;
  rlm_chat_template *t = NULL;
  rlm_status rc = RLM_OK;
  if (rlm__path_exists(cfg_path)) rc = load_config(cfg_path, &cfg, err);
  if (!rc && !(t = template_new(err))) rc = RLM_ERR_NOMEM;
  if (!rc && cfg) rc = read_special(t, cfg, err);
  if (!rc) rc = load_source(t, dir, cfg_path, cfg, err);
  rlm__json_free(cfg);
  rlm__free(cfg_path);
  if (rc) {
    rlm_chat_template_free(t);
    return rc;
  }
  *out = t;
  return RLM_OK;
}

/* ------------------------------------------------------------------------
 * Rendering.
 * ---------------------------------------------------------------------- */

/* A JSON argument of the caller as a value; bad JSON is a bad argument. */
static rlm_status json_arg(jj_ctx *cx, const char *what, const char *text, json_type type, jj_value *out) {
  json_t *j;
  rlm_status rc = rlm__json_load_buf(text, strlen(text), what, &j, cx->err);
  if (rc == RLM_ERR_NOMEM) return rc;
  if (rc) {
    if (cx->err) cx->err->code = RLM_ERR_INVALID;
    return RLM_ERR_INVALID;
  }
  if (json_typeof(j) != type)
    rc = rlm__err(cx->err, RLM_ERR_INVALID, "%s is not a JSON %s", what, type == JSON_ARRAY ? "array" : "object");
  else
    rc = rlm__jj_from_json(cx, j, 0, out);
  json_decref(j);
  return rc;
}

static rlm_status add_extra(jj_ctx *cx, const char *extra_json) {
  jj_value extra;
  rlm_status rc = json_arg(cx, "extra_json", extra_json, JSON_OBJECT, &extra);
  for (size_t i = 0; !rc && i < extra.dict->n; i++) {
    jj_value k = extra.dict->keys[i];
    if (jj_str_eq(k, "messages") || jj_str_eq(k, "add_generation_prompt"))
      return rlm__err(cx->err, RLM_ERR_INVALID, "extra_json may not set \"%.*s\" (it is an argument)",
                      (int)k.s.n, k.s.p);
    rc = rlm__jj_dict_set(cx, cx->vars, k, extra.dict->vals[i]);
  }
  return rc;
}

static rlm_status make_vars(jj_ctx *cx, const rlm_chat_template *t, const char *messages_json,
                            const char *extra_json, bool add_generation_prompt) {
  jj_value messages, v;
  rlm_status rc = rlm__jj_dict_new(cx, 16, &cx->vars);
  for (int i = 0; !rc && i < N_SPECIAL; i++)
    if (t->special[i])
      rc = rlm__jj_dict_set(cx, cx->vars, jj_str(k_special[i], strlen(k_special[i])),
                            jj_str(t->special[i], t->special_n[i]));
  if (!rc && extra_json) rc = add_extra(cx, extra_json);
  if (!rc && !rlm__jj_dict_get(cx->vars, JJ_LIT("tools"), &v))
    rc = rlm__jj_dict_set(cx, cx->vars, JJ_LIT("tools"), jj_none());
  if (!rc && !rlm__jj_dict_get(cx->vars, JJ_LIT("documents"), &v))
    rc = rlm__jj_dict_set(cx, cx->vars, JJ_LIT("documents"), jj_none());
  if (!rc) rc = json_arg(cx, "messages_json", messages_json, JSON_ARRAY, &messages);
  if (!rc) rc = rlm__jj_dict_set(cx, cx->vars, JJ_LIT("messages"), messages);
  if (!rc) rc = rlm__jj_dict_set(cx, cx->vars, JJ_LIT("add_generation_prompt"), jj_bool(add_generation_prompt));
  return rc;
}

static rlm_status run(jj_ctx *cx, const rlm_chat_template *t, jj_buf *result) {
  jj_frame root = {0};
  rlm_status rc = rlm__jj_dict_new(cx, 16, &root.vars);
  if (rc) return rc;
  cx->frame = cx->root = &root;
  cx->out = result;
  rc = rlm__jj_exec_body(cx, &t->body);
  cx->frame = cx->root = NULL;
  /* an empty result still gets its (NUL-terminated) buffer */
  return rc ? rc : rlm__jj_buf_put(cx, result, "", 0);
}

rlm_status rlm_chat_template_render(const rlm_chat_template *t, const char *messages_json,
                                    const char *extra_json, bool add_generation_prompt, char **out,
                                    size_t *out_len, rlm_error *err) {
  if (out) *out = NULL;
  if (out_len) *out_len = 0;
  if (!t || !messages_json || !out)
    return rlm__err(err, RLM_ERR_INVALID, "rlm_chat_template_render: template, messages_json and out are required");
  jj_ctx cx = {.err = err, .stack0 = (uintptr_t)__builtin_frame_address(0)};
  jj_buf result = {0};
  rlm__arena_init(&cx.arena, 64 << 10);
  rlm_status rc = make_vars(&cx, t, messages_json, extra_json, add_generation_prompt);
  if (!rc) rc = run(&cx, t, &result);
  rlm__arena_free(&cx.arena);
  if (rc) {
    rlm__jj_buf_free(&result);
    return rc;
  }
  *out = result.p;
  if (out_len) *out_len = result.n;
  return RLM_OK;
}
