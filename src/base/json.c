/* json.c -- JSON through jansson, with errors that name the file and the
 * line/column, as every config and tokenizer parser needs. */
#include "base.h"

#include <jansson.h>
#include <string.h>

rlm_status rlm__json_load_buf(const char *buf, size_t len, const char *what,
                              json_t **out, rlm_error *err) {
  json_error_t je;
  *out = json_loadb(buf, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
  /* Llama 3's tokenizer_config.json has model_max_length 1e30 written as
   * an integer, beyond jansson's: such a file is read with every integer
   * as a real (readers that need integers then say which key is wrong). */
  if (!*out && strstr(je.text, "too big integer"))
    *out = json_loadb(buf, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
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
  char *s = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
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
  free(s); /* jansson's allocator */
  return rc;
}

void rlm__json_free(json_t *j) { json_decref(j); }
