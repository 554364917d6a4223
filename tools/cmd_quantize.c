/* cmd_quantize.c -- `ringlm quantize IN OUT --bits B --group-size G`. */
#include "cli.h"

#include <string.h>
#include <time.h>

static const char help[] =
    "usage: ringlm quantize IN OUT [--bits B] [--group-size G] [--quantize-embeddings] [-t N]\n"
    "\n"
    "IN is a .safetensors file or a Hugging Face model folder. Every 2-D *.weight\n"
    "tensor that is not a norm (nor an embedding, unless --quantize-embeddings)\n"
    "becomes MLX's affine triple <name>.weight (u32), <name>.scales, <name>.biases.\n"
    "A folder gives a folder: model.safetensors, config.json with\n"
    "\"quantization\": {\"group_size\", \"bits\"}, and the other files copied.\n"
    "\n"
    "  --bits B              2, 3, 4, 5, 6 or 8 (default 4)\n"
    "  --group-size G        32, 64 or 128 (default 64)\n"
    "  --quantize-embeddings also quantize embedding tables\n"
    "  -t, --threads N       worker threads (default: all cores)\n";

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int cmd_quantize(int argc, char **argv) {
  rlm_quantize_params p = rlm_quantize_params_default();
  const char *paths[2] = {NULL, NULL};
  int n_paths = 0;
  long v;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      fputs(help, stdout);
      return CLI_OK;
    } else if (!strcmp(a, "--bits") || !strcmp(a, "--group-size") || !strcmp(a, "-t") ||
               !strcmp(a, "--threads")) {
      if (!cli_parse_int(a, i + 1 < argc ? argv[++i] : NULL, 0, 1 << 20, &v)) return CLI_USAGE;
      if (!strcmp(a, "--bits")) p.bits = (int)v;
      else if (!strcmp(a, "--group-size")) p.group_size = (int)v;
      else p.n_threads = (int)v;
    } else if (!strcmp(a, "--quantize-embeddings")) {
      p.quantize_embeddings = true;
    } else if (a[0] == '-' && a[1]) {
      return cli_usage_error("quantize", "unknown option '%s'", a);
    } else if (n_paths < 2) {
      paths[n_paths++] = a;
    } else {
      return cli_usage_error("quantize", "unexpected argument '%s'", a);
    }
  }
  if (n_paths != 2) return cli_usage_error("quantize", "needs IN and OUT");
  rlm_error err = {0};
  rlm_quantize_stats st;
  double t0 = now_s();
  if (rlm_quantize_model(paths[0], paths[1], &p, &st, &err)) return cli_fail(&err);
  printf("quantized %lld of %lld tensors to %d bits, group size %d: %.1f MB -> %.1f MB in %.2f s\n",
         (long long)st.n_quantized, (long long)(st.n_tensors - 2 * st.n_quantized), p.bits,
         p.group_size, (double)st.bytes_in / 1e6, (double)st.bytes_out / 1e6, now_s() - t0);
  printf("wrote %s\n", paths[1]);
  return CLI_OK;
}
