/* fuzz_kv.h -- the cache a selector byte names, for fuzz_kv_state and the
 * tool that writes its seeds (make_seeds.c): bits 0-1 the kind, bit 2
 * sinks, bit 3 8-bit V, bit 4 dense-first (rotating-quant only). */
#ifndef RLM_FUZZ_KV_H
#define RLM_FUZZ_KV_H

#include "fuzz.h"
#include "kv/kv.h"

static inline rlm_kv *fuzz_kv_make(uint8_t sel) {
  static const rlm_kv_kind kinds[4] = {RLM_KV_PLAIN, RLM_KV_QUANT, RLM_KV_ROTATING, RLM_KV_ROTATING_QUANT};
  rlm_kv_config c = rlm_kv_config_default(kinds[sel % 4]);
  c.n_kv_heads = 2, c.head_dim_k = 32, c.group_size = 32, c.window = 16, c.max_chunk = 8, c.q_per_kv = 2;
  c.keep = sel & 4 ? 3 : 0;
  c.k_bits = 4, c.v_bits = sel & 8 ? 8 : 4;
  c.dense_first = (sel & 16) && c.kind == RLM_KV_ROTATING_QUANT;
  rlm_kv *kv = NULL;
  return rlm_kv_create(&kv, &c, NULL) ? NULL : kv;
}

#endif /* RLM_FUZZ_KV_H */
