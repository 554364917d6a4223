/* json.c -- JSON through jansson, with errors that name the file and the
 * line/column, as every config and tokenizer parser needs; jansson's
 * allocations routed through the library's counter (see base.h). */
#include "base.h"

#include <jansson.h>
#include <string.h>

/* At load, before any jansson object of ours exists. rlm__malloc is
 * malloc underneath, so objects the host made before stay freeable. */
__attribute__((constructor)) static void json_route_allocations(void) {
  json_set_alloc_funcs(rlm__malloc, rlm__free);
}

void *rlm_json_loadb(const char *buf, size_t len, size_t flags, void *error, bool *nomem) {
  json_error_t local, *je = error ? error : &local;
  const uint64_t before = rlm_alloc_failures();
  rlm__alloc_soft(true);
  json_t *j = json_loadb(buf, len, flags, je);
  rlm__alloc_soft(false);
  *nomem = rlm_alloc_failures() != before;
  if (*nomem) {
    json_decref(j);
    snprintf(je->text, sizeof je->text, "out of memory");
    return NULL;
  }
  return j;
}

json_t *rlm__json_parse(const char *buf, size_t len, size_t flags, json_error_t *je, bool *nomem) {
  return rlm_json_loadb(buf, len, flags, je, nomem);
}

char *rlm__json_dumps(const json_t *j, size_t flags) {
  const uint64_t before = rlm_alloc_failures();
  char *s = j ? json_dumps(j, flags) : NULL;
  if (s && rlm_alloc_failures() != before) {
    rlm__free(s);
    s = NULL;
  }
  return s;
}

rlm_status rlm__json_load_buf(const char *buf, size_t len, const char *what,
                              json_t **out, rlm_error *err) {
  json_error_t je;
  bool nomem;
  *out = rlm__json_parse(buf, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je, &nomem);
  /* Llama 3's tokenizer_config.json has model_max_length 1e30 written as
   * an integer, beyond jansson's: such a file is read with every integer
   * as a real (readers that need integers then say which key is wrong). */
  if (!*out && !nomem && strstr(je.text, "too big integer"))
    *out = rlm__json_parse(buf, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL,
                           &je, &nomem);
  if (nomem) return rlm__err(err, RLM_ERR_NOMEM, "%s: out of memory parsing JSON", what);
  if (!*out)
    return rlm__err(err, RLM_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s",
                    what, je.line, je.column, je.text);
  return RLM_OK;
}

rlm_status rlm__json_load_file(const char *path, json_t **out, rlm_error *err) {
  *out = NULL;
  char *buf;
  size_t len;
  rlm_status rc = rlm__file_read_all(path, &buf, &len, err);
  if (rc) return rc;
  rc = rlm__json_load_buf(buf, len, path, out, err);
  rlm__free(buf);
  return rc;
}

rlm_status rlm__json_save_file(const json_t *j, const char *path,
                               rlm_error *err) {
  char *s = rlm__json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
  if (!s) return rlm__err(err, RLM_ERR_NOMEM, "%s: cannot serialise JSON", path);
  rlm_file_writer w;
  rlm_status rc = rlm__writer_open(&w, path, err);
  if (rc) goto out_free_text;
  size_t n = strlen(s);
  s[n] = 0;
  if ((rc = rlm__writer_write(&w, s, n, err)) || (rc = rlm__writer_write(&w, "\n", 1, err))) {
    rlm__writer_abort(&w);
    goto out_free_text;
  }
  rc = rlm__writer_commit(&w, err);
out_free_text:
  rlm__free(s);
  return rc;
}

void rlm__json_free(json_t *j) { json_decref(j); }
