/* cmd_cache.c -- prompt-cache files on the command line: `ringlm
 * cache-prompt` (mlx-lm's cache_prompt: prefill a prompt, save its KV
 * snapshot), `run --prompt-cache FILE [--prompt-cache-ro]` (llama.cpp's
 * flags: start from the file when the prompt begins with its tokens,
 * else compute and save), and `inspect CACHE` (what a snapshot holds).
 * A file that is corrupt, another model's or made with other KV settings
 * is an error (exit 1), never silently recomputed over. */
#include "model_cli.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Feeds ids[from, to) to row 0 (no logits wanted). */
static int prefill(model_ctx *c, const int32_t *ids, size_t from, size_t to) {
  rlm_error err = {0};
  if (to <= from) return CLI_OK;
  if (rlm_session_eval(c->s, ids + from, (int)(to - from), NULL, false, &err)) return cli_fail(&err);
  return CLI_OK;
}

static int save(model_ctx *c, const int32_t *ids, size_t n, const char *path) {
  rlm_error err = {0};
  if (rlm_session_row_save_file(c->s, 0, ids, (int64_t)n, path, &err)) return cli_fail(&err);
  return CLI_OK;
}

/* How many of the prompt's first ids the cache holds (its ids must be a
 * prefix of the prompt's, else 0), loaded into row 0. */
static int load_prefix(model_ctx *c, const char *path, const int32_t *ids, size_t n, size_t *n_cached) {
  rlm_error err = {0};
  rlm_snapshot *sn = NULL;
  int64_t nt = 0;
  *n_cached = 0;
  if (rlm_snapshot_open(&sn, path, &err) || rlm_snapshot_check(sn, c->s, &err)) {
    rlm_snapshot_free(sn);
    return cli_fail(&err);
  }
  const int32_t *t = rlm_snapshot_tokens(sn, &nt);
  int rc = CLI_OK;
  if (!t || nt == 0) {
    fprintf(stderr, "ringlm: %s: the snapshot records no token ids to match a prompt with\n", path);
    rc = CLI_FAIL;
  } else if ((size_t)nt <= n && !memcmp(t, ids, (size_t)nt * sizeof *ids)) {
    if (rlm_session_row_load(c->s, 0, sn, &err)) rc = cli_fail(&err);
    else *n_cached = (size_t)nt;
  }
  rlm_snapshot_free(sn);
  return rc;
}

int mcli_prompt_cache(model_ctx *c, const model_opts *o, const int32_t *ids, size_t n,
                      size_t *n_cached) {
  struct stat st;
  int rc = CLI_OK;
  *n_cached = 0;
  if (stat(o->prompt_cache_file, &st) == 0 && (rc = load_prefix(c, o->prompt_cache_file, ids, n, n_cached)))
    return rc;
  size_t have = *n_cached;
  if (have == n) { /* the whole prompt: one id goes back to be fed for logits */
    rlm_error err = {0};
    if (rlm_session_rollback(c->s, 0, 1, &err)) {
      rlm_session_row_clear(c->s, 0, NULL); /* a ring without slack: compute it */
      have = 0;
    } else {
      have = n - 1;
    }
  }
  *n_cached = have;
  if (n < 2 || have >= n - 1 || o->prompt_cache_ro) return CLI_OK;
  if ((rc = prefill(c, ids, have, n - 1))) return rc; /* all but the last id: generation feeds it */
  *n_cached = n - 1;
  return save(c, ids, n - 1, o->prompt_cache_file);
}

/* ---- cache-prompt ----------------------------------------------------------- */

static const char cache_help[] =
    "usage: ringlm cache-prompt [-m DIR] (-p TEXT | -f FILE | --ids 1,2,3) -o CACHE [options]\n"
    "Prefills the prompt (BOS added as the tokenizer says) and saves its KV state\n"
    "and token ids to CACHE, a safetensors file (docs/kv-snapshots.md), as\n"
    "mlx_lm.cache_prompt does; `ringlm run --prompt-cache CACHE` with a prompt that\n"
    "starts with the same text then prefills only the rest. The session and KV\n"
    "options must be those the cache is used with (a mismatch is an error there).\n";

int cmd_cache_prompt(int argc, char **argv) {
  model_opts o = mcli_defaults();
  int rc = mcli_parse(argc, argv, &o, "cache-prompt", cache_help);
  if (rc) return rc == MCLI_HELP ? CLI_OK : rc;
  if (!o.out) return cli_usage_error("cache-prompt", "needs -o CACHE");
  model_ctx c;
  int32_t *ids = NULL;
  size_t n;
  if ((rc = mcli_open(&o, &c, false))) return rc;
  const double t0 = cli_now_s();
  if (!(rc = mcli_prompt_ids(&o, &c, &ids, &n, NULL)) && !(rc = prefill(&c, ids, 0, n)))
    rc = save(&c, ids, n, o.out);
  if (!rc) {
    char b[32];
    fprintf(stderr, "cached %zu token%s in %.2f s: %s, %s of KV\n", n, cli_s((long)n), cli_now_s() - t0,
            o.out, cli_bytes((double)rlm_session_row_kv_bytes(c.s, 0), b, sizeof b));
  }
  free(ids);
  mcli_close(&c);
  return rc;
}

/* ---- inspect CACHE -------------------------------------------------------------- */

static void print_layers(const rlm_snapshot *sn, double *naive, double *stored) {
  printf("  %-5s %-34s %-5s %9s %9s %9s %12s\n", "layer", "kind", "dtype", "offset", "first", "stored",
         "bytes");
  for (int i = 0; i < rlm_snapshot_layers(sn); i++) {
    rlm_snapshot_layer_info li;
    if (rlm_snapshot_layer(sn, i, &li, NULL)) continue;
    if (li.cache < 0) {
      printf("  %-5d attends layer %d's KV (no cache of its own)\n", i, li.shares);
      continue;
    }
    char b[32];
    printf("  %-5d %-34s %-5s %9lld %9lld %9lld %12s\n", i, li.kind, rlm_dtype_name(li.dtype),
           (long long)li.offset, (long long)li.first, (long long)li.stored,
           cli_bytes((double)li.bytes, b, sizeof b));
    *stored += (double)li.bytes;
    if (li.stored) *naive += (double)li.bytes / (double)li.stored * (double)li.offset;
  }
}

int mcli_inspect_cache(const char *path, bool *not_cache) {
  rlm_snapshot *sn = NULL;
  rlm_error err = {0};
  *not_cache = false;
  if (rlm_snapshot_open(&sn, path, &err)) {
    *not_cache = err.code == RLM_ERR_FORMAT && strstr(err.msg, "not a ringlm KV snapshot");
    return *not_cache ? CLI_OK : cli_fail(&err);
  }
  int64_t nt;
  rlm_snapshot_tokens(sn, &nt);
  char b[32], b2[32];
  printf("KV snapshot %s (%s)\n", path, cli_bytes((double)rlm_snapshot_bytes(sn), b, sizeof b));
  printf("model       %s\n", rlm_snapshot_model(sn));
  printf("tokens      %lld (%s)\n", (long long)rlm_snapshot_position(sn),
         nt ? "their ids recorded" : "no ids recorded");
  printf("layers      %d\n", rlm_snapshot_layers(sn));
  double naive = 0, stored = 0;
  print_layers(sn, &naive, &stored);
  printf("KV bytes    %s stored; every position of every layer would be %s (%.2fx)\n",
         cli_bytes(stored, b, sizeof b), cli_bytes(naive, b2, sizeof b2), stored > 0 ? naive / stored : 1.0);
  rlm_snapshot_free(sn);
  return CLI_OK;
}
