/* fuzz_request.c -- the server's request bodies: the first byte picks
 * completions or chat completions, the rest is the body, parsed and
 * validated into generation parameters as `ringlm serve` does (with the
 * embedded model's tokenizer and chat template). */
#include "fuzz.h"
#include "srv.h"

static srv_ctx g_ctx;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  char dir[512], tok[600];
  snprintf(dir, sizeof dir, "%s/models/brown-15m-4bit", fuzz_src());
  snprintf(tok, sizeof tok, "%s/tokenizer.json", dir);
  rlm_tokenizer *t = NULL;
  rlm_chat_template *tm = NULL;
  if (rlm_model_load(&g_ctx.h.model, dir, NULL) || rlm_tokenizer_load(&t, tok, NULL) ||
      rlm_chat_template_load(&tm, dir, NULL))
    abort();
  g_ctx.h.tok = t, g_ctx.h.tmpl = tm;
  g_ctx.cfg.smp = rlm_sampler_params_default();
  g_ctx.cfg.max_tokens = -1, g_ctx.cfg.n_ctx = 256, g_ctx.cfg.model_name = "brown";
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  srv_req r;
  srv_err e;
  memset(&e, 0, sizeof e);
  if (srv_parse_completion(&g_ctx, (const char *)data + 1, size - 1, data[0] & 1, &r, &e)) {
    if (r.n_prompt < 1 || r.n < 1 || r.n > SRV_MAX_N) abort(); /* what validation promises */
  }
  srv_req_free(&r);
  return 0;
}
