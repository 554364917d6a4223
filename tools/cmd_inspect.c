/* cmd_inspect.c -- `ringlm inspect PATH`: the tensors of a safetensors
 * file or model folder, one per line, and their total size; `ringlm
 * inspect -m DIR`: the model as ringlm runs it (architecture, layer types
 * and windows, parameters, weight format, KV bytes for each --kv-bits). */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static void print_layers(const rlm_model *m, const rlm_model_info *mi) {
  printf("layers      ");
  for (int i = 0; i < mi->n_layers; i++) {
    rlm_layer_info li;
    rlm_model_layer_info(m, i, &li);
    printf("%s%s", li.sliding ? "S" : "F", li.kv_donor >= 0 ? "*" : "");
    printf(i + 1 < mi->n_layers ? " " : "\n");
  }
  printf("            (S: sliding window %d, F: full attention, *: attends an earlier layer's KV)\n",
         mi->sliding_window);
  for (int i = 0; i < mi->n_layers; i++) {
    rlm_layer_info li;
    rlm_model_layer_info(m, i, &li);
    printf("  layer %-3d %-8s head_dim %-4d kv heads %-3d", i, li.sliding ? "sliding" : "full", li.head_dim,
           li.n_kv_heads);
    if (li.kv_donor >= 0) printf(" KV of layer %d", li.kv_donor);
    printf("\n");
  }
}

/* KV bytes per token (growing layers) and ring bytes for each choice. */
static void print_kv(const rlm_model *m, int group, int chunk) {
  static const struct { const char *name; int k, v; } ch[] = {
      {"dense", 0, 0}, {"8-bit", 8, 8}, {"6-bit", 6, 6}, {"5-bit", 5, 5}, {"4-bit", 4, 4},
      {"3-bit", 3, 3}, {"2-bit", 2, 2}, {"k8v4", 8, 4}, {"k4v8", 4, 8}};
  printf("KV cache    group %d, prefill chunk %d (rings hold window + chunk - 1 slots)\n", group, chunk);
  printf("  %-7s %18s %18s\n", "kv-bits", "bytes/token", "ring bytes");
  for (size_t i = 0; i < sizeof ch / sizeof *ch; i++) {
    rlm_session_params p = rlm_session_params_default();
    p.k_bits = ch[i].k, p.v_bits = ch[i].v, p.kv_group_size = group, p.prefill_chunk = chunk;
    double grow, ring;
    rlm_error err = {0};
    if (rlm_model_kv_footprint(m, &p, &grow, &ring, &err)) printf("  %-7s %s\n", ch[i].name, err.msg);
    else printf("  %-7s %18.1f %18.0f\n", ch[i].name, grow, ring);
  }
}

static int inspect_model(const char *dir, int group, int chunk) {
  rlm_error err = {0};
  rlm_model *m;
  if (rlm_model_load(&m, dir, &err)) return cli_fail(&err);
  rlm_model_info mi;
  rlm_model_get_info(m, &mi);
  printf("model       %s: %d layers, hidden %d, %d heads, vocab %d\n", mi.arch, mi.n_layers, mi.hidden,
         mi.n_heads, mi.vocab);
  printf("parameters  %lld (%.2f M)\n", (long long)mi.n_params, (double)mi.n_params / 1e6);
  if (mi.weight_bits) printf("weights     MLX affine %d-bit, group %d\n", mi.weight_bits, mi.weight_group);
  else printf("weights     %s\n", mi.weight_dtype);
  printf("eos ids    ");
  for (int i = 0; i < mi.n_eos; i++) printf(" %d", mi.eos[i]);
  printf(mi.n_eos ? "\n" : " (none)\n");
  print_layers(m, &mi);
  print_kv(m, group, chunk);
  rlm_model_free(m);
  return CLI_OK;
}

static void print_shape(const rlm_tensor_info *t) {
  printf("[");
  for (int d = 0; d < t->ndim; d++) printf(d ? ", %lld" : "%lld", (long long)t->shape[d]);
  printf("]");
}

static const char inspect_help[] =
    "usage: ringlm inspect PATH\n"
    "       ringlm inspect -m DIR [--kv-group-size G] [--prefill-chunk N]\n"
    "The first lists name, dtype, shape and bytes of every tensor in a .safetensors\n"
    "file or a model folder; the second describes the model: architecture, layer\n"
    "types and windows, parameters, weight format, KV bytes for each --kv-bits.\n";

int cmd_inspect(int argc, char **argv) {
  const char *dir = NULL;
  long group = 64, chunk = 512;
  for (int i = 1; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return fputs(inspect_help, stdout), CLI_OK;
    if (!strcmp(argv[i], "-m") && v) dir = v, i++;
    else if (!strcmp(argv[i], "--kv-group-size") && cli_parse_int(argv[i], v, 32, 128, &group)) i++;
    else if (!strcmp(argv[i], "--prefill-chunk") && cli_parse_int(argv[i], v, 1, 65536, &chunk)) i++;
    else if (argc == 2) break;
    else return cli_usage_error("inspect", "unknown or incomplete option '%s'", argv[i]);
  }
  if (dir) return inspect_model(dir, (int)group, (int)chunk);
  if (argc != 2) return fputs(inspect_help, stderr), CLI_USAGE;
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
