/* cmd_inspect.c -- `ringlm inspect PATH`: the tensors of a safetensors
 * file or model folder, one per line in aligned columns (bytes also in
 * KiB/MiB/GiB), and their total size; of a GGUF file, its version and
 * metadata keys first, then its tensors the same way; a KV snapshot is
 * described by cmd_cache.c; `ringlm inspect -m DIR`: the model
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
  if (mi.gguf_types) printf("GGUF        %s\n", mi.gguf_types);
  if (mi.weight_bits)
    printf("weights     MLX affine %d-bit, group %d%s\n", mi.weight_bits, mi.weight_group,
           mi.gguf_types ? " (layer 0's q_proj, converted exactly)" : "");
  else printf("weights     %s\n", mi.weight_dtype);
  printf("eos ids    ");
  for (int i = 0; i < mi.n_eos; i++) printf(" %d", mi.eos[i]);
  printf(mi.n_eos ? "\n" : " (none)\n");
  print_layers(m, &mi);
  print_kv(m, group, chunk);
  rlm_model_free(m);
  return CLI_OK;
}

/* "[2, 3]" into buf. */
static void format_shape(int ndim, const int64_t *shape, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < ndim && k < n; d++)
    k += (size_t)snprintf(buf + k, n - k, d ? ", %lld" : "%lld", (long long)shape[d]);
  if (k < n) snprintf(buf + k, n - k, "]");
}

/* One line of a tensor listing, whichever format the file is in. */
typedef struct tensor_row {
  const char *name, *type;
  char shape[256];
  size_t nbytes;
} tensor_row;

/* Row i of a listing's source (an rlm_weights or an rlm_gguf). */
typedef rlm_status (*row_fn)(const void *src, size_t i, tensor_row *row, rlm_error *err);

/* Column widths of the tensor listing: each the widest of its column. */
typedef struct tensor_cols {
  int name, type, shape, bytes, human;
} tensor_cols;

static void print_row(const tensor_row *r, const tensor_cols *w) {
  char bytes[32], h[32];
  snprintf(bytes, sizeof bytes, "%zu", r->nbytes);
  printf("%-*s %-*s %-*s %*s", w->name, r->name, w->type, r->type, w->shape, r->shape, w->bytes,
         bytes);
  if (*human(h, sizeof h, (double)r->nbytes)) printf("  %*s", w->human, h);
  printf("\n");
}

static int max_int(int a, int b) { return a > b ? a : b; }

/* Two passes: the widths, then the rows (the table is small beside the
 * data); then "<counts>N tensors, B bytes (...)". */
static int print_tensors(const void *src, size_t n, row_fn get, const char *counts) {
  tensor_cols cols = {60, 5, 0, 0, 0}; /* names pad to 60 at least, as before */
  size_t total = 0;
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < n; i++) {
      tensor_row r;
      char buf[32];
      rlm_error err = {0};
      if (get(src, i, &r, &err)) return cli_fail(&err);
      if (pass) {
        print_row(&r, &cols);
        total += r.nbytes;
        continue;
      }
      cols.name = max_int(cols.name, (int)strlen(r.name));
      cols.type = max_int(cols.type, (int)strlen(r.type));
      cols.shape = max_int(cols.shape, (int)strlen(r.shape));
      cols.bytes = max_int(cols.bytes, snprintf(buf, sizeof buf, "%zu", r.nbytes));
      cols.human = max_int(cols.human, (int)strlen(human(buf, sizeof buf, (double)r.nbytes)));
    }
  }
  char h[32];
  printf("%s%zu tensor%s, %zu bytes (%.2f MB%s%s)\n", counts, n, cli_s((long)n), total,
         (double)total / 1e6, total >= 1024 ? ", " : "", human(h, sizeof h, (double)total));
  return CLI_OK;
}

static rlm_status weights_row(const void *src, size_t i, tensor_row *row, rlm_error *err) {
  rlm_tensor_info t;
  rlm_status rc = rlm_weights_get(src, i, &t, err);
  if (rc) return rc;
  *row = (tensor_row){.name = t.name, .type = rlm_dtype_name(t.dtype), .nbytes = t.nbytes};
  format_shape(t.ndim, t.shape, row->shape, sizeof row->shape);
  return RLM_OK;
}

static int list_tensors(const char *path) {
  rlm_error err = {0};
  rlm_weights *w;
  if (rlm_weights_open(&w, path, &err)) return cli_fail(&err);
  int rc = print_tensors(w, rlm_weights_count(w), weights_row, "");
  rlm_weights_free(w);
  return rc;
}

/* ---- GGUF ---------------------------------------------------------------- */

static rlm_status gguf_row(const void *src, size_t i, tensor_row *row, rlm_error *err) {
  rlm_gguf_tensor_info t;
  rlm_status rc = rlm_gguf_tensor_get(src, i, &t, err);
  if (rc) return rc;
  *row = (tensor_row){.name = t.name, .type = t.type, .nbytes = t.nbytes};
  format_shape(t.n_dims, t.dims, row->shape, sizeof row->shape);
  return RLM_OK;
}

/* Every key, its type and its value as the library renders it (long
 * strings and arrays cut), in aligned columns; keys wider than 60 bytes
 * push their own line out rather than the whole column. */
static int print_keys(const rlm_gguf *g) {
  int wkey = 0, wtype = 0;
  char value[512];
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < rlm_gguf_key_count(g); i++) {
      rlm_gguf_key_info k;
      rlm_error err = {0};
      if (rlm_gguf_key_get(g, i, &k, value, pass ? sizeof value : 0, &err)) return cli_fail(&err);
      if (pass) printf("%-*s %-*s %s\n", wkey, k.key, wtype, k.type, value);
      const int len = (int)strlen(k.key);
      wkey = max_int(wkey, len < 60 ? len : 60);
      wtype = max_int(wtype, (int)strlen(k.type));
    }
  }
  return CLI_OK;
}

/* The version, every key, then every tensor (its shape in GGUF's order,
 * the fastest-varying dimension first). */
static int inspect_gguf(const char *path) {
  rlm_error err = {0};
  rlm_gguf *g;
  if (rlm_gguf_open(&g, path, &err)) return cli_fail(&err);
  const size_t n_keys = rlm_gguf_key_count(g);
  printf("GGUF version %u, alignment %u\n", (unsigned)rlm_gguf_version(g),
         (unsigned)rlm_gguf_alignment(g));
  int rc = print_keys(g);
  char counts[64];
  snprintf(counts, sizeof counts, "%zu key%s, ", n_keys, cli_s((long)n_keys));
  if (!rc && rlm_gguf_tensor_count(g)) printf("\n");
  if (!rc) rc = print_tensors(g, rlm_gguf_tensor_count(g), gguf_row, counts);
  rlm_gguf_free(g);
  return rc;
}

static bool ends_with(const char *s, const char *tail) {
  size_t a = strlen(s), b = strlen(tail);
  return a >= b && strcmp(s + a - b, tail) == 0;
}

/* A .gguf name, or a file that starts with the GGUF magic. */
static bool is_gguf(const char *path) {
  if (ends_with(path, ".gguf")) return true;
  char magic[4];
  FILE *f = fopen(path, "rb");
  bool yes = f && fread(magic, 1, 4, f) == 4 && memcmp(magic, "GGUF", 4) == 0;
  if (f) fclose(f);
  return yes;
}

static const char inspect_help[] =
    "usage: ringlm inspect PATH\n"
    "       ringlm inspect -m DIR [--kv-group-size G] [--prefill-chunk N]\n"
    "\n"
    "The first form lists every tensor of a .safetensors file or a model folder:\n"
    "name, dtype, shape, bytes (and KiB/MiB/GiB), then the total. For a GGUF\n"
    "file (a .gguf name, or the GGUF magic) it prints the version, every\n"
    "metadata key with its type and value (long strings and arrays cut), then\n"
    "the tensors (ggml type; shape in GGUF order, fastest dimension first).\n"
    "The second describes the model as ringlm runs it: architecture, each\n"
    "layer's type (sliding window or full attention), head dim and KV heads,\n"
    "parameters, weight format, end-of-sequence ids, and the KV bytes per\n"
    "token and ring bytes for dense, 8..2-bit, K8V4 and K4V8 caches.\n"
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
  if (is_gguf(a.path)) return inspect_gguf(a.path);
  struct stat st;
  bool not_cache = true;
  if (stat(a.path, &st) == 0 && S_ISREG(st.st_mode) && (rc = mcli_inspect_cache(a.path, &not_cache)))
    return rc;
  return not_cache ? list_tensors(a.path) : CLI_OK;
}
