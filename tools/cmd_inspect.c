/* cmd_inspect.c -- `ringlm inspect PATH`: the tensors of a safetensors
 * file or model folder, one per line, and their total size. */
#include "cli.h"

#include <string.h>

static void print_shape(const rlm_tensor_info *t) {
  printf("[");
  for (int d = 0; d < t->ndim; d++) printf(d ? ", %lld" : "%lld", (long long)t->shape[d]);
  printf("]");
}

int cmd_inspect(int argc, char **argv) {
  if (argc != 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    fputs("usage: ringlm inspect PATH\n"
          "Lists name, dtype, shape and bytes of every tensor in a .safetensors file\n"
          "or a model folder (model.safetensors or a sharded index).\n",
          argc == 2 ? stdout : stderr);
    return argc == 2 ? CLI_OK : CLI_USAGE;
  }
  rlm_error err = {0};
  rlm_weights *w;
  if (rlm_weights_open(&w, argv[1], &err)) return cli_fail(&err);
  size_t total = 0, n = rlm_weights_count(w);
  for (size_t i = 0; i < n; i++) {
    rlm_tensor_info t;
    if (rlm_weights_get(w, i, &t, &err)) {
      rlm_weights_free(w);
      return cli_fail(&err);
    }
    printf("%-60s %-5s ", t.name, rlm_dtype_name(t.dtype));
    print_shape(&t);
    printf(" %zu\n", t.nbytes);
    total += t.nbytes;
  }
  printf("%zu tensors, %.2f MB\n", n, (double)total / 1e6);
  rlm_weights_free(w);
  return CLI_OK;
}
