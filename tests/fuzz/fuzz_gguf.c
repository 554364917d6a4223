/* fuzz_gguf.c -- the GGUF reader: one image in memory. Every tensor an
 * accepted file lists must lie inside it: its first and last bytes are
 * read, so ASan sees any pointer past the buffer. Every key is read back:
 * found by name, rendered through the public call (which walks strings,
 * numbers and nested arrays), through the typed getter of its type, and
 * element by element if it is an array. Then the vocabulary and the chat
 * template are built from the metadata (model/gguf_tok.c), and a built
 * tokenizer encodes and decodes a short text. */
#include "fuzz.h"
#include "model/gguf.h"
#include "model/gguf_tok.h"

static volatile uint8_t g_sink;

/* Reads every element of a, nested arrays included. */
static void touch_array(const rlm_gguf_array *a) {
  for (uint64_t i = 0; i < a->n; i++) {
    rlm_gguf_kv e;
    if (a->type == RLM_GGUF_TYPE_STRING) g_sink ^= (uint8_t)a->strs[i].s[a->strs[i].n]; /* NUL */
    else if (a->type == RLM_GGUF_TYPE_ARRAY) touch_array(&a->arrs[i]);
    else if (rlm__gguf_arr_elem(a, i, &e)) g_sink ^= (uint8_t)e.v.u;
    else abort(); /* a fixed-size element the reader cannot decode */
  }
}

/* The getter of the key's own type must succeed. */
static void get_typed(const rlm_gguf *g, const rlm_gguf_kv *kv) {
  uint32_t u32;
  uint64_t u64;
  const char *s;
  const rlm_gguf_array *a;
  rlm_status rc = RLM_OK;
  switch (kv->type) {
  case RLM_GGUF_TYPE_UINT32: rc = rlm__gguf_get_u32(g, kv->key, &u32, NULL); break;
  case RLM_GGUF_TYPE_UINT64: rc = rlm__gguf_get_u64(g, kv->key, &u64, NULL); break;
  case RLM_GGUF_TYPE_STRING: rc = rlm__gguf_get_str(g, kv->key, &s, NULL, NULL); break;
  case RLM_GGUF_TYPE_ARRAY:
    rc = rlm__gguf_get_array(g, kv->key, kv->v.a.type, &a, NULL);
    if (!rc) touch_array(a);
    break;
  default: (void)rlm__gguf_get_uint(g, kv->key, UINT64_MAX, &u64, NULL); break;
  }
  if (rc) abort();
}

static void touch(const rlm_gguf *g) {
  char value[256];
  for (size_t i = 0; i < rlm__gguf_kv_count(g); i++) {
    const rlm_gguf_kv *kv = rlm__gguf_kv_at(g, i);
    rlm_gguf_key_info info;
    if (rlm__gguf_kv_find(g, kv->key) != kv) abort(); /* keys are unique and indexed */
    if (rlm_gguf_key_get(g, i, &info, value, sizeof value, NULL) || strlen(value) >= sizeof value)
      abort();
    get_typed(g, kv);
  }
  for (size_t i = 0; i < rlm__gguf_tensor_count(g); i++) {
    const rlm_gguf_tensor *t = rlm__gguf_tensor_at(g, i);
    const uint8_t *d = t->data;
    g_sink ^= d[0] ^ d[t->nbytes - 1];
    if (rlm__gguf_tensor_find(g, t->name) != t) abort(); /* names are unique and indexed */
  }
}

/* The tokenizer.* keys as a tokenizer and a template: any status, no crash. */
static void vocabulary(const rlm_gguf *g) {
  rlm_tokenizer *tok = NULL;
  if (!rlm__gguf_tokenizer(g, &tok, NULL)) {
    int32_t ids[64];
    size_t n = 0, len = 0;
    char text[256];
    if (!rlm_tokenize(tok, "The jury said <s> 42 \xc3\xa9t\xc3\xa9.", 20, true, ids, 64, &n, NULL))
      (void)rlm_detokenize(tok, ids, n, false, text, sizeof text, &len, NULL);
    rlm_tokenizer_free(tok);
  }
  rlm_chat_template *t = NULL;
  if (!rlm__gguf_chat_template(g, &t, NULL)) rlm_chat_template_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  rlm_gguf *g = NULL;
  if (!rlm__gguf_open_memory(&g, "fuzz", data, size, NULL)) {
    touch(g);
    vocabulary(g);
  }
  rlm__gguf_free(g);
  return 0;
}
