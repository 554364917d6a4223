/* make_seeds.c -- writes the seed corpus of fuzz_kv_state (one state image
 * of each cache fuzz_kv_state builds, after enough decode steps that the
 * rings wrap): make_seeds DIR. The images are committed under
 * corpus/kv_state; this tool is how they were made. */
#include "fuzz.h"
#include "fuzz_kv.h"

int main(int argc, char **argv) {
  if (argc != 2) return fprintf(stderr, "usage: make_seeds DIR\n"), 2;
  static float k[2 * 32], v[2 * 32], q[4 * 32], out[4 * 32];
  for (int sel = 0; sel < 32; sel++) {
    if ((sel & 16) && sel % 4 != RLM_KV_ROTATING_QUANT) continue; /* the same cache again */
    rlm_kv *kv = fuzz_kv_make((uint8_t)sel);
    if (!kv) return 1;
    for (int t = 0; t < 24; t++) {
      for (int i = 0; i < 64; i++) k[i] = v[i] = (float)((i + t) % 9) * 0.1f;
      for (int i = 0; i < 128; i++) q[i] = (float)(i % 5) * 0.1f;
      rlm_kv_batch b = {1, k, v, q, 4, 0.2f, NULL, out};
      if (rlm_kv_append_decode(kv, &b, NULL)) return 1;
    }
    void *img;
    size_t n;
    if (rlm_kv_state_save(kv, &img, &n, NULL)) return 1;
    char name[32];
    const uint8_t selector = (uint8_t)sel;
    snprintf(name, sizeof name, "%02x_%s", selector, rlm_kv_signature(kv));
    for (char *p = name; *p; p++) *p = *p == ':' ? '_' : *p;
    uint8_t *file = malloc(n + 1);
    file[0] = selector;
    memcpy(file + 1, img, n);
    fuzz_write(argv[1], name, file, n + 1);
    free(file), rlm_free(img), rlm_kv_free(kv);
  }
  return 0;
}
