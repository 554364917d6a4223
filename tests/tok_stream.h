/* tok_stream.h -- a test helper shared by the tokenizer tests: the
 * streaming decoder's whole output for a list of ids. Include after
 * test.h and tokenizer/tok.h. */
#ifndef RLM_TEST_TOK_STREAM_H
#define RLM_TEST_TOK_STREAM_H

/* The streaming decoder's output for ids, concatenated (malloc'd, *len its
 * length). Checks that every push emits whole UTF-8 characters only. */
static char *stream_decode(const rlm_tokenizer *t, const int32_t *ids, size_t n, bool skip, size_t *len) {
  rlm_detok_stream *s;
  rlm_error err = {0};
  CHECK_EQ(rlm_detok_stream_create(&s, t, skip, &err), RLM_OK);
  size_t cap = 64, total = 0;
  char *all = malloc(cap);
  for (size_t i = 0; i < n; i++) {
    char piece[1024];
    size_t k = 0;
    CHECK_EQ(rlm_detok_stream_push(s, ids[i], piece, sizeof piece, &k, &err), RLM_OK);
    CHECK(rlm__utf8_valid(piece, k));
    while (total + k + 1 > cap) all = realloc(all, cap *= 2);
    memcpy(all + total, piece, k);
    total += k;
  }
  all[total] = 0;
  *len = total;
  rlm_detok_stream_free(s);
  return all;
}

#endif /* RLM_TEST_TOK_STREAM_H */
