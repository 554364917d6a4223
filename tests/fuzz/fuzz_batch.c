/* fuzz_batch.c -- `ringlm batch`'s prompt file: lines of text or JSON
 * objects ({"prompt"} or {"ids"}, "max_tokens"), parsed and encoded with
 * the embedded model's tokenizer as the command does before generating. */
#include "fuzz.h"
#include "model_cli.h"

static model_ctx g_c;
static model_opts g_o;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  static char dir[512];
  snprintf(dir, sizeof dir, "%s/models/brown-15m-4bit", fuzz_src());
  g_o = mcli_defaults();
  g_o.dir = dir, g_o.cmd = "batch", g_o.n_gen = 4;
  if (mcli_open(&g_o, &g_c, true)) abort();
  g_c.n_ctx = 64; /* so that long prompts hit the context check */
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  long bad = 0;
  long n = mcli_batch_parse(&g_c, &g_o, (const char *)data, size, &bad);
  if (n >= 0 && bad > n) abort();
  return 0;
}
