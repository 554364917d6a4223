/* fuzz_tokenizer.c -- tokenizer.json (the part before the first NUL)
 * loaded, then the rest encoded, decoded again, and read as token ids
 * (two bytes each) decoded, also by the streaming detokenizer. */
#include "fuzz.h"

enum { MAX_IDS = 4096 };

static void decode_ids(const rlm_tokenizer *t, const int32_t *ids, size_t n) {
  size_t need = 0; /* cap 0 asks for the size */
  rlm_detokenize(t, ids, n, false, NULL, 0, &need, NULL);
  char *buf = malloc(need + 1);
  if (buf) rlm_detokenize(t, ids, n, false, buf, need + 1, &need, NULL);
  free(buf);
  rlm_detok_stream *s = NULL;
  if (rlm_detok_stream_create(&s, t, false, NULL)) return;
  char piece[256];
  for (size_t i = 0; i < n; i++) {
    size_t len = 0;
    rlm_detok_stream_push(s, ids[i], piece, sizeof piece, &len, NULL);
  }
  rlm_detok_stream_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *text;
  size_t n_text;
  char *json = fuzz_split(data, size, &text, &n_text);
  const char *dir = fuzz_dir();
  char path[256];
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  rlm_tokenizer *t = NULL;
  if (json && fuzz_write(dir, "tokenizer.json", json, strlen(json)) && !rlm_tokenizer_load(&t, path, NULL)) {
    static int32_t ids[MAX_IDS];
    size_t n = 0;
    if (rlm_tokenize(t, (const char *)text, n_text, true, ids, MAX_IDS, &n, NULL) == RLM_OK) decode_ids(t, ids, n);
    const int32_t vocab = rlm_tokenizer_vocab_size(t);
    size_t m = 0;
    for (size_t i = 0; i + 1 < n_text && m < MAX_IDS; i += 2)
      ids[m++] = (int32_t)((text[i] | text[i + 1] << 8) % (vocab > 0 ? vocab + 2 : 1)) - 1; /* -1, vocab: bad */
    decode_ids(t, ids, m);
  }
  rlm_tokenizer_free(t);
  free(json);
  return 0;
}
