/* fuzz_kv_state.c -- rlm_kv_state_restore on hostile images. The first
 * byte picks the cache the image is restored into (kind, sinks, bits);
 * the rest is the image, whose trailing FNV-1a checksum the target
 * recomputes so that inputs reach past it to the fields. A restored cache
 * must then work: one decode step, a trim and a temporal view. */
#include "fuzz.h"
#include "fuzz_kv.h"

static void exercise(rlm_kv *kv) {
  static float k[2 * 2 * 32], v[2 * 2 * 32], q[2 * 4 * 32], out[2 * 4 * 32];
  for (int i = 0; i < 2 * 2 * 32; i++) k[i] = v[i] = (float)(i % 7) * 0.1f;
  for (int i = 0; i < 2 * 4 * 32; i++) q[i] = (float)(i % 5) * 0.1f;
  if (rlm_kv_rows(kv) > 2) return; /* the batch buffers above hold two rows */
  rlm_kv_batch b = {1, k, v, q, 4, 0.2f, NULL, out};
  if (rlm_kv_append_decode(kv, &b, NULL) == RLM_OK) rlm_kv_trim(kv, 1, NULL);
  int64_t slots[64], n = 0;
  rlm_kv_temporal_view(kv, 0, slots, 64, &n, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  rlm_kv *kv = fuzz_kv_make(data[0]);
  if (!kv) return 0;
  size_t n = size - 1;
  uint8_t *img = malloc(n + 1);
  if (img) {
    memcpy(img, data + 1, n);
    if (n >= 8) {
      uint64_t h = rlm__fnv1a64(RLM_FNV_START, img, n - 8);
      memcpy(img + n - 8, &h, 8);
    }
    if (rlm_kv_state_restore(kv, img, n, NULL) == RLM_OK) exercise(kv);
  }
  free(img);
  rlm_kv_free(kv);
  return 0;
}
