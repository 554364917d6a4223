/* fuzz_config.c -- the JSON a model folder brings besides its weights:
 * config.json, generation_config.json and tokenizer_config.json (the
 * input's three NUL-separated parts), read as model loading reads them,
 * and the chat template tokenizer_config.json carries, rendered once. */
#include "fuzz.h"
#include "model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *r1, *r2;
  size_t n1, n2;
  char *cfg = fuzz_split(data, size, &r1, &n1);
  char *gen = cfg ? fuzz_split(r1, n1, &r2, &n2) : NULL;
  const char *dir = fuzz_dir();
  if (gen && fuzz_write(dir, "config.json", cfg, strlen(cfg)) &&
      fuzz_write(dir, "generation_config.json", gen, strlen(gen)) &&
      fuzz_write(dir, "tokenizer_config.json", r2, n2)) {
    rlm_model_config c;
    memset(&c, 0, sizeof c);
    if (!rlm__config_load(&c, dir, NULL)) (void)rlm__gen_config_load(&c, dir, NULL);
    rlm_chat_template *t = NULL;
    if (!rlm_chat_template_load(&t, dir, NULL)) {
      char *out = NULL;
      rlm_chat_template_render(t, "[{\"role\":\"user\",\"content\":\"hi\"}]", NULL, true, &out, NULL, NULL);
      rlm_free(out);
    }
    rlm_chat_template_free(t);
  }
  free(cfg);
  free(gen);
  return 0;
}
