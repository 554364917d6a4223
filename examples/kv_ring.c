/* kv_ring.c -- the KV-state layer on its own, through the public API only:
 * a rotating 4-bit cache (window 128, 8 kv heads x 128 dims, 4 query heads
 * per kv head) takes 500 decode steps -- it wraps about four times -- then
 * a speculative round is rolled back ragged-free; prints what it costs.
 *
 *   cc kv_ring.c $(pkg-config --cflags --libs ringlm) && ./a.out
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ringlm.h"

enum { H = 8, HQ = 32, D = 128, STEPS = 500 };

static float frand(unsigned *s) {
  *s = *s * 1664525u + 1013904223u;
  return (float)(*s >> 8) / (float)(1u << 24) - 0.5f;
}

int main(void) {
  rlm_kv_config c = rlm_kv_config_default(RLM_KV_ROTATING_QUANT);
  c.n_kv_heads = H, c.head_dim_k = c.head_dim_v = D;
  c.window = 128, c.max_chunk = 16, c.k_bits = 4, c.v_bits = 4, c.group_size = 64;
  rlm_error err;
  rlm_kv *kv;
  if (rlm_kv_create(&kv, &c, &err)) {
    fprintf(stderr, "kv_ring: %s\n", err.msg);
    return 1;
  }
  static float k[16 * H * D], v[16 * H * D], q[16 * HQ * D], out[16 * HQ * D];
  unsigned seed = 1;
  double checksum = 0;
  for (int t = 0; t < STEPS; t++) {
    for (int i = 0; i < H * D; i++) k[i] = frand(&seed), v[i] = frand(&seed);
    for (int i = 0; i < HQ * D; i++) q[i] = frand(&seed);
    rlm_kv_batch b = {1, k, v, q, HQ, 1.0f / sqrtf(D), NULL, out};
    if (rlm_kv_append_decode(kv, &b, &err)) {
      fprintf(stderr, "kv_ring: step %d: %s\n", t, err.msg);
      rlm_kv_free(kv);
      return 1;
    }
    checksum += out[0];
  }
  /* A speculative round: 8 drafted tokens, 3 accepted, after the wrap. */
  int64_t before = rlm_kv_offset(kv, 0), keep = 3;
  rlm_kv_batch draft = {8, k, v, NULL, HQ, 1.0f / sqrtf(D), NULL, NULL};
  if (rlm_kv_append_window(kv, &draft, &err) || rlm_kv_rollback(kv, &before, &keep, &err)) {
    fprintf(stderr, "kv_ring: %s\n", err.msg);
    rlm_kv_free(kv);
    return 1;
  }
  rlm_kv_config dense = c;
  dense.kind = RLM_KV_ROTATING;
  rlm_kv *d;
  if (rlm_kv_create(&d, &dense, &err)) return 1;
  printf("cache            %s\n", rlm_kv_signature(kv));
  printf("positions seen   %lld (window %d, ring of %lld slots)\n", (long long)rlm_kv_offset(kv, 0),
         c.window, (long long)rlm_kv_capacity(kv));
  printf("bytes per token  %.0f (bf16 ring: %.0f, ratio %.5f)\n", rlm_kv_bytes_per_token(kv),
         rlm_kv_bytes_per_token(d), rlm_kv_bytes_per_token(kv) / rlm_kv_bytes_per_token(d));
  printf("bytes held       %zu\n", rlm_kv_nbytes(kv));
  printf("output checksum  %.6f\n", checksum);
  rlm_kv_free(d);
  rlm_kv_free(kv);
  return 0;
}
