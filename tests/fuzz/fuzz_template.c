/* fuzz_template.c -- chat templates: the source (before the first NUL)
 * parsed, then rendered with the rest as the messages JSON (or a default
 * conversation when the rest is empty), with and without the generation
 * prompt. The render limits (steps, output, recursion, memory) must stop
 * every template in bounded time. */
#include "fuzz.h"

static const char *const DEFAULT_MSGS =
    "[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"hi\"},"
    "{\"role\":\"assistant\",\"content\":\"yo\"}]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *rest;
  size_t n_rest;
  char *src = fuzz_split(data, size, &rest, &n_rest);
  if (!src) return 0;
  rlm_chat_template *t = NULL;
  if (!rlm_chat_template_parse(&t, src, strlen(src), NULL)) {
    char *msgs = malloc(n_rest + 1);
    if (msgs) {
      memcpy(msgs, rest, n_rest);
      msgs[n_rest] = 0;
      for (int g = 0; g < 2; g++) {
        char *out = NULL;
        rlm_chat_template_render(t, n_rest ? msgs : DEFAULT_MSGS, NULL, g, &out, NULL, NULL);
        rlm_free(out);
      }
    }
    free(msgs);
  }
  rlm_chat_template_free(t);
  free(src);
  return 0;
}
