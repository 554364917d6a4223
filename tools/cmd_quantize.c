/* cmd_quantize.c -- `ringlm quantize IN OUT`: its options, checked before
 * any file is opened (bad usage exits 2 naming the flag), the call to
 * rlm_quantize_model (which builds the output beside OUT and renames it
 * into place, so a failure leaves nothing), a warning for each --override
 * that decided no tensor, and a summary of what was done. */
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char help[] =
    "usage: ringlm quantize IN OUT [options]\n"
    "\n"
    "MLX affine quantization. IN is a .safetensors file or a Hugging Face model\n"
    "folder. Every 2-D *.weight tensor that is not a norm (nor an embedding,\n"
    "unless --quantize-embeddings) and whose width is a multiple of the group\n"
    "size becomes MLX's triple <name>.weight (u32), <name>.scales, <name>.biases.\n"
    "A folder gives a folder: model.safetensors, config.json (the input's text\n"
    "with \"quantization\": {\"group_size\", \"bits\", \"mode\"} added, every other\n"
    "value kept as written) and the other files copied. A file gives a file\n"
    "(OUT, or OUT/model.safetensors when OUT is a folder).\n"
    "\n"
    "OUT must not exist (see --force), be IN, lie inside IN or contain it. It\n"
    "appears whole or not at all: it is built in OUT.tmp.* beside OUT and renamed\n"
    "into place at the end; a failure leaves nothing behind.\n"
    "\n"
    "options:\n"
    "  --bits B                bits per weight: 2, 3, 4, 5, 6 or 8 (default 4)\n"
    "  --group-size G          weights per scale and bias: 32, 64 or 128 (default 64)\n"
    "  --override MATCH=B[:G]  tensors whose name contains MATCH get B bits (0: kept\n"
    "                          dense) and group size G (default: --group-size); the\n"
    "                          first match applies; repeatable; config.json lists\n"
    "                          those layers as mlx-lm does; embeddings stay dense\n"
    "                          without --quantize-embeddings (default: none)\n"
    "  --quantize-embeddings   also quantize embedding tables (default: off)\n"
    "  --force                 replace an existing OUT, once the new one is complete\n"
    "                          (default: off, an existing OUT is an error)\n"
    "  -t, --threads N         worker threads (default: the physical cores)\n"
    "  -h, --help              print this help and exit\n";

typedef struct quant_args {
  rlm_quantize_params p;
  rlm_quantize_override ov[RLM_QUANTIZE_MAX_OVERRIDES]; /* match strings malloc'd */
  const char *ov_text[RLM_QUANTIZE_MAX_OVERRIDES];      /* as given, for warnings */
  const char *paths[2];                                 /* IN, OUT                */
  int n_paths;
} quant_args;

/* The library's sets (quant.h), spelled again: the CLI sees only ringlm.h. */
static bool bits_ok(long b) { return (b >= 2 && b <= 6) || b == 8; }
static bool group_ok(long g) { return g == 32 || g == 64 || g == 128; }

/* A whole decimal integer; the sets below say what is valid, so no range. */
static int parse_long(const char *flag, const char *s, long *out) {
  char *end;
  errno = 0;
  *out = s ? strtol(s, &end, 10) : 0;
  if (!s) return cli_usage_error("quantize", "%s needs a value", flag);
  if (!*s || *end || errno)
    return cli_usage_error("quantize", "%s expects an integer, got '%s'", flag, s);
  return CLI_OK;
}

static int parse_bits(const char *flag, const char *s, int *out) {
  long v;
  if (parse_long(flag, s, &v)) return CLI_USAGE;
  if (!bits_ok(v))
    return cli_usage_error("quantize", "%s %ld: must be 2, 3, 4, 5, 6 or 8", flag, v);
  *out = (int)v;
  return CLI_OK;
}

static int parse_group(const char *flag, const char *s, int *out) {
  long v;
  if (parse_long(flag, s, &v)) return CLI_USAGE;
  if (!group_ok(v))
    return cli_usage_error("quantize", "%s %ld: must be 32, 64 or 128", flag, v);
  *out = (int)v;
  return CLI_OK;
}

/* MATCH=B or MATCH=B:G, B in {0} + the bit widths, G a group size. */
static int parse_override(const char *s, rlm_quantize_override *o) {
  const char *eq = s ? strrchr(s, '=') : NULL;
  char *end;
  if (!s) return cli_usage_error("quantize", "--override needs a value (MATCH=BITS[:GROUP])");
  if (!eq || eq == s)
    return cli_usage_error("quantize", "--override expects MATCH=BITS[:GROUP], got '%s'", s);
  long bits = strtol(eq + 1, &end, 10), group = 0;
  if (end != eq + 1 && *end == ':') group = strtol(end + 1, &end, 10);
  if (end == eq + 1 || *end)
    return cli_usage_error("quantize", "--override expects MATCH=BITS[:GROUP], got '%s'", s);
  if (bits && !bits_ok(bits))
    return cli_usage_error("quantize", "--override %s: bits must be 0, 2, 3, 4, 5, 6 or 8", s);
  if (strchr(eq, ':') && !group_ok(group))
    return cli_usage_error("quantize", "--override %s: group size must be 32, 64 or 128", s);
  o->match = strndup(s, (size_t)(eq - s));
  o->bits = (int)bits;
  o->group_size = (int)group;
  if (o->match) return CLI_OK;
  fputs("ringlm: out of memory\n", stderr);
  return CLI_FAIL;
}

static int add_override(quant_args *qa, const char *s) {
  if (qa->p.n_overrides == RLM_QUANTIZE_MAX_OVERRIDES)
    return cli_usage_error("quantize", "--override: at most %d", RLM_QUANTIZE_MAX_OVERRIDES);
  int rc = parse_override(s, &qa->ov[qa->p.n_overrides]);
  if (!rc) qa->ov_text[qa->p.n_overrides++] = s;
  return rc;
}

/* argv[*i] and its value, if it takes one; CLI_OK, CLI_USAGE or -1 (help). */
static int parse_option(quant_args *qa, int argc, char **argv, int *i) {
  const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
  bool takes_value = !strcmp(a, "--bits") || !strcmp(a, "--group-size") ||
                     !strcmp(a, "--override") || !strcmp(a, "-t") || !strcmp(a, "--threads");
  long n;
  if (takes_value) ++*i;
  if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
    fputs(help, stdout);
    return -1;
  }
  if (!strcmp(a, "--bits")) return parse_bits(a, v, &qa->p.bits);
  if (!strcmp(a, "--group-size")) return parse_group(a, v, &qa->p.group_size);
  if (!strcmp(a, "--override")) return add_override(qa, v);
  if (takes_value) { /* -t, --threads */
    if (!v) return cli_usage_error("quantize", "%s needs a value", a);
    if (!cli_parse_int(a, v, 0, 1 << 20, &n)) return CLI_USAGE;
    qa->p.n_threads = (int)n;
  } else if (!strcmp(a, "--quantize-embeddings")) {
    qa->p.quantize_embeddings = true;
  } else if (!strcmp(a, "--force")) {
    qa->p.overwrite = true;
  } else {
    return cli_usage_error("quantize", "unknown option '%s'", a);
  }
  return CLI_OK;
}

static int parse_args(int argc, char **argv, quant_args *qa) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int rc = CLI_OK;
    if (a[0] == '-' && a[1]) rc = parse_option(qa, argc, argv, &i);
    else if (!a[0]) rc = cli_usage_error("quantize", "IN and OUT must not be empty");
    else if (qa->n_paths < 2) qa->paths[qa->n_paths++] = a;
    else rc = cli_usage_error("quantize", "unexpected argument '%s'", a);
    if (rc) return rc;
  }
  return qa->n_paths == 2 ? CLI_OK : cli_usage_error("quantize", "needs IN and OUT");
}

/* "quantized 15 of 24 tensors: 13 to 4 bits g64, 2 to 8 bits g32; 1 kept dense; ..." */
static void print_summary(const rlm_quantize_stats *st, double secs) {
  printf("quantized %lld of %lld tensors", (long long)st->n_quantized,
         (long long)(st->n_tensors - 2 * st->n_quantized));
  for (int i = 0; i < st->n_formats; i++)
    printf("%s%lld to %d bits g%d", i ? ", " : ": ", (long long)st->formats[i].n_tensors,
           st->formats[i].bits, st->formats[i].group_size);
  if (st->n_kept_dense) printf("; %lld kept dense", (long long)st->n_kept_dense);
  printf("; %.1f MB -> %.1f MB in %.2f s\n", (double)st->bytes_in / 1e6,
         (double)st->bytes_out / 1e6, secs);
}

int cmd_quantize(int argc, char **argv) {
  quant_args qa = {0};
  qa.p = rlm_quantize_params_default();
  qa.p.overrides = qa.ov;
  int rc = parse_args(argc, argv, &qa);
  rlm_error err = {0};
  rlm_quantize_stats st;
  double t0 = cli_now_s();
  if (rc) {
    rc = rc < 0 ? CLI_OK : rc;
  } else if (rlm_quantize_model(qa.paths[0], qa.paths[1], &qa.p, &st, &err)) {
    rc = cli_fail(&err);
  } else {
    for (int i = 0; i < qa.p.n_overrides; i++)
      if (!st.n_override_hits[i])
        fprintf(stderr, "ringlm quantize: warning: --override %s matched no tensor\n",
                qa.ov_text[i]);
    print_summary(&st, cli_now_s() - t0);
    printf("wrote %s\n", qa.paths[1]);
  }
  for (int i = 0; i < qa.p.n_overrides; i++) free((char *)qa.ov[i].match);
  return rc;
}
