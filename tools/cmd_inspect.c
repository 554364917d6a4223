/* cmd_inspect.c -- `ringlm inspect PATH`: the tensors of a safetensors
 * file or model folder, one per line in aligned columns (bytes also in
 * KiB/MiB/GiB), and their total size; `ringlm inspect -m DIR`: the model
 * as ringlm runs it (architecture, layer types and windows, parameters,
 * weight format, KV bytes for each --kv-bits). Bad usage exits 2. */
#include "model_cli.h"

#include <sys/stat.h>

#include <stdlib.h>
#include <string.h>

/* n bytes as "1.5 MiB" (cli_bytes); "" below 1 KiB, where the bytes say it. */
static const char *human(char *buf, size_t n, double bytes) {
  if (bytes >= 1024) return cli_bytes(bytes, buf, n);
  buf[0] = 0;
  return buf;
}

static void print_layers(const rlm_model *m, const rlm_model_info *mi) {
  printf("layers      ");
  for (int i = 0; i < mi->n_layers; i++) {
    rlm_layer_info li;
    rlm_model_layer_info(m, i, &li);
    printf("%s%s", li.sliding ? "S" : "F", li.kv_donor >= 0 ? "*" : "");
    printf(i + 1 < mi->n_layers ? " " : "\n");
  }
  printf("            (S: sliding window %d, F: full attention, "
         "*: attends an earlier layer's KV)\n",
         mi->sliding_window);
  for (int i = 0; i < mi->n_layers; i++) {
    rlm_layer_info li;
    rlm_model_layer_info(m, i, &li);
    printf("  layer %-3d %-8s head_dim %-4d kv heads %-3d", i, li.sliding ? "sliding" : "full",
           li.head_dim, li.n_kv_heads);
    if (li.kv_donor >= 0) printf(" KV of layer %d", li.kv_donor);
    printf("\n");
  }
}

/* KV bytes per token (growing layers) and ring bytes for each choice. */
static void print_kv(const rlm_model *m, int group, int chunk) {
  static const struct { const char *name; int k, v; } ch[] = {
      {"dense", 0, 0}, {"8-bit", 8, 8}, {"6-bit", 6, 6}, {"5-bit", 5, 5}, {"4-bit", 4, 4},
      {"3-bit", 3, 3}, {"2-bit", 2, 2}, {"k8v4", 8, 4}, {"k4v8", 4, 8}};
  printf("KV cache    group %d, prefill chunk %d (rings hold window + chunk - 1 slots)\n", group,
         chunk);
  printf("  %-7s %18s %18s\n", "kv-bits", "bytes/token", "ring bytes");
  char h[32];
  for (size_t i = 0; i < sizeof ch / sizeof *ch; i++) {
    rlm_session_params p = rlm_session_params_default();
    p.k_bits = ch[i].k, p.v_bits = ch[i].v, p.kv_group_size = group, p.prefill_chunk = chunk;
    double grow, ring;
    rlm_error err = {0};
    if (rlm_model_kv_footprint(m, &p, &grow, &ring, &err)) {
      printf("  %-7s %s\n", ch[i].name, err.msg);
      continue;
    }
    printf("  %-7s %18.1f %18.0f", ch[i].name, grow, ring);
    printf(*human(h, sizeof h, ring) ? " %10s\n" : "%s\n", h);
  }
}

static int inspect_model(const char *dir, int group, int chunk) {
  rlm_error err = {0};
  rlm_model *m;
  if (rlm_model_load(&m, dir, &err)) return cli_fail(&err);
  rlm_model_info mi;
  rlm_model_get_info(m, &mi);
  printf("model       %s: %d layers, hidden %d, %d heads, vocab %d\n", mi.arch, mi.n_layers,
         mi.hidden, mi.n_heads, mi.vocab);
  printf("parameters  %lld (%.2f M)\n", (long long)mi.n_params, (double)mi.n_params / 1e6);
  if (mi.weight_bits)
    printf("weights     MLX affine %d-bit, group %d\n", mi.weight_bits, mi.weight_group);
  else printf("weights     %s\n", mi.weight_dtype);
  printf("eos ids    ");
  for (int i = 0; i < mi.n_eos; i++) printf(" %d", mi.eos[i]);
  printf(mi.n_eos ? "\n" : " (none)\n");
  print_layers(m, &mi);
  print_kv(m, group, chunk);
  rlm_model_free(m);
  return CLI_OK;
}

static void format_shape(const rlm_tensor_info *t, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < t->ndim && k < n; d++)
    k += (size_t)snprintf(buf + k, n - k, d ? ", %lld" : "%lld", (long long)t->shape[d]);
  if (k < n) snprintf(buf + k, n - k, "]");
}

/* Column widths of the tensor listing: each the widest of its column. */
typedef struct tensor_cols {
  int name, shape, bytes, human;
} tensor_cols;

static void print_tensor(const rlm_tensor_info *t, const tensor_cols *w) {
  char shape[256], bytes[32], h[32];
  format_shape(t, shape, sizeof shape);
  snprintf(bytes, sizeof bytes, "%zu", t->nbytes);
  printf("%-*s %-5s %-*s %*s", w->name, t->name, rlm_dtype_name(t->dtype), w->shape, shape,
         w->bytes, bytes);
  if (*human(h, sizeof h, (double)t->nbytes)) printf("  %*s", w->human, h);
  printf("\n");
}

static int max_int(int a, int b) { return a > b ? a : b; }

/* Two passes: the widths, then the rows (the table is small beside the data). */
static int list_tensors(const char *path) {
  rlm_error err = {0};
  rlm_weights *w;
  if (rlm_weights_open(&w, path, &err)) return cli_fail(&err);
  size_t total = 0, n = rlm_weights_count(w);
  tensor_cols cols = {60, 0, 0, 0}; /* names pad to 60 at least, as before */
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < n; i++) {
      rlm_tensor_info t;
      char buf[256];
      if (rlm_weights_get(w, i, &t, &err)) {
        rlm_weights_free(w);
        return cli_fail(&err);
      }
      if (pass) {
        print_tensor(&t, &cols);
        total += t.nbytes;
        continue;
      }
      format_shape(&t, buf, sizeof buf);
      cols.name = max_int(cols.name, (int)strlen(t.name));
      cols.shape = max_int(cols.shape, (int)strlen(buf));
      cols.bytes = max_int(cols.bytes, snprintf(buf, sizeof buf, "%zu", t.nbytes));
      cols.human = max_int(cols.human, (int)strlen(human(buf, sizeof buf, (double)t.nbytes)));
    }
  }
  char h[32];
  printf("%zu tensor%s, %zu bytes (%.2f MB%s%s)\n", n, n == 1 ? "" : "s", total,
         (double)total / 1e6, total >= 1024 ? ", " : "", human(h, sizeof h, (double)total));
  rlm_weights_free(w);
  return CLI_OK;
}

static const char inspect_help[] =
    "usage: ringlm inspect PATH\n"
    "       ringlm inspect -m DIR [--kv-group-size G] [--prefill-chunk N]\n"
    "\n"
    "The first form lists every tensor of a .safetensors file or a model folder:\n"
    "name, dtype, shape, bytes (and KiB/MiB/GiB), then the total. The second\n"
    "describes the model as ringlm runs it: architecture, each layer's type\n"
    "(sliding window or full attention), head dim and KV heads, parameters,\n"
    "weight format, end-of-sequence ids, and the KV bytes per token and ring\n"
    "bytes for dense, 8..2-bit, K8V4 and K4V8 caches.\n"
    "\n"
    "options:\n"
    "  -m, --model DIR       describe the model in folder DIR (default: list the\n"
    "                        tensors of PATH)\n"
    "  --kv-group-size G     with -m: the KV caches' quantization group, 32, 64 or\n"
    "                        128 (default 64)\n"
    "  --prefill-chunk N     with -m: the prefill chunk rings are sized for,\n"
    "                        1..65536 (default 512)\n"
    "  -h, --help            print this help and exit\n";

typedef struct inspect_args {
  const char *path, *dir;  /* PATH, -m DIR: exactly one is set          */
  long group, chunk;       /* --kv-group-size, --prefill-chunk           */
  const char *model_flag;  /* the first option that only -m uses, or NULL */
} inspect_args;

/* An option's value: the next argument, unless missing or an option. */
static const char *value_of(int argc, char **argv, int *i) {
  const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
  if (!v || (v[0] == '-' && v[1])) return NULL;
  ++*i;
  return v;
}

/* argv[*i], an option; CLI_OK, CLI_USAGE or -1 (help printed). */
static int parse_option(inspect_args *a, int argc, char **argv, int *i) {
  const char *o = argv[*i], *v;
  bool is_group = !strcmp(o, "--kv-group-size"), is_chunk = !strcmp(o, "--prefill-chunk");
  if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
    fputs(inspect_help, stdout);
    return -1;
  }
  if (strcmp(o, "-m") && strcmp(o, "--model") && !is_group && !is_chunk)
    return cli_usage_error("inspect", "unknown option '%s'", o);
  if (!(v = value_of(argc, argv, i))) return cli_usage_error("inspect", "%s needs a value", o);
  if (!is_group && !is_chunk) {
    a->dir = v;
    return CLI_OK;
  }
  if (!a->model_flag) a->model_flag = o;
  if (is_chunk) return cli_parse_int(o, v, 1, 65536, &a->chunk) ? CLI_OK : CLI_USAGE;
  if (!cli_parse_int(o, v, 32, 128, &a->group)) return CLI_USAGE;
  if (a->group != 32 && a->group != 64 && a->group != 128)
    return cli_usage_error("inspect", "%s %ld: must be 32, 64 or 128", o, a->group);
  return CLI_OK;
}

static int parse_args(int argc, char **argv, inspect_args *a) {
  for (int i = 1; i < argc; i++) {
    const char *s = argv[i];
    int rc = CLI_OK;
    if (s[0] == '-' && s[1]) rc = parse_option(a, argc, argv, &i);
    else if (a->path)
      rc = cli_usage_error("inspect", "takes one PATH, got '%s' and '%s'", a->path, s);
    else a->path = s;
    if (rc) return rc;
  }
  if (a->path && a->dir)
    return cli_usage_error("inspect", "takes PATH or -m DIR, not both ('%s', -m '%s')", a->path,
                           a->dir);
  if (!a->path && !a->dir) return cli_usage_error("inspect", "needs PATH or -m DIR");
  if (a->path && a->model_flag)
    return cli_usage_error("inspect", "%s applies to -m DIR only", a->model_flag);
  return CLI_OK;
}

int cmd_inspect(int argc, char **argv) {
  inspect_args a = {NULL, NULL, 64, 512, NULL};
  int rc = parse_args(argc, argv, &a);
  if (rc) return rc < 0 ? CLI_OK : rc;
  if (a.dir) return inspect_model(a.dir, (int)a.group, (int)a.chunk);
  struct stat st;
  bool not_cache = true;
  if (stat(a.path, &st) == 0 && S_ISREG(st.st_mode) && (rc = mcli_inspect_cache(a.path, &not_cache)))
    return rc;
  return not_cache ? list_tensors(a.path) : CLI_OK;
}
