/* make_seeds.c -- writes the seed corpora that are generated rather than
 * written by hand; they are committed, and this tool is how they were made.
 *   make_seeds DIR         corpus/kv_state: one state image of each cache
 *                          fuzz_kv_state builds, after enough decode steps
 *                          that the rings wrap
 *   make_seeds --gguf DIR  corpus/gguf: small valid GGUF files
 *                          (tests/gguf_write.h): a v3 and a v2 model, a
 *                          vocabulary without tensors, tensors without keys,
 *                          and a valid gpt2 and llama vocabulary */
#include "fuzz.h"
#include "fuzz_kv.h"
#include "../gguf_write.h"

/* A string array key. */
static void str_array(gw *w, const char *key, const char *const *v, int n) {
  gw_key(w, key, GW_ARR);
  gw_arr(w, GW_STR, (uint64_t)n);
  for (int i = 0; i < n; i++) gw_str(w, v[i]);
}

/* A small valid vocabulary of each kind llama.cpp writes, with a chat
 * template, so that the fuzzer starts inside the vocabulary builder:
 * gpt2 (byte-level tokens, merges) and llama (SentencePiece pieces with
 * scores and byte tokens). */
static void vocab_seed(gw *w, bool spm) {
  static const char *const bpe[] = {"t", "h", "e", "\xc4\xa0", "th", "the", "\xc4\xa0the", "<|eot|>"};
  static const char *const merges[] = {"t h", "th e", "\xc4\xa0 the"};
  static const char *const pieces[] = {"<unk>", "<s>", "</s>", "<0x41>", "\xe2\x96\x81", "t", "h", "e",
                                       "th", "the", "\xe2\x96\x81the"};
  const int n = spm ? 11 : 8;
  gw_header(w, 3, 0, 8);
  gw_kv_str(w, "tokenizer.ggml.model", spm ? "llama" : "gpt2");
  gw_kv_str(w, "tokenizer.ggml.pre", spm ? "default" : "llama-bpe");
  str_array(w, "tokenizer.ggml.tokens", spm ? pieces : bpe, n);
  gw_key(w, "tokenizer.ggml.token_type", GW_ARR);
  gw_arr(w, GW_I32, (uint64_t)n);
  for (int i = 0; i < n; i++) gw_u32(w, spm ? (i < 3 ? (i ? 3u : 2u) : i == 3 ? 6u : 1u) : (i == 7 ? 3u : 1u));
  if (spm) {
    gw_key(w, "tokenizer.ggml.scores", GW_ARR);
    gw_arr(w, GW_F32, (uint64_t)n);
    for (int i = 0; i < n; i++) gw_u32(w, rlm__f32_bits(-(float)i));
  } else {
    str_array(w, "tokenizer.ggml.merges", merges, 3);
  }
  gw_kv_u32(w, "tokenizer.ggml.bos_token_id", spm ? 1 : 7);
  gw_kv_u32(w, "tokenizer.ggml.eos_token_id", spm ? 2 : 7);
  gw_kv_str(w, "tokenizer.chat_template",
            "{% for m in messages %}{{ bos_token + m['role'] + ': ' + m['content'] + eos_token }}{% endfor %}");
}

static int gguf_seeds(const char *dir) {
  gw w[6] = {{0}};
  gw_model(&w[0], 3, 0, NULL);
  gw_model(&w[1], 2, 64, NULL);
  gw_header(&w[2], 3, 0, 2);
  gw_kv_str(&w[2], "tokenizer.ggml.model", "gpt2");
  gw_key(&w[2], "tokenizer.ggml.token_type", GW_ARR);
  gw_arr(&w[2], GW_I32, 2);
  gw_u32(&w[2], 1);
  gw_u32(&w[2], 3);
  const uint64_t dims[] = {32, 2};
  gw_header(&w[3], 3, 2, 0);
  gw_tensor(&w[3], "a", 2, dims, GW_T_Q8_0, 0);
  gw_tensor(&w[3], "b", 1, dims, GW_T_F16, 96);
  gw_pad(&w[3], 32);
  for (int i = 0; i < 160; i++) gw_u8(&w[3], (uint8_t)i);
  vocab_seed(&w[4], false);
  vocab_seed(&w[5], true);
  static const char *const names[] = {"model_v3", "model_v2_align64", "vocab_only", "tensors_only", "vocab_gpt2",
                                      "vocab_spm"};
  for (int i = 0; i < 6; i++) {
    if (!fuzz_write(dir, names[i], w[i].p, w[i].n)) return 1;
    free(w[i].p);
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--gguf")) return gguf_seeds(argv[2]);
  if (argc != 2) return fprintf(stderr, "usage: make_seeds DIR | make_seeds --gguf DIR\n"), 2;
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
