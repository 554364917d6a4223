/* cmd_quantize.c -- `ringlm quantize IN OUT --bits B --group-size G`. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char help[] =
    "usage: ringlm quantize IN OUT [--bits B] [--group-size G] [--override MATCH=B[:G]]...\n"
    "                       [--quantize-embeddings] [-t N]\n"
    "\n"
    "IN is a .safetensors file or a Hugging Face model folder. Every 2-D *.weight\n"
    "tensor that is not a norm (nor an embedding, unless --quantize-embeddings)\n"
    "becomes MLX's affine triple <name>.weight (u32), <name>.scales, <name>.biases.\n"
    "A folder gives a folder: model.safetensors, config.json with\n"
    "\"quantization\": {\"group_size\", \"bits\"}, and the other files copied.\n"
    "\n"
    "  --bits B              2, 3, 4, 5, 6 or 8 (default 4)\n"
    "  --group-size G        32, 64 or 128 (default 64)\n"
    "  --override MATCH=B[:G] tensors whose name contains MATCH get B bits (0: keep\n"
    "                        them dense) and group size G; the first match applies;\n"
    "                        config.json lists those layers as mlx-lm does\n"
    "  --quantize-embeddings also quantize embedding tables\n"
    "  -t, --threads N       worker threads (default: all cores)\n";

enum { MAX_OVERRIDES = 32 };

/* MATCH=B or MATCH=B:G. */
static bool parse_override(const char *s, rlm_quantize_override *o) {
  const char *eq = strrchr(s, '=');
  char *end;
  if (!eq || eq == s) return false;
  o->match = strndup(s, (size_t)(eq - s));
  o->bits = (int)strtol(eq + 1, &end, 10);
  o->group_size = 0;
  if (end == eq + 1) return false;
  if (*end == ':') o->group_size = (int)strtol(end + 1, &end, 10);
  return o->match && !*end;
}

/* Options into p and paths; CLI_OK, or an exit code (help: -1). */
static int parse_args(int argc, char **argv, rlm_quantize_params *p, rlm_quantize_override *ov,
                      const char **paths, int *n_paths) {
  long v;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      fputs(help, stdout);
      return -1;
    } else if (!strcmp(a, "--bits") || !strcmp(a, "--group-size") || !strcmp(a, "-t") ||
               !strcmp(a, "--threads")) {
      if (!cli_parse_int(a, i + 1 < argc ? argv[++i] : NULL, 0, 1 << 20, &v)) return CLI_USAGE;
      if (!strcmp(a, "--bits")) p->bits = (int)v;
      else if (!strcmp(a, "--group-size")) p->group_size = (int)v;
      else p->n_threads = (int)v;
    } else if (!strcmp(a, "--override")) {
      if (p->n_overrides == MAX_OVERRIDES || i + 1 >= argc || !parse_override(argv[++i], &ov[p->n_overrides++]))
        return cli_usage_error("quantize", "--override expects MATCH=BITS[:GROUP] (at most %d)", MAX_OVERRIDES);
    } else if (!strcmp(a, "--quantize-embeddings")) {
      p->quantize_embeddings = true;
    } else if (a[0] == '-' && a[1]) {
      return cli_usage_error("quantize", "unknown option '%s'", a);
    } else if (*n_paths < 2) {
      paths[(*n_paths)++] = a;
    } else {
      return cli_usage_error("quantize", "unexpected argument '%s'", a);
    }
  }
  return *n_paths == 2 ? CLI_OK : cli_usage_error("quantize", "needs IN and OUT");
}

int cmd_quantize(int argc, char **argv) {
  rlm_quantize_params p = rlm_quantize_params_default();
  rlm_quantize_override ov[MAX_OVERRIDES] = {{0}};
  const char *paths[2] = {NULL, NULL};
  int n_paths = 0;
  p.overrides = ov;
  int rc = parse_args(argc, argv, &p, ov, paths, &n_paths);
  rlm_error err = {0};
  rlm_quantize_stats st;
  double t0 = cli_now_s();
  if (rc) {
    rc = rc < 0 ? CLI_OK : rc;
  } else if (rlm_quantize_model(paths[0], paths[1], &p, &st, &err)) {
    rc = cli_fail(&err);
  } else {
    printf("quantized %lld of %lld tensors to %d bits, group size %d: %.1f MB -> %.1f MB in %.2f s\n",
           (long long)st.n_quantized, (long long)(st.n_tensors - 2 * st.n_quantized), p.bits, p.group_size,
           (double)st.bytes_in / 1e6, (double)st.bytes_out / 1e6, cli_now_s() - t0);
    printf("wrote %s\n", paths[1]);
  }
  for (int i = 0; i < MAX_OVERRIDES; i++) free((char *)ov[i].match);
  return rc;
}
