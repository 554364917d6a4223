/* fuzz_snapshot.c -- KV snapshot files (prompt caches) loaded into a row
 * of a live session of the gemma4_text fixture (sliding rings, a global
 * layer, KV-shared layers). The first byte picks the session (dense, or
 * 4-bit rings everywhere); the rest is the file, whose CRC-32C field the
 * target recomputes when it finds one, so that inputs reach the header
 * and layer checks. A loaded row must then decode a token; a refused one
 * must be untouched (row 0, never loaded into, is compared bit for bit
 * with a twin that saw no file). */
#include "fuzz.h"
#include "base/base.h"

enum { N_SESS = 2 };
static rlm_model *g_m;
static rlm_session *g_s[N_SESS], *g_twin[N_SESS];
static int32_t g_vocab;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  char dir[512];
  snprintf(dir, sizeof dir, "%s/tests/fixtures/models/gemma4_text", fuzz_src());
  rlm_error e;
  if (rlm_model_load(&g_m, dir, &e)) fprintf(stderr, "fuzz_snapshot: %s\n", e.msg), abort();
  g_vocab = rlm_model_vocab_size(g_m);
  for (int i = 0; i < N_SESS; i++) {
    rlm_session_params p = rlm_session_params_default();
    p.n_rows = 2, p.prefill_chunk = 8, p.kv_group_size = 32;
    if (i) p.k_bits = p.v_bits = 4, p.max_kv = 24;
    if (rlm_session_create(&g_s[i], g_m, &p, &e) || rlm_session_create(&g_twin[i], g_m, &p, &e))
      fprintf(stderr, "fuzz_snapshot: %s\n", e.msg), abort();
    const int32_t ids[5] = {1, 7, 9, 11, 3};
    rlm_session_eval(g_s[i], ids, 5, NULL, false, NULL);
    rlm_session_eval(g_twin[i], ids, 5, NULL, false, NULL);
  }
  return 0;
}

static void reseal(uint8_t *img, size_t n) {
  static const char key[] = "\"1.ringlm_crc32c\":\"";
  uint8_t *at = memmem(img, n, key, sizeof key - 1);
  if (!at || (size_t)(at - img) + sizeof key - 1 + 8 > n) return;
  at += sizeof key - 1;
  memcpy(at, "00000000", 8);
  char hex[9];
  snprintf(hex, sizeof hex, "%08x", rlm__crc32c(0, img, n));
  memcpy(at, hex, 8);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  rlm_session *s = g_s[data[0] % N_SESS], *twin = g_twin[data[0] % N_SESS];
  uint8_t *img = malloc(size);
  if (!img) return 0;
  memcpy(img, data + 1, size - 1);
  reseal(img, size - 1);
  rlm_snapshot *sn = NULL;
  if (!rlm_snapshot_open_memory(&sn, img, size - 1, NULL)) {
    int64_t nt;
    rlm_snapshot_tokens(sn, &nt);
    for (int i = 0; i < rlm_snapshot_layers(sn); i++) {
      rlm_snapshot_layer_info li;
      rlm_snapshot_layer(sn, i, &li, NULL);
    }
    if (!rlm_session_row_load(s, 1, sn, NULL)) {
      const int32_t id = 5;
      const int32_t rows[1] = {1};
      float *l = malloc(sizeof(float) * (size_t)g_vocab);
      if (l) rlm_session_decode(s, &(rlm_batch){1, &id, rows, NULL}, l, NULL);
      free(l);
    }
    rlm_session_row_clear(s, 1, NULL);
  }
  rlm_snapshot_free(sn);
  free(img);
  /* row 0 is as its twin's: a step on each gives the same logits (every
   * 64th input: two steps per input would halve the fuzzer's speed) */
  static unsigned calls;
  if (calls++ % 64) return 0;
  float *a = malloc(sizeof(float) * 2 * (size_t)g_vocab);
  if (a) {
    const int32_t id = 4;
    rlm_session_eval(s, &id, 1, a, false, NULL);
    rlm_session_eval(twin, &id, 1, a + g_vocab, false, NULL);
    if (memcmp(a, a + g_vocab, sizeof(float) * (size_t)g_vocab))
      fprintf(stderr, "fuzz_snapshot: row 0 changed\n"), abort();
    rlm_session_rollback(s, 0, 1, NULL);
    rlm_session_rollback(twin, 0, 1, NULL);
  }
  free(a);
  return 0;
}
