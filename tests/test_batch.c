/* test_batch.c -- batched sessions: rows of one session against the same
 * sequences run alone, on every fixture architecture.
 *
 * Batched = alone: requests with different prompt lengths (longer than the
 * fixtures' 16-token sliding window, so rings wrap) join a session of B
 * rows as rows free up, prefill in the same passes as other rows' decode
 * steps, generate greedily and leave; every step's logits must equal the
 * request run alone in a 1-row session (within 1e-5 x max |logit| with
 * dense f32 KV) and so must every token. Rollback through the session: rows
 * whose rings wrapped feed rejected tokens, forget different numbers of
 * them, and must then give the logits of rows that never saw them. Also:
 * the n_ctx budget (RLM_KV_FULL), all-or-nothing failures, refused
 * rollbacks, and no allocation in batched decode steps.
 */
#include "model/model.h"
#include "test.h"

#include <jansson.h>

static const char *g_src;

static const char *const archs[] = {"llama", "qwen3", "mistral", "gemma3_text", "gemma4_text",
                                    "gemma4_keqv", "gemma4_moe"};
enum { N_ARCHS = sizeof archs / sizeof *archs, MAX_GEN = 12, MAX_REQ = 12, V_MAX = 512 };

static int32_t g_prompt[96];

static rlm_model *load(const char *arch) {
  char dir[512], path[600];
  snprintf(dir, sizeof dir, "%s/tests/fixtures/models/%s", g_src, arch);
  snprintf(path, sizeof path, "%s/fixture.json", dir);
  json_error_t je;
  json_t *j = json_load_file(path, 0, &je), *p = json_object_get(j, "prompt_ids");
  for (int i = 0; i < 96; i++) g_prompt[i] = (int32_t)json_integer_value(json_array_get(p, i));
  json_decref(j);
  rlm_model *m = NULL;
  rlm_error err;
  CHECK_EQ(rlm_model_load(&m, dir, &err), RLM_OK);
  return m;
}

static rlm_session *open_rows(rlm_model *m, int rows, int chunk, int k_bits, int v_bits) {
  rlm_session_params p = rlm_session_params_default();
  p.n_rows = rows, p.prefill_chunk = chunk, p.k_bits = k_bits, p.v_bits = v_bits, p.n_threads = 2, p.kv_group_size = 32;
  rlm_session *s = NULL;
  rlm_error err;
  CHECK_EQ(rlm_session_create(&s, m, &p, &err), RLM_OK);
  if (!s) test_note("%s", err.msg);
  return s;
}

static int argmax(const float *x, int n) {
  int b = 0;
  for (int i = 1; i < n; i++) b = x[i] > x[b] ? i : b;
  return b;
}

/* Request i: a slice of the fixture prompt, its own length, its own -n. */
typedef struct request {
  const int32_t *prompt;
  int n_prompt, n_gen;
  int32_t gen[MAX_GEN];
  float logits[MAX_GEN][V_MAX]; /* alone: before each generated token */
} request;

static void make_requests(request *rq, int n) {
  for (int i = 0; i < n; i++) {
    rq[i].prompt = g_prompt + (i * 7) % 40;
    rq[i].n_prompt = 3 + (i * 13) % 53; /* 3..55: some past the window */
    rq[i].n_gen = 2 + (i * 5) % (MAX_GEN - 1);
  }
}

/* Greedy alone in a 1-row session; prefill in one eval (its own chunks). */
static void run_alone(rlm_model *m, request *r, int chunk, int kb, int vb) {
  const int V = rlm_model_vocab_size(m);
  rlm_session *s = open_rows(m, 1, chunk, kb, vb);
  rlm_error err;
  if (!s) return;
  CHECK_EQ(rlm_session_eval(s, r->prompt, r->n_prompt, r->logits[0], false, &err), RLM_OK);
  for (int k = 0; k < r->n_gen; k++) {
    r->gen[k] = argmax(r->logits[k], V);
    if (k + 1 < r->n_gen) CHECK_EQ(rlm_session_eval(s, &r->gen[k], 1, r->logits[k + 1], false, &err), RLM_OK);
  }
  rlm_session_free(s);
}

typedef struct slot {
  int req;      /* -1: free */
  int fed;      /* prompt tokens fed so far */
  int k;        /* tokens generated */
} slot;

static double rel_err(const float *a, const float *b, int n) {
  double mx = 0, d = 0;
  for (int i = 0; i < n; i++) mx = fmax(mx, fabs(b[i])), d = fmax(d, fabs((double)a[i] - b[i]));
  return d / (mx + 1e-30);
}

/* One step of the continuous batch: every busy row feeds its next prompt
 * piece (at most `piece` tokens) or its last token; returns the worst
 * relative logit error against the alone runs, -1 on a token mismatch. */
static double batch_step(rlm_session *s, slot *sl, int B, request *rq, int piece, int32_t *ids,
                         int32_t *rows, float *lg) {
  const int V = rlm_model_vocab_size(s->m);
  int n = 0, who[64];
  for (int b = 0; b < B; b++) {
    if (sl[b].req < 0) continue;
    request *r = &rq[sl[b].req];
    if (sl[b].fed < r->n_prompt) {
      int take = RLM_MIN(piece, r->n_prompt - sl[b].fed);
      for (int j = 0; j < take; j++) ids[n] = r->prompt[sl[b].fed + j], rows[n++] = b;
      sl[b].fed += take;
    } else {
      ids[n] = r->gen[sl[b].k - 1], rows[n++] = b;
    }
  }
  if (!n) return 0;
  rlm_error err;
  CHECK_EQ(rlm_session_decode(s, &(rlm_batch){n, ids, rows, NULL}, lg, &err), RLM_OK);
  double worst = 0;
  int w = 0;
  for (int b = 0; b < B; b++) {
    if (sl[b].req < 0) continue;
    request *r = &rq[sl[b].req];
    who[w] = b;
    const float *got = lg + (size_t)w++ * V;
    if (sl[b].fed < r->n_prompt) continue; /* mid-prompt: logits unused */
    worst = fmax(worst, rel_err(got, r->logits[sl[b].k], V));
    if (argmax(got, V) != r->gen[sl[b].k]) return -1;
    if (++sl[b].k == r->n_gen) sl[b].req = -1; /* leaves; the row is reused */
  }
  (void)who;
  return worst;
}

/* Requests through B rows, joining as rows free up. */
static double run_batched(rlm_model *m, request *rq, int n_req, int B, int chunk, int piece, int kb,
                          int vb) {
  rlm_session *s = open_rows(m, B, chunk, kb, vb);
  if (!s) return -1;
  slot sl[8];
  int32_t ids[512], rows[512];
  float *lg = malloc(sizeof(float) * 64 * V_MAX);
  int next = 0, steps = 0;
  double worst = 0;
  rlm_error err;
  for (int b = 0; b < B; b++) sl[b].req = -1;
  for (;;) {
    for (int b = 0; b < B && next < n_req; b++) /* a freed row takes the next request */
      if (sl[b].req < 0 && (steps % 2 == 0 || b == 0)) {
        CHECK_EQ(rlm_session_row_clear(s, b, &err), RLM_OK);
        sl[b] = (slot){next++, 0, 0};
      }
    bool busy = false;
    for (int b = 0; b < B; b++) busy = busy || sl[b].req >= 0;
    if (!busy && next == n_req) break;
    double e = batch_step(s, sl, B, rq, piece, ids, rows, lg);
    if (e < 0) {
      worst = -1;
      break;
    }
    worst = fmax(worst, e);
    steps++;
  }
  free(lg);
  rlm_session_free(s);
  return worst;
}

static void check_batched_arch(const char *arch) {
  rlm_model *m = load(arch);
  if (!m) return;
  CHECK(rlm_model_vocab_size(m) <= V_MAX);
  static request rq[MAX_REQ];
  make_requests(rq, MAX_REQ);
  for (int kv = 0; kv < 2; kv++) { /* dense f32 KV, then 4-bit K with 8-bit V */
    const int kb = kv ? 4 : 0, vb = kv ? 8 : 0;
    for (int i = 0; i < MAX_REQ; i++) run_alone(m, &rq[i], 16, kb, vb);
    for (int B = 1; B <= 8; B = B < 4 ? B + 1 : B * 2) {
      double e = run_batched(m, rq, MAX_REQ, B, 16, 1 + B * 3, kb, vb);
      test_note("%s kv %s B=%d: worst logit error %.3g", arch, kv ? "k4v8" : "dense", B, e);
      CHECK(e >= 0);               /* tokens equal */
      if (!kv) CHECK(e <= 1e-5);   /* dense f32 KV: logits equal */
    }
  }
  rlm_model_free(m);
}

TEST(batched_equals_alone) {
  for (int a = 0; a < N_ARCHS; a++) check_batched_arch(archs[a]);
}

/* Rows wrap their rings (40-token prompts, window 16), feed 6 more tokens
 * in one pass, keep 0, 2, 4 or 6 of them, then feed one token: the logits
 * equal those of rows fed only the kept tokens. */
static void check_rollback_arch(const char *arch, int kb, int vb, int64_t max_kv, int sinks) {
  rlm_model *m = load(arch);
  if (!m) return;
  const int V = rlm_model_vocab_size(m), B = 4, P = 40, X = 6;
  rlm_session_params p = rlm_session_params_default();
  p.n_rows = B, p.prefill_chunk = 8, p.k_bits = kb, p.v_bits = vb, p.max_kv = max_kv, p.kv_sinks = sinks, p.kv_group_size = 32;
  rlm_session *s = NULL, *ref = NULL;
  rlm_error err;
  CHECK_EQ(rlm_session_create(&s, m, &p, &err), RLM_OK);
  CHECK_EQ(rlm_session_create(&ref, m, &p, &err), RLM_OK);
  int32_t ids[B * (P + X)], rows[B * (P + X)];
  float *lg = malloc(sizeof(float) * B * (X + 1) * V), *lr = malloc(sizeof(float) * B * V);
  int n = 0;
  for (int b = 0; b < B; b++)
    for (int j = 0; j < P; j++) ids[n] = g_prompt[b + j], rows[n++] = b;
  CHECK_EQ(rlm_session_decode(s, &(rlm_batch){n, ids, rows, NULL}, lg, &err), RLM_OK);
  CHECK_EQ(rlm_session_decode(ref, &(rlm_batch){n, ids, rows, NULL}, lg, &err), RLM_OK);
  /* the "drafts": X tokens per row, all logits wanted, as a verification */
  bool want[B * X];
  n = 0;
  for (int b = 0; b < B; b++)
    for (int j = 0; j < X; j++) ids[n] = g_prompt[50 + b + j], rows[n] = b, want[n++] = true;
  CHECK_EQ(rlm_session_decode(s, &(rlm_batch){n, ids, rows, want}, lg, &err), RLM_OK);
  /* row b keeps 2b of them; the reference row is fed just those */
  n = 0;
  for (int b = 0; b < B; b++) {
    CHECK_EQ(rlm_session_rollback(s, b, X - 2 * b, &err), RLM_OK);
    CHECK_EQ(rlm_session_row_position(s, b), P + 2 * b);
    for (int j = 0; j < 2 * b; j++) ids[n] = g_prompt[50 + b + j], rows[n++] = b;
  }
  CHECK_EQ(rlm_session_decode(ref, &(rlm_batch){n, ids, rows, NULL}, NULL, &err), RLM_OK);
  n = 0;
  for (int b = 0; b < B; b++) ids[n] = g_prompt[80 + b], rows[n++] = b;
  CHECK_EQ(rlm_session_decode(s, &(rlm_batch){n, ids, rows, NULL}, lg, &err), RLM_OK);
  CHECK_EQ(rlm_session_decode(ref, &(rlm_batch){n, ids, rows, NULL}, lr, &err), RLM_OK);
  for (int b = 0; b < B; b++) {
    double e = rel_err(lg + (size_t)b * V, lr + (size_t)b * V, V);
    test_note("%s kv k%dv%d max_kv %lld sinks %d row %d: %.3g", arch, kb, vb, (long long)max_kv, sinks, b, e);
    CHECK(e <= 1e-6);
  }
  free(lg), free(lr);
  rlm_session_free(s), rlm_session_free(ref);
  rlm_model_free(m);
}

TEST(ragged_rollback_after_wrap) {
  for (int a = 0; a < N_ARCHS; a++) {
    check_rollback_arch(archs[a], 0, 0, 0, 0);
    check_rollback_arch(archs[a], 4, 4, 0, 0);
    check_rollback_arch(archs[a], 8, 4, 0, 0);
    check_rollback_arch(archs[a], 0, 0, 24, 4); /* every layer a ring with 4 sinks */
  }
}

/* A row's state image restored into another row (which held something
 * else) continues exactly as the original: rings past their wrap,
 * quantized K/V, KV-shared layers. A damaged image is refused. */
static void check_row_state_arch(const char *arch, int kb, int vb, int64_t max_kv) {
  rlm_model *m = load(arch);
  if (!m) return;
  const int V = rlm_model_vocab_size(m), P = 40;
  rlm_session_params p = rlm_session_params_default();
  p.n_rows = 3, p.prefill_chunk = 8, p.k_bits = kb, p.v_bits = vb, p.max_kv = max_kv, p.kv_group_size = 32;
  rlm_session *s = NULL;
  rlm_error err;
  CHECK_EQ(rlm_session_create(&s, m, &p, &err), RLM_OK);
  int32_t ids[P], rows[P];
  float *a = malloc(sizeof(float) * 2 * V), *b = a + V;
  for (int j = 0; j < P; j++) ids[j] = g_prompt[j], rows[j] = 0;
  CHECK_EQ(rlm_session_decode(s, &(rlm_batch){P, ids, rows, NULL}, a, &err), RLM_OK);
  for (int j = 0; j < 20; j++) ids[j] = g_prompt[60 + j], rows[j] = 1; /* row 1: other text */
  CHECK_EQ(rlm_session_decode(s, &(rlm_batch){20, ids, rows, NULL}, a, &err), RLM_OK);
  void *img = NULL;
  size_t len = 0;
  CHECK_EQ(rlm_session_row_save(s, 0, NULL, 0, &img, &len, &err), RLM_OK);
  CHECK_EQ(rlm_session_row_restore(s, 1, img, len, &err), RLM_OK);
  CHECK_EQ(rlm_session_row_position(s, 1), P);
  int32_t next[2] = {g_prompt[90], g_prompt[90]}, rr[2] = {0, 1};
  CHECK_EQ(rlm_session_decode(s, &(rlm_batch){2, next, rr, (const bool[]){true, true}}, a, &err), RLM_OK);
  CHECK(rel_err(a, b, V) <= 1e-6);
  test_note("%s k%dv%d max_kv %lld: %zu bytes, restored row err %.3g", arch, kb, vb, (long long)max_kv,
            len, rel_err(a, b, V));
  ((unsigned char *)img)[len / 2] ^= 1; /* a flipped bit: the layer's checksum fails */
  CHECK_EQ(rlm_session_row_restore(s, 2, img, len, &err), RLM_ERR_FORMAT);
  CHECK(strstr(err.msg, "checksum") != NULL);
  CHECK_EQ(rlm_session_row_restore(s, 2, img, 10, &err), RLM_ERR_FORMAT);
  CHECK_EQ(rlm_session_row_position(s, 2), 0);
  rlm_free(img);
  free(a);
  rlm_session_free(s);
  rlm_model_free(m);
}

TEST(row_state_restores_into_another_row) {
  for (int a = 0; a < N_ARCHS; a++) {
    check_row_state_arch(archs[a], 0, 0, 0);
    check_row_state_arch(archs[a], 8, 4, 0);
    check_row_state_arch(archs[a], 4, 4, 24);
  }
}

/* A released row gives its storage back and then works as a fresh one. */
TEST(released_row_is_fresh) {
  for (int a = 0; a < N_ARCHS; a++) {
    rlm_model *m = load(archs[a]);
    if (!m) continue;
    const int V = rlm_model_vocab_size(m), P = 40;
    rlm_session *s = open_rows(m, 2, 8, 4, 4);
    rlm_error err;
    int32_t ids[2 * P], rows[2 * P];
    float *lg = malloc(sizeof(float) * 2 * V);
    for (int j = 0; j < P; j++) ids[j] = g_prompt[j], rows[j] = 0;
    CHECK_EQ(rlm_session_decode(s, &(rlm_batch){P, ids, rows, NULL}, lg, &err), RLM_OK);
    const size_t held = rlm_session_row_kv_bytes(s, 0), fresh = rlm_session_row_kv_bytes(s, 1);
    CHECK(held > fresh + (size_t)P * 8); /* at least a byte per layer and token */
    CHECK_EQ(rlm_session_row_release(s, 0, &err), RLM_OK);
    CHECK_EQ(rlm_session_row_kv_bytes(s, 0), fresh); /* nothing but the row bookkeeping */
    CHECK_EQ(rlm_session_row_position(s, 0), 0);
    CHECK_EQ(rlm_session_row_release(s, 2, &err), RLM_ERR_INVALID);
    for (int j = 0; j < 2 * P; j++) ids[j] = g_prompt[j % P], rows[j] = j / P; /* both rows, same text */
    CHECK_EQ(rlm_session_decode(s, &(rlm_batch){2 * P, ids, rows, NULL}, lg, &err), RLM_OK);
    CHECK(rel_err(lg, lg + V, V) <= 1e-6);
    CHECK_EQ(rlm_session_row_kv_bytes(s, 0), held);
    free(lg);
    rlm_session_free(s);
    rlm_model_free(m);
  }
}

/* Bad batches, the n_ctx budget and refused rollbacks change nothing. */
TEST(all_or_nothing) {
  rlm_model *m = load("gemma3_text");
  if (!m) return;
  rlm_session_params p = rlm_session_params_default();
  p.n_rows = 3, p.prefill_chunk = 4, p.n_ctx = 20;
  rlm_session *s = NULL;
  rlm_error err;
  CHECK_EQ(rlm_session_create(&s, m, &p, &err), RLM_OK);
  int32_t ids[24] = {0}, rows[24] = {0};
  for (int i = 0; i < 24; i++) ids[i] = g_prompt[i], rows[i] = i < 10 ? 0 : 1;
  CHECK_EQ(rlm_session_decode(s, &(rlm_batch){12, ids, rows, NULL}, NULL, &err), RLM_OK);
  CHECK_EQ(rlm_session_row_position(s, 0), 10);
  CHECK_EQ(rlm_session_row_position(s, 1), 2);
  /* a bad id in the middle of a later pass: nothing fed */
  ids[9] = 100000;
  CHECK_EQ(rlm_session_decode(s, &(rlm_batch){12, ids, rows, NULL}, NULL, &err), RLM_ERR_INVALID);
  CHECK_STR_CONTAINS(err.msg, "index 9");
  ids[9] = 5;
  /* a row split into two runs */
  int32_t split[3] = {0, 1, 0};
  CHECK_EQ(rlm_session_decode(s, &(rlm_batch){3, ids, split, NULL}, NULL, &err), RLM_ERR_INVALID);
  CHECK_STR_CONTAINS(err.msg, "not consecutive");
  int32_t far[1] = {3};
  CHECK_EQ(rlm_session_decode(s, &(rlm_batch){1, ids, far, NULL}, NULL, &err), RLM_ERR_INVALID);
  /* row 1 at 2 + 19 > n_ctx 20, row 0 fine: the whole batch is refused */
  for (int i = 0; i < 24; i++) rows[i] = i < 2 ? 0 : 1;
  CHECK_EQ(rlm_session_decode(s, &(rlm_batch){21, ids, rows, NULL}, NULL, &err), RLM_KV_FULL);
  CHECK_STR_CONTAINS(err.msg, "n_ctx 20");
  CHECK_EQ(rlm_session_row_position(s, 0), 10);
  CHECK_EQ(rlm_session_row_position(s, 1), 2);
  CHECK_EQ(rlm_session_rollback(s, 1, 3, &err), RLM_ERR_INVALID);
  CHECK_EQ(rlm_session_rollback(s, 5, 1, &err), RLM_ERR_INVALID);
  CHECK_EQ(rlm_session_row_position(s, 1), 2);
  rlm_session_free(s);
  /* a ring cannot forget more than its slack: 40 tokens past a 16-token
   * window, then 12 more fed since the last rollback point */
  p.n_ctx = 0, p.prefill_chunk = 4, p.n_rows = 1;
  CHECK_EQ(rlm_session_create(&s, m, &p, &err), RLM_OK);
  CHECK_EQ(rlm_session_eval(s, g_prompt, 40, NULL, false, &err), RLM_OK);
  CHECK_EQ(rlm_session_rollback(s, 0, 12, &err), RLM_ERR_INVALID);
  CHECK_STR_CONTAINS(err.msg, "ring");
  CHECK_EQ(rlm_session_row_position(s, 0), 40);
  CHECK_EQ(rlm_session_rollback(s, 0, 4, &err), RLM_OK);
  CHECK_EQ(rlm_session_row_position(s, 0), 36);
  rlm_session_free(s);
  rlm_model_free(m);
}

/* Out of memory at any allocation of a batch that grows the caches (rows
 * crossing 256 slots) leaves every row as it was: the same batch then
 * gives the logits of a session that never failed. */
TEST(out_of_memory_changes_nothing) {
  rlm_model *m = load("gemma3_text");
  if (!m) return;
  const int V = rlm_model_vocab_size(m), B = 3, P = 250, X = 10;
  rlm_session *s = open_rows(m, B, 8, 0, 0), *ref = open_rows(m, B, 8, 0, 0);
  if (!s || !ref) return;
  static int32_t ids[3 * 250], rows[3 * 250];
  rlm_error err;
  int n = 0;
  for (int b = 0; b < B; b++)
    for (int j = 0; j < P; j++) ids[n] = g_prompt[(b * 5 + j) % 96], rows[n++] = b;
  CHECK_EQ(rlm_session_decode(s, &(rlm_batch){n, ids, rows, NULL}, NULL, &err), RLM_OK);
  CHECK_EQ(rlm_session_decode(ref, &(rlm_batch){n, ids, rows, NULL}, NULL, &err), RLM_OK);
  n = 0;
  for (int b = 0; b < B; b++)
    for (int j = 0; j < X; j++) ids[n] = g_prompt[(b + 3 * j) % 96], rows[n++] = b;
  float *lg = malloc(sizeof(float) * B * V), *lr = malloc(sizeof(float) * B * V);
  rlm_status rc = RLM_ERR_NOMEM;
  int failures = 0;
  for (int nth = 0; rc == RLM_ERR_NOMEM && nth < 1000; nth++) {
    rlm__alloc_fail_at(nth);
    rc = rlm_session_decode(s, &(rlm_batch){n, ids, rows, NULL}, lg, &err);
    rlm__alloc_fail_at(-1);
    if (rc != RLM_ERR_NOMEM) break;
    failures++;
    for (int b = 0; b < B; b++) CHECK_EQ(rlm_session_row_position(s, b), P);
  }
  CHECK_EQ(rc, RLM_OK);
  CHECK(failures > 0); /* the batch did allocate: growth was tested */
  CHECK_EQ(rlm_session_decode(ref, &(rlm_batch){n, ids, rows, NULL}, lr, &err), RLM_OK);
  CHECK(!memcmp(lg, lr, sizeof(float) * B * V));
  free(lg), free(lr);
  rlm_session_free(s), rlm_session_free(ref);
  rlm_model_free(m);
}

/* Batched decode and verification steps allocate nothing once the caches
 * have room (n_ctx reserves it). */
TEST(batched_steps_do_not_allocate) {
  static const char *const a2[] = {"gemma3_text", "gemma4_text", "gemma4_moe"};
  for (int a = 0; a < 3; a++) {
    rlm_model *m = load(a2[a]);
    if (!m) continue;
    rlm_session_params p = rlm_session_params_default();
    p.n_rows = 4, p.prefill_chunk = 16, p.n_ctx = 128, p.k_bits = 4, p.v_bits = 4, p.kv_group_size = 32;
    rlm_session *s = NULL;
    rlm_error err;
    CHECK_EQ(rlm_session_create(&s, m, &p, &err), RLM_OK);
    const int V = rlm_model_vocab_size(m);
    float *lg = malloc(sizeof(float) * 16 * V);
    int32_t ids[16], rows[16];
    for (int b = 0; b < 4; b++) CHECK_EQ(rlm_session_decode(s, &(rlm_batch){1, g_prompt + b, (int32_t[]){b}, NULL}, lg, &err), RLM_OK);
    uint64_t before = rlm__alloc_count();
    for (int step = 0; step < 20; step++) {
      int n = 0;
      for (int b = 0; b < 4; b++)
        for (int j = 0; j < 1 + (step + b) % 3; j++) ids[n] = g_prompt[step + b + j], rows[n++] = b;
      CHECK_EQ(rlm_session_decode(s, &(rlm_batch){n, ids, rows, NULL}, lg, &err), RLM_OK);
      for (int b = 0; b < 4; b++) CHECK_EQ(rlm_session_rollback(s, b, (step + b) % 3, &err), RLM_OK);
    }
    test_note("%s", a2[a]);
    CHECK_EQ(rlm__alloc_count() - before, 0);
    free(lg);
    rlm_session_free(s);
    rlm_model_free(m);
  }
}

/* rlm_session_host_alloc: memory the session writes logits into as into
 * any other (on the CPU, heap memory behind a header that rlm_host_free
 * reads); zero bytes, a NULL session and a failed allocation give NULL. */
TEST(host_memory_holds_logits) {
  rlm_model *m = load("llama");
  if (!m) return;
  rlm_session *s = NULL, *ref = NULL;
  rlm_error err;
  rlm_session_params p = rlm_session_params_default();
  p.n_rows = 2;
  CHECK_EQ(rlm_session_create(&s, m, &p, &err), RLM_OK);
  CHECK_EQ(rlm_session_create(&ref, m, &p, &err), RLM_OK);
  const int V = rlm_model_vocab_size(m);
  float *lg = rlm_session_host_alloc(s, sizeof(float) * 2 * V), *lr = malloc(sizeof(float) * 2 * V);
  CHECK(lg != NULL);
  CHECK_EQ((uintptr_t)lg % 16, 0);
  const rlm_batch b = {4, g_prompt, (int32_t[]){0, 0, 1, 1}, NULL};
  CHECK_EQ(rlm_session_decode(s, &b, lg, &err), RLM_OK);
  CHECK_EQ(rlm_session_decode(ref, &b, lr, &err), RLM_OK);
  CHECK(!memcmp(lg, lr, sizeof(float) * 2 * V));
  CHECK(rlm_session_host_alloc(s, 0) == NULL);
  CHECK(rlm_session_host_alloc(NULL, 64) == NULL);
  CHECK(rlm_session_host_alloc(s, SIZE_MAX) == NULL);
  rlm__alloc_fail_at(0);
  CHECK(rlm_session_host_alloc(s, 64) == NULL);
  rlm__alloc_fail_at(-1);
  rlm_session_free(s); /* the memory outlives its session */
  lg[0] = 1.0f;
  rlm_host_free(lg);
  rlm_host_free(NULL);
  free(lr);
  rlm_session_free(ref);
  rlm_model_free(m);
}

int main(void) {
  g_src = t_env("RINGLM_SOURCE_DIR");
  if (!g_src) return 1;
  RUN(batched_equals_alone);
  RUN(ragged_rollback_after_wrap);
  RUN(row_state_restores_into_another_row);
  RUN(released_row_is_fresh);
  RUN(all_or_nothing);
  RUN(out_of_memory_changes_nothing);
  RUN(batched_steps_do_not_allocate);
  RUN(host_memory_holds_logits);
  return test_summary();
}
