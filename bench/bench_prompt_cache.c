/* bench_prompt_cache.c -- time to first token from a saved KV snapshot
 * against cold prefill, in one run (issue 14's benchmark).
 *
 *   bench_prompt_cache MODEL_DIR [N=8192] [--kv-bits B] [-t THREADS] [-r REPS]
 *
 * Cold: a fresh session prefills N + 1 ids and has the logits of the last
 * (time to first token). The row after N ids is saved as a snapshot file
 * (timed too). Warm: a fresh session opens the file, loads it into a row
 * and feeds the one remaining id; its logits must equal the cold run's
 * bit for bit (else the benchmark fails). Prints both times, their ratio,
 * the file's size and what every position of every layer would take. The
 * file is read from the page cache (just written): the disk is not timed. */
#include "bench.h"
#include "ringlm.h"

#include <unistd.h>

static void die(const char *what, const rlm_error *e) {
  fprintf(stderr, "bench_prompt_cache: %s: %s\n", what, e->msg);
  exit(1);
}

static rlm_session *new_session(rlm_model *m, const rlm_session_params *p) {
  rlm_session *s = NULL;
  rlm_error e;
  if (rlm_session_create(&s, m, p, &e)) die("session", &e);
  return s;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench_prompt_cache MODEL_DIR [N] [--kv-bits B] [-t T] [-r REPS]\n");
    return 2;
  }
  long n = 8192, reps = 5;
  rlm_session_params p = rlm_session_params_default();
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--kv-bits") && i + 1 < argc) p.k_bits = p.v_bits = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-t") && i + 1 < argc) p.n_threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atol(argv[++i]);
    else n = atol(argv[i]);
  }
  rlm_model *m = NULL;
  rlm_error e;
  if (rlm_model_load(&m, argv[1], &e)) die(argv[1], &e);
  const long V = rlm_model_vocab_size(m);
  int32_t *ids = xmalloc((size_t)(n + 1) * sizeof *ids);
  uint64_t r = 42;
  for (long i = 0; i <= n; i++) r = r * 6364136223846793005ull + 1442695040888963407ull, ids[i] = (int32_t)(2 + (r >> 33) % (uint64_t)(V - 2));
  float *cold = xmalloc((size_t)V * sizeof *cold), *warm = xmalloc((size_t)V * sizeof *warm);

  rlm_session *s = new_session(m, &p);
  double t0 = now_s();
  if (rlm_session_eval(s, ids, (int)n, NULL, false, &e)) die("prefill", &e);
  if (rlm_session_eval(s, ids + n, 1, cold, false, &e)) die("prefill", &e);
  const double t_cold = now_s() - t0;
  if (rlm_session_rollback(s, 0, 1, &e)) die("rollback", &e);
  char path[64];
  snprintf(path, sizeof path, "/tmp/bench_prompt_cache_%d.safetensors", (int)getpid());
  t0 = now_s();
  if (rlm_session_row_save_file(s, 0, ids, n, path, &e)) die("save", &e);
  const double t_save = now_s() - t0;
  const size_t kv_bytes = rlm_session_row_kv_bytes(s, 0);
  rlm_session_free(s);

  double *tw = xmalloc((size_t)reps * sizeof *tw);
  size_t file = 0;
  double naive = 0;
  for (long k = 0; k < reps; k++) {
    rlm_session *w = new_session(m, &p); /* a fresh process would start here */
    t0 = now_s();
    rlm_snapshot *sn = NULL;
    if (rlm_snapshot_open(&sn, path, &e) || rlm_session_row_load(w, 0, sn, &e)) die(path, &e);
    if (rlm_session_eval(w, ids + n, 1, warm, false, &e)) die("warm step", &e);
    tw[k] = now_s() - t0;
    file = rlm_snapshot_bytes(sn);
    naive = 0;
    for (int i = 0; i < rlm_snapshot_layers(sn); i++) {
      rlm_snapshot_layer_info li;
      if (!rlm_snapshot_layer(sn, i, &li, NULL) && li.stored)
        naive += (double)li.bytes / (double)li.stored * (double)li.offset;
    }
    rlm_snapshot_free(sn);
    rlm_session_free(w);
    if (memcmp(cold, warm, (size_t)V * sizeof *cold)) {
      fprintf(stderr, "bench_prompt_cache: warm logits differ from cold ones\n");
      return 1;
    }
  }
  const double t_warm = median(tw, (int)reps);
  printf("model %s, %ld-token prefix, kv-bits %d, prefill chunk %d\n", argv[1], n, p.k_bits,
         p.prefill_chunk);
  printf("cold TTFT   %9.3f s  (prefill %ld + 1 ids)\n", t_cold, n);
  printf("warm TTFT   %9.3f s  (open + check + load the file, 1 id; median of %ld)\n", t_warm, reps);
  printf("ratio       %9.2f %% of cold (%.0fx faster); logits bit-identical\n", 100 * t_warm / t_cold,
         t_cold / t_warm);
  printf("save        %9.3f s\n", t_save);
  printf("file        %9.1f MiB; all positions of all layers %.1f MiB (%.2fx); row KV in memory %.1f MiB\n",
         (double)file / 1048576, naive / 1048576, naive / (double)file, (double)kv_bytes / 1048576);
  unlink(path);
  free(tw), free(ids), free(cold), free(warm);
  rlm_model_free(m);
  return 0;
}
