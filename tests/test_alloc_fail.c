/* test_alloc_fail.c -- allocation-failure injection over the public API
 * (issue 15, point 5): every allocation of every path below fails in turn.
 *
 * A path is a fixed list of calls (load, create, eval, decode, save, ...)
 * on fresh objects. One run where nothing fails gives each call's result
 * (logits, ids, text, image bytes, events) and the run's allocation count
 * N; then for every k in [0, N) the run is repeated with the k-th
 * allocation failing (rlm__alloc_fail_at). The call that meets it must
 * return RLM_ERR_NOMEM with err set (or RLM_OK, the allocation having
 * been optional, and then the very same result), must leave what it
 * changes as it was (row positions, the row's contents: a following call
 * gives bit-identical results), and the rest of the run, nothing failing
 * any more, must give bit-identical results to the run where nothing
 * failed. LeakSanitizer is asked after every path (sanitized builds) and
 * again at exit.
 *
 * Paths: rlm_model_load (dense fixtures, the 4-bit embedded model);
 * rlm_session_create (rows, threads, quantized KV, max_kv rings); eval on
 * an existing session (a chunk longer than prefill_chunk, decode steps,
 * the caches' first growth and the growth past 256 slots in the chunk or
 * in a decode step, rings that wrap, KV-shared layers); a row joining a
 * multi-row session mid-flight; the embedded model's tokenizer (load,
 * encode, decode, stream); chat templates (load, parse, render); KV
 * snapshots (save, open from memory and from a file, load into a used row
 * and a fresh one; a crash-safe file write that fails leaves the old
 * file); the generation engine with a draft session (create, add, steps, a
 * 1-id request on a never-used row, a row reused by a longer request).
 * Rows that already hold a few hundred ids are restored from snapshot
 * images made once, so a run does not prefill them again; the server's
 * request parsing and answers (oai.c, compiled in by alloc_fail_oai.c).
 * Each path prints "path: N allocations, N failures injected, 0 leaks".
 *
 * Allocations through rlm__malloc & co. are counted: PCRE2's and
 * jansson's go through them (the tokenizer's general context;
 * json_set_alloc_funcs), and a JSON parse counts as one (base.h: jansson's
 * lexer cannot survive a failure, so the parse is failed as a whole).
 */
#include "base/base.h"
#include "srv.h"
#include "test.h"

#include <dirent.h>
#include <time.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define HAVE_LSAN 1
#else
#define HAVE_LSAN 0
#endif

static const char *g_src;
static char g_dir[512]; /* this run's temp folder */

enum { MAX_STEPS = 32, MAX_STATE = 8 };

/* ---- the sweep ----------------------------------------------------------- */

typedef struct path path;
struct path {
  char name[128];
  int n_steps;
  void *ctx;
  void (*reset)(path *p);                                  /* fresh objects, nothing fails */
  rlm_status (*step)(path *p, int i, rlm_error *err);      /* call i; its result via put() */
  int (*state)(path *p, int64_t *st);                      /* what a failed call keeps      */
  void (*after_fail)(path *p, int i);                      /* more checks after one (opt.)  */
  void (*verify)(path *p);                                 /* after the last call (opt.)    */
  void (*fini)(path *p);                                   /* frees every object            */
  unsigned char *out;                                      /* this call's result            */
  size_t out_len, out_cap;
  unsigned char *ref[MAX_STEPS];                           /* the results, nothing failing  */
  size_t ref_len[MAX_STEPS];
};

static void put(path *p, const void *b, size_t n) {
  if (p->out_len + n > p->out_cap) {
    size_t cap = 2 * (p->out_len + n) + 64;
    unsigned char *o = xmalloc(cap);
    if (p->out_len) memcpy(o, p->out, p->out_len);
    free(p->out);
    p->out = o, p->out_cap = cap;
  }
  if (n) memcpy(p->out + p->out_len, b, n);
  p->out_len += n;
}

static void put_i64(path *p, int64_t v) { put(p, &v, sizeof v); }

/* Call i's result equals the run where nothing failed. */
static bool same_as_ref(const path *p, int i) {
  return p->out_len == p->ref_len[i] && (!p->out_len || !memcmp(p->out, p->ref[i], p->out_len));
}

static int leak_check(void) {
#if HAVE_LSAN
  return __lsan_do_recoverable_leak_check();
#else
  return 0;
#endif
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The path run once untouched (results, N), then with each of its N
 * allocations failing in turn. */
static void sweep(path *p) {
  const double t0 = now_s();
  rlm_error err;
  p->reset(p);
  for (int i = 0; i < p->n_steps; i++) {
    p->out_len = 0;
    err = (rlm_error){0};
    rlm_status rc = p->step(p, i, &err);
    test_note("%s: reference run, call %d: %s", p->name, i, err.msg);
    CHECK_EQ(rc, RLM_OK);
    p->ref[i] = xmalloc(p->out_len);
    if (p->out_len) memcpy(p->ref[i], p->out, p->out_len);
    p->ref_len[i] = p->out_len;
  }
  if (p->verify) p->verify(p);
  p->fini(p);

  /* N, and a second clean run that must give the same results */
  p->reset(p);
  const uint64_t before = rlm__alloc_count();
  for (int i = 0; i < p->n_steps; i++) {
    p->out_len = 0;
    CHECK_EQ(p->step(p, i, &err), RLM_OK);
    test_note("%s: second clean run, call %d", p->name, i);
    CHECK(same_as_ref(p, i));
  }
  const uint64_t n = rlm__alloc_count() - before;
  p->fini(p);
  t_note[0] = 0;

  int64_t errors = 0, optional = 0;
  for (uint64_t k = 0; k < n; k++) {
    p->reset(p);
    int64_t st0[MAX_STATE], st1[MAX_STATE];
    rlm_status rc = RLM_OK;
    int i = 0;
    const uint64_t c0 = rlm__alloc_count();
    rlm__alloc_fail_at((int64_t)k);
    for (; i < p->n_steps; i++) {
      const int ns = p->state ? p->state(p, st0) : 0;
      p->out_len = 0;
      err = (rlm_error){0};
      rc = p->step(p, i, &err);
      if (rc) {
        rlm__alloc_fail_at(-1);
        test_note("%s: allocation %llu failing, call %d: %s", p->name, (unsigned long long)k, i, err.msg);
        CHECK_EQ(rc, RLM_ERR_NOMEM);
        CHECK_EQ(err.code, rc);
        CHECK(err.msg[0] != 0);
        if (p->state) {
          CHECK_EQ(p->state(p, st1), ns);
          CHECK(!memcmp(st0, st1, (size_t)ns * sizeof *st0)); /* positions as they were */
        }
        break;
      }
      test_note("%s: allocation %llu failing, call %d returned RLM_OK", p->name, (unsigned long long)k, i);
      CHECK(same_as_ref(p, i));
    }
    rlm__alloc_fail_at(-1);
    test_note("%s: allocation %llu failing: the run made fewer allocations", p->name, (unsigned long long)k);
    CHECK(rlm__alloc_count() - c0 > k); /* the injection was reached (a deterministic run) */
    if (rc) {
      errors++;
      if (p->after_fail) p->after_fail(p, i);
      for (; i < p->n_steps; i++) { /* the call again and the rest, nothing failing */
        p->out_len = 0;
        err = (rlm_error){0};
        rc = p->step(p, i, &err);
        test_note("%s: allocation %llu failed, then call %d: %s", p->name, (unsigned long long)k, i, err.msg);
        CHECK_EQ(rc, RLM_OK);
        CHECK(same_as_ref(p, i));
      }
    } else {
      optional++;
    }
    if (p->verify) p->verify(p);
    p->fini(p);
  }
  t_note[0] = 0;
  const int leaks = leak_check();
  CHECK_EQ(leaks, 0);
  CHECK(errors > 0); /* the path does allocate, and failing does show */
  printf("%s: %llu allocations, %llu failures injected, %s (%lld returned RLM_ERR_NOMEM, "
         "%lld optional; %.1f s)\n",
         p->name, (unsigned long long)n, (unsigned long long)n,
         !HAVE_LSAN ? "leaks not checked (no LeakSanitizer)" : leaks ? "LEAKS" : "0 leaks",
         (long long)errors, (long long)optional, now_s() - t0);
  fflush(stdout);
  for (int i = 0; i < p->n_steps; i++) free(p->ref[i]), p->ref[i] = NULL;
  free(p->out);
  p->out = NULL, p->out_len = p->out_cap = 0;
}

/* ---- shared helpers -------------------------------------------------------- */

static void fixture_dir(char *out, size_t n, const char *arch) {
  snprintf(out, n, "%s/tests/fixtures/models/%s", g_src, arch);
}

static void brown_dir(char *out, size_t n) { snprintf(out, n, "%s/models/brown-15m-4bit", g_src); }

/* The prompt: ids spread over the vocabulary, deterministic. */
static int32_t tok(int64_t i, int32_t V) { return (int32_t)((i * 37 + 11) % V); }

static void fill_ids(int32_t *ids, int64_t from, int n, int32_t V) {
  for (int j = 0; j < n; j++) ids[j] = tok(from + j, V);
}

static rlm_model *load_model(const char *dir) {
  rlm_model *m = NULL;
  rlm_error err;
  CHECK_EQ(rlm_model_load(&m, dir, &err), RLM_OK);
  if (!m) fprintf(stderr, "%s: %s\n", dir, err.msg);
  return m;
}

static rlm_session_params sparams(int rows, int chunk) {
  rlm_session_params sp = rlm_session_params_default();
  sp.n_threads = 1, sp.n_rows = rows, sp.prefill_chunk = chunk, sp.kv_group_size = 32;
  return sp;
}

static rlm_session *open_session(rlm_model *m, const rlm_session_params *sp) {
  rlm_session *s = NULL;
  rlm_error err;
  CHECK_EQ(rlm_session_create(&s, m, sp, &err), RLM_OK);
  if (!s) fprintf(stderr, "rlm_session_create: %s\n", err.msg);
  return s;
}

/* Feeds row `row` n prompt ids from position `from` (no injection). */
static void feed(rlm_session *s, int row, int64_t from, int n, int32_t V) {
  int32_t *ids = xmalloc((size_t)n * sizeof *ids), *rows = xmalloc((size_t)n * sizeof *rows);
  fill_ids(ids, from, n, V);
  for (int j = 0; j < n; j++) rows[j] = row;
  rlm_error err;
  CHECK_EQ(rlm_session_decode(s, &(rlm_batch){n, ids, rows, NULL}, NULL, &err), RLM_OK);
  free(ids), free(rows);
}

/* Logits of a short prompt on a fresh session of m: what a model or a
 * session create that failed and was retried must still give. */
static void probe_logits(rlm_model *m, const rlm_session_params *sp, float **out, size_t *n) {
  rlm_session *s = open_session(m, sp);
  const int32_t V = rlm_model_vocab_size(m);
  int32_t ids[8];
  fill_ids(ids, 0, 8, V);
  *n = (size_t)V * sizeof(float);
  *out = xmalloc(*n);
  rlm_error err;
  if (s) CHECK_EQ(rlm_session_eval(s, ids, 8, *out, false, &err), RLM_OK);
  rlm_session_free(s);
}

/* ---- 1. rlm_model_load ------------------------------------------------------ */

typedef struct load_ctx {
  char dir[512];
  rlm_model *m;
  float *probe;  /* a fresh session's logits over the model, nothing failing */
  size_t probe_n;
} load_ctx;

static void load_reset(path *p) { ((load_ctx *)p->ctx)->m = NULL; }

static rlm_status load_step(path *p, int i, rlm_error *err) {
  load_ctx *c = p->ctx;
  (void)i;
  rlm_status rc = rlm_model_load(&c->m, c->dir, err);
  if (rc) {
    CHECK(c->m == NULL);
    return rc;
  }
  rlm_model_info mi;
  rlm_model_get_info(c->m, &mi);
  const char *sig = rlm_model_signature(c->m);
  put(p, sig, strlen(sig));
  put_i64(p, mi.n_params), put_i64(p, mi.vocab), put_i64(p, mi.n_layers);
  return RLM_OK;
}

/* The model that loaded (after a failure and a retry, or an optional one)
 * works: a session over it gives the logits of the clean run. */
static void load_verify(path *p) {
  load_ctx *c = p->ctx;
  if (!c->m) return;
  rlm_session_params sp = sparams(1, 8);
  float *lg;
  size_t n;
  probe_logits(c->m, &sp, &lg, &n);
  if (!c->probe) c->probe = lg, c->probe_n = n;
  else {
    test_note("%s: a session over the loaded model", p->name);
    CHECK(n == c->probe_n && !memcmp(lg, c->probe, n));
    free(lg);
  }
}

static void load_fini(path *p) {
  load_ctx *c = p->ctx;
  rlm_model_free(c->m);
  c->m = NULL;
}

TEST(model_load) {
  static const char *const which[] = {"llama", "gemma4_text", NULL};
  for (int a = 0; a < 3; a++) {
    load_ctx c = {0};
    if (which[a]) fixture_dir(c.dir, sizeof c.dir, which[a]);
    else brown_dir(c.dir, sizeof c.dir);
    path p = {.n_steps = 1, .ctx = &c, .reset = load_reset, .step = load_step, .verify = load_verify,
              .fini = load_fini};
    snprintf(p.name, sizeof p.name, "rlm_model_load(%s)", which[a] ? which[a] : "brown-15m-4bit");
    sweep(&p);
    free(c.probe);
  }
}

/* ---- 2. rlm_session_create -------------------------------------------------- */

typedef struct create_ctx {
  rlm_model *m;
  rlm_session_params sp;
  rlm_session *s;
  float *probe;
  size_t probe_n;
} create_ctx;

static void create_reset(path *p) { ((create_ctx *)p->ctx)->s = NULL; }

static rlm_status create_step(path *p, int i, rlm_error *err) {
  create_ctx *c = p->ctx;
  (void)i;
  rlm_status rc = rlm_session_create(&c->s, c->m, &c->sp, err);
  if (rc) {
    CHECK(c->s == NULL);
    return rc;
  }
  put_i64(p, rlm_session_rows(c->s));
  put_i64(p, (int64_t)rlm_session_kv_bytes(c->s));
  return RLM_OK;
}

/* The session made works: every row gives the clean run's logits for the
 * same prompt (rows of one session are independent). */
static void create_verify(path *p) {
  create_ctx *c = p->ctx;
  if (!c->s) return;
  const int32_t V = rlm_model_vocab_size(c->m);
  const int R = rlm_session_rows(c->s);
  int32_t *ids = xmalloc((size_t)R * 8 * sizeof *ids), *rows = xmalloc((size_t)R * 8 * sizeof *rows);
  for (int r = 0; r < R; r++) fill_ids(ids + r * 8, r, 8, V);
  for (int j = 0; j < R * 8; j++) rows[j] = j / 8;
  const size_t n = (size_t)R * (size_t)V * sizeof(float);
  float *lg = xmalloc(n);
  rlm_error err;
  CHECK_EQ(rlm_session_decode(c->s, &(rlm_batch){R * 8, ids, rows, NULL}, lg, &err), RLM_OK);
  if (!c->probe) {
    c->probe = lg, c->probe_n = n;
  } else {
    test_note("%s: the created session's logits", p->name);
    CHECK(n == c->probe_n && !memcmp(lg, c->probe, n));
    free(lg);
  }
  free(ids), free(rows);
}

static void create_fini(path *p) {
  create_ctx *c = p->ctx;
  rlm_session_free(c->s);
  c->s = NULL;
}

TEST(session_create) {
  static const struct {
    const char *arch;
    int rows, threads, k_bits, v_bits;
    int64_t max_kv;
    int sinks;
  } v[] = {
      {"llama", 1, 1, 0, 0, 0, 0},        {"llama", 3, 2, 4, 4, 0, 0},
      {"llama", 3, 1, 0, 0, 48, 4},       {"gemma4_text", 3, 1, 4, 4, 0, 0},
      {"gemma4_text", 1, 1, 8, 4, 40, 0},
  };
  for (int a = 0; a < N_OF(v); a++) {
    char dir[512];
    fixture_dir(dir, sizeof dir, v[a].arch);
    create_ctx c = {.m = load_model(dir), .sp = sparams(v[a].rows, 8)};
    if (!c.m) return;
    c.sp.n_threads = v[a].threads, c.sp.k_bits = v[a].k_bits, c.sp.v_bits = v[a].v_bits;
    c.sp.max_kv = v[a].max_kv, c.sp.kv_sinks = v[a].sinks;
    path p = {.n_steps = 1, .ctx = &c, .reset = create_reset, .step = create_step,
              .verify = create_verify, .fini = create_fini};
    snprintf(p.name, sizeof p.name, "rlm_session_create(%s, n_rows %d, n_threads %d, k%dv%d, max_kv %lld)",
             v[a].arch, v[a].rows, v[a].threads, v[a].k_bits, v[a].v_bits, (long long)v[a].max_kv);
    sweep(&p);
    free(c.probe);
    rlm_model_free(c.m);
  }
}

/* ---- 3. eval on an existing session ------------------------------------------ */

/* Row 0 of a 1-row session with n prompt ids from `from`, as a snapshot
 * image (rlm_free it): an existing row in a fresh session for every
 * injected run, without prefilling it each time. */
static void *row_image(rlm_model *m, const rlm_session_params *sp, int64_t from, int n, size_t *len) {
  rlm_session_params one = *sp;
  one.n_rows = 1;
  rlm_session *s = open_session(m, &one);
  void *img = NULL;
  *len = 0;
  if (!s) return NULL;
  feed(s, 0, from, n, rlm_model_vocab_size(m));
  rlm_error err;
  CHECK_EQ(rlm_session_row_save(s, 0, NULL, 0, &img, len, &err), RLM_OK);
  rlm_session_free(s);
  return img;
}

static void restore_row(rlm_session *s, int row, const void *img, size_t len) {
  rlm_error err;
  CHECK_EQ(rlm_session_row_restore(s, row, img, len, &err), RLM_OK);
}

/* On a session holding n0 ids (none: the caches' first growth), a chunk
 * of n1 > prefill_chunk ids (all logits), then decode steps; with n0 + n1
 * near 256 the growth past 256 slots falls in the chunk or in a decode
 * step. */
typedef struct eval_ctx {
  rlm_model *m;
  rlm_session_params sp;
  rlm_session *s;
  int n0, n1, n_dec;
  void *img;     /* row 0 at n0 ids, or NULL */
  size_t img_len;
  float *lg;
} eval_ctx;

static void eval_reset(path *p) {
  eval_ctx *c = p->ctx;
  c->s = open_session(c->m, &c->sp);
  if (c->s && c->img) restore_row(c->s, 0, c->img, c->img_len);
}

static rlm_status eval_step(path *p, int i, rlm_error *err) {
  eval_ctx *c = p->ctx;
  const int32_t V = rlm_model_vocab_size(c->m);
  const int n = i == 0 ? c->n1 : 1;
  int32_t ids[512];
  fill_ids(ids, c->n0 + (i ? c->n1 + i - 1 : 0), n, V);
  const bool all = i == 0;
  rlm_status rc = rlm_session_eval(c->s, ids, n, c->lg, all, err);
  if (!rc) put(p, c->lg, (size_t)(all ? n : 1) * (size_t)V * sizeof(float));
  put_i64(p, rlm_session_position(c->s));
  return rc;
}

static int eval_state(path *p, int64_t *st) {
  st[0] = rlm_session_position(((eval_ctx *)p->ctx)->s);
  return 1;
}

static void eval_fini(path *p) {
  eval_ctx *c = p->ctx;
  rlm_session_free(c->s);
  c->s = NULL;
}

TEST(session_eval) {
  static const struct {
    const char *arch;
    int k_bits, v_bits;
    int64_t max_kv;
    int n0, n1, n_dec;
  } v[] = {
      {"llama", 0, 0, 0, 0, 20, 3},          /* first growth              */
      {"llama", 0, 0, 0, 240, 24, 4},        /* growth in the chunk       */
      {"llama", 0, 0, 0, 244, 10, 4},        /* growth in a decode step   */
      {"gemma4_text", 0, 0, 0, 0, 20, 3},    {"gemma4_text", 0, 0, 0, 240, 24, 4},
      {"gemma4_text", 0, 0, 0, 244, 10, 4},  {"gemma4_text", 4, 4, 0, 240, 24, 4}, /* quantized */
      {"llama", 0, 0, 48, 0, 60, 4},         /* max_kv rings, wrapping    */
  };
  for (int a = 0; a < N_OF(v); a++) {
    char dir[512];
    fixture_dir(dir, sizeof dir, v[a].arch);
    eval_ctx c = {.m = load_model(dir), .sp = sparams(1, 8), .n0 = v[a].n0, .n1 = v[a].n1,
                  .n_dec = v[a].n_dec};
    if (!c.m) return;
    c.sp.k_bits = v[a].k_bits, c.sp.v_bits = v[a].v_bits, c.sp.max_kv = v[a].max_kv;
    if (c.n0) c.img = row_image(c.m, &c.sp, 0, c.n0, &c.img_len);
    c.lg = xmalloc((size_t)c.n1 * (size_t)rlm_model_vocab_size(c.m) * sizeof(float));
    path p = {.n_steps = 1 + c.n_dec, .ctx = &c, .reset = eval_reset, .step = eval_step,
              .state = eval_state, .fini = eval_fini};
    snprintf(p.name, sizeof p.name,
             "rlm_session_eval(%s, k%dv%d, max_kv %lld: at %d, %d ids, %d decode steps)",
             v[a].arch, v[a].k_bits, v[a].v_bits, (long long)v[a].max_kv, c.n0, c.n1, c.n_dec);
    sweep(&p);
    free(c.lg);
    rlm_free(c.img);
    rlm_model_free(c.m);
  }
}

/* ---- 4. a row joining mid-flight ------------------------------------------------ */

/* Rows 0 and 1 hold 250 and 30 ids; one batch feeds each a decode step and
 * row 2 its first 20 ids (longer than prefill_chunk), then batched decode
 * steps of every row (row 0 past 256 slots). */
enum { JOIN_P0 = 250, JOIN_P1 = 30, JOIN_P2 = 20, JOIN_STEPS = 7 };

typedef struct join_ctx {
  rlm_model *m;
  rlm_session_params sp;
  rlm_session *s;
  void *img[2];
  size_t img_len[2];
  float *lg;
} join_ctx;

static void join_reset(path *p) {
  join_ctx *c = p->ctx;
  c->s = open_session(c->m, &c->sp);
  for (int r = 0; c->s && r < 2; r++) restore_row(c->s, r, c->img[r], c->img_len[r]);
}

static rlm_status join_step(path *p, int i, rlm_error *err) {
  join_ctx *c = p->ctx;
  const int32_t V = rlm_model_vocab_size(c->m);
  int32_t ids[64], rows[64];
  int n = 0;
  for (int r = 0; r < 3; r++) {
    const int64_t pos = rlm_session_row_position(c->s, r);
    const int k = i == 0 && r == 2 ? JOIN_P2 : 1;
    for (int j = 0; j < k; j++) ids[n] = tok(pos + j + 1000 * r, V), rows[n++] = r;
  }
  rlm_status rc = rlm_session_decode(c->s, &(rlm_batch){n, ids, rows, NULL}, c->lg, err);
  if (!rc) put(p, c->lg, 3 * (size_t)V * sizeof(float));
  for (int r = 0; r < 3; r++) put_i64(p, rlm_session_row_position(c->s, r));
  return rc;
}

static int join_state(path *p, int64_t *st) {
  join_ctx *c = p->ctx;
  for (int r = 0; r < 3; r++) st[r] = rlm_session_row_position(c->s, r);
  return 3;
}

static void join_fini(path *p) {
  join_ctx *c = p->ctx;
  rlm_session_free(c->s);
  c->s = NULL;
}

TEST(rows_joining) {
  static const struct {
    const char *arch;
    int k_bits, v_bits;
  } v[] = {{"gemma4_text", 0, 0}, {"llama", 4, 4}};
  for (int a = 0; a < N_OF(v); a++) {
    char dir[512];
    fixture_dir(dir, sizeof dir, v[a].arch);
    join_ctx c = {.m = load_model(dir), .sp = sparams(3, 8)};
    if (!c.m) return;
    c.sp.k_bits = v[a].k_bits, c.sp.v_bits = v[a].v_bits;
    c.img[0] = row_image(c.m, &c.sp, 0, JOIN_P0, &c.img_len[0]);
    c.img[1] = row_image(c.m, &c.sp, 1000, JOIN_P1, &c.img_len[1]);
    c.lg = xmalloc(3 * (size_t)rlm_model_vocab_size(c.m) * sizeof(float));
    path p = {.n_steps = JOIN_STEPS, .ctx = &c, .reset = join_reset, .step = join_step,
              .state = join_state, .fini = join_fini};
    snprintf(p.name, sizeof p.name, "rlm_session_decode, row 2 joining rows at %d and %d (%s, k%dv%d)",
             JOIN_P0, JOIN_P1, v[a].arch, v[a].k_bits, v[a].v_bits);
    sweep(&p);
    free(c.lg);
    rlm_free(c.img[0]), rlm_free(c.img[1]);
    rlm_model_free(c.m);
  }
}

/* ---- 5. the tokenizer ------------------------------------------------------------ */

static const char k_text[] =
    "The old man walked into the village; the children ran after him, laughing.\n"
    "\"Where are you going?\" they asked. Caf\xc3\xa9, na\xc3\xafve, \xe6\x97\xa5\xe6\x9c\xac, "
    "\xf0\x9f\x98\x80 <eos> 12345   tabs\tand  spaces.";

typedef struct tok_ctx {
  char path[512];
  rlm_tokenizer *t;
  int32_t ids[1024];
  size_t n_ids;
} tok_ctx;

static void tok_reset(path *p) { ((tok_ctx *)p->ctx)->t = NULL; }

static rlm_status tok_step(path *p, int i, rlm_error *err) {
  tok_ctx *c = p->ctx;
  rlm_status rc = RLM_OK;
  if (i == 0) {
    rc = rlm_tokenizer_load(&c->t, c->path, err);
    if (rc) CHECK(c->t == NULL);
    else put_i64(p, rlm_tokenizer_vocab_size(c->t)), put_i64(p, rlm_tokenizer_bos(c->t));
  } else if (i == 1) {
    rc = rlm_tokenize(c->t, k_text, sizeof k_text - 1, true, c->ids, 1024, &c->n_ids, err);
    if (!rc) put(p, c->ids, c->n_ids * sizeof *c->ids);
  } else if (i == 2) {
    char buf[2048];
    size_t len = 0;
    rc = rlm_detokenize(c->t, c->ids, c->n_ids, false, buf, sizeof buf, &len, err);
    if (!rc) put(p, buf, len);
  } else {
    rlm_detok_stream *ds = NULL;
    rc = rlm_detok_stream_create(&ds, c->t, true, err);
    if (rc) CHECK(ds == NULL);
    for (size_t j = 0; !rc && j < c->n_ids; j++) {
      char buf[256];
      size_t len = 0;
      rc = rlm_detok_stream_push(ds, c->ids[j], buf, sizeof buf, &len, err);
      if (!rc) put(p, buf, len);
    }
    rlm_detok_stream_free(ds);
  }
  return rc;
}

static void tok_fini(path *p) {
  tok_ctx *c = p->ctx;
  rlm_tokenizer_free(c->t);
  c->t = NULL;
}

TEST(tokenizer) {
  static tok_ctx c;
  snprintf(c.path, sizeof c.path, "%s/models/brown-15m-4bit/tokenizer.json", g_src);
  path p = {.n_steps = 4, .ctx = &c, .reset = tok_reset, .step = tok_step, .fini = tok_fini};
  snprintf(p.name, sizeof p.name,
           "rlm_tokenizer_load + rlm_tokenize + rlm_detokenize + stream (brown-15m-4bit)");
  sweep(&p);
}

/* ---- 6. chat templates ----------------------------------------------------------- */

static const char k_msgs[] =
    "[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"  Hello "
    "there \\u00e9  \"}, {\"role\": \"assistant\", \"content\": \"Hi! How can I help?\"}, "
    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Tell me\"}, {\"type\": \"text\", "
    "\"text\": \"a story.\"}]}]";

static const char k_tpl[] =
    "{%- set ns = namespace(n=0, sys='') -%}\n"
    "{%- macro part(c) -%}{%- if c is string -%}{{ c | trim }}{%- else -%}"
    "{%- for x in c -%}{{ x.text }}{{ ' ' if not loop.last }}{%- endfor -%}{%- endif -%}{%- endmacro -%}\n"
    "{%- if messages[0].role == 'system' -%}{%- set ns.sys = messages[0].content -%}{%- endif -%}\n"
    "{{ bos_token }}{%- for m in messages if m.role != 'system' -%}{%- set ns.n = ns.n + 1 -%}\n"
    "<|{{ m.role | upper }}|>{{ (ns.sys ~ ' ') if loop.first else '' }}{{ part(m.content) }}"
    "{{ ' #' ~ loop.index ~ '/' ~ loop.length }}{{ {'r': m.role, 'i': ns.n} | tojson }}\n"
    "{%- endfor -%}{{ [1, 2, 3] | map('string') | join(',') }}{{ tools | length if tools else 0 }}"
    "{%- if add_generation_prompt -%}<|ASSISTANT|>{%- endif -%}";

typedef struct chat_ctx {
  char dir[512];
  rlm_chat_template *t1, *t2;
} chat_ctx;

static void chat_reset(path *p) {
  chat_ctx *c = p->ctx;
  c->t1 = c->t2 = NULL;
}

static rlm_status chat_render(path *p, const rlm_chat_template *t, const char *extra, rlm_error *err) {
  char *out = NULL;
  size_t len = 0;
  rlm_status rc = rlm_chat_template_render(t, k_msgs, extra, true, &out, &len, err);
  if (!rc) put(p, out, len);
  rlm_free(out);
  return rc;
}

static rlm_status chat_step(path *p, int i, rlm_error *err) {
  chat_ctx *c = p->ctx;
  rlm_status rc;
  switch (i) {
  case 0:
    rc = rlm_chat_template_load(&c->t1, c->dir, err);
    if (rc) CHECK(c->t1 == NULL);
    return rc;
  case 1: return chat_render(p, c->t1, NULL, err);
  case 2:
    rc = rlm_chat_template_parse(&c->t2, k_tpl, sizeof k_tpl - 1, err);
    if (rc) CHECK(c->t2 == NULL);
    return rc;
  default: return chat_render(p, c->t2, "{\"tools\": [{\"name\": \"f\"}], \"bos_token\": \"<s>\"}", err);
  }
}

static void chat_fini(path *p) {
  chat_ctx *c = p->ctx;
  rlm_chat_template_free(c->t1), rlm_chat_template_free(c->t2);
  c->t1 = c->t2 = NULL;
}

TEST(chat_template) {
  chat_ctx c = {0};
  brown_dir(c.dir, sizeof c.dir);
  path p = {.n_steps = 4, .ctx = &c, .reset = chat_reset, .step = chat_step, .fini = chat_fini};
  snprintf(p.name, sizeof p.name, "rlm_chat_template_load/_parse + _render (brown-15m-4bit, a 2nd template)");
  sweep(&p);
}

/* ---- 7. KV snapshots ----------------------------------------------------------------- */

/* S (row 0 at SNAP_POS ids: past 256 slots, rings wrapped) is saved to
 * memory and to a file over an older one; both are opened and loaded into
 * T's row 0 (5 ids, 256 slots: it must grow) and row 1 (never used),
 * then both rows decode. A failed load must leave the row as it was: it
 * then decodes as an untouched twin's row does. */
enum { SNAP_POS = 300, SNAP_T0 = 5, SNAP_STEPS = 7 };

typedef struct snap_ctx {
  rlm_model *m;
  rlm_session_params sp, tp;
  rlm_session *S, *T;
  int32_t prompt[SNAP_POS];
  void *img;
  size_t img_len;
  rlm_snapshot *sn, *sn2;
  char file[600];
  float *lg;
  float *untouched[2]; /* T's rows decoding tok(7) without any load: [V] each */
} snap_ctx;

static const char k_old_file[] = "an older snapshot file\n";

static void write_old_file(const char *file) {
  FILE *f = fopen(file, "wb");
  CHECK(f != NULL);
  if (!f) return;
  fwrite(k_old_file, 1, sizeof k_old_file - 1, f);
  fclose(f);
}

/* Files in the temp folder (a failed save leaves no temporary behind). */
static int dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  if (d) closedir(d);
  return n;
}

static void snap_target(snap_ctx *c) {
  c->T = open_session(c->m, &c->tp);
  if (c->T) feed(c->T, 0, 0, SNAP_T0, rlm_model_vocab_size(c->m));
}

static void snap_reset(path *p) {
  snap_ctx *c = p->ctx;
  snap_target(c);
  c->img = NULL, c->sn = c->sn2 = NULL;
  write_old_file(c->file);
}

/* Row r of T decodes one id; logits into lg. */
static rlm_status snap_decode_row(snap_ctx *c, int r, float *lg, rlm_error *err) {
  const int32_t id = tok(7, rlm_model_vocab_size(c->m)), row = r;
  return rlm_session_decode(c->T, &(rlm_batch){1, &id, &row, NULL}, lg, err);
}

static rlm_status snap_step(path *p, int i, rlm_error *err) {
  snap_ctx *c = p->ctx;
  const int32_t V = rlm_model_vocab_size(c->m);
  rlm_status rc;
  size_t n = 0;
  char *bytes;
  switch (i) {
  case 0:
    rc = rlm_session_row_save(c->S, 0, c->prompt, SNAP_POS, &c->img, &c->img_len, err);
    if (!rc) put(p, c->img, c->img_len);
    return rc;
  case 1:
    rc = rlm_snapshot_open_memory(&c->sn, c->img, c->img_len, err);
    if (rc) CHECK(c->sn == NULL);
    else put_i64(p, rlm_snapshot_position(c->sn)), put_i64(p, (int64_t)rlm_snapshot_bytes(c->sn));
    return rc;
  case 2:
  case 5:
    rc = rlm_session_row_load(c->T, i == 2 ? 0 : 1, i == 2 ? c->sn : c->sn2, err);
    for (int r = 0; r < 2; r++) put_i64(p, rlm_session_row_position(c->T, r));
    return rc;
  case 3:
    rc = rlm_session_row_save_file(c->S, 0, c->prompt, SNAP_POS, c->file, err);
    test_note("save_file: the folder holds one file");
    CHECK_EQ(dir_entries(g_dir), 1);
    bytes = t_read_file(c->file, &n);
    if (rc) {
      CHECK(t_same_file(c->file, k_old_file, sizeof k_old_file - 1)); /* the old file, whole */
    } else {
      CHECK(n == c->img_len && !memcmp(bytes, c->img, n));
      put(p, bytes, n);
    }
    free(bytes);
    return rc;
  case 4:
    rc = rlm_snapshot_open(&c->sn2, c->file, err);
    if (rc) CHECK(c->sn2 == NULL);
    else put_i64(p, rlm_snapshot_position(c->sn2));
    return rc;
  default: {
    int32_t ids[2] = {tok(9, V), tok(10, V)}, rows[2] = {0, 1};
    rc = rlm_session_decode(c->T, &(rlm_batch){2, ids, rows, NULL}, c->lg, err);
    if (!rc) put(p, c->lg, 2 * (size_t)V * sizeof(float));
    return rc;
  }
  }
}

static int snap_state(path *p, int64_t *st) {
  snap_ctx *c = p->ctx;
  for (int r = 0; r < 2; r++) st[r] = rlm_session_row_position(c->T, r);
  return 2;
}

/* After a failed load: the row decodes as the untouched twin's, then
 * forgets that id again (the load is retried next). */
static void snap_after_fail(path *p, int i) {
  snap_ctx *c = p->ctx;
  if (i != 2 && i != 5) return;
  const int r = i == 2 ? 0 : 1;
  const size_t V = (size_t)rlm_model_vocab_size(c->m);
  rlm_error err;
  CHECK_EQ(snap_decode_row(c, r, c->lg, &err), RLM_OK);
  test_note("%s: row %d after a failed load, against an untouched twin", p->name, r);
  CHECK(!memcmp(c->lg, c->untouched[r], V * sizeof(float)));
  CHECK_EQ(rlm_session_rollback(c->T, r, 1, &err), RLM_OK);
}

static void snap_fini(path *p) {
  snap_ctx *c = p->ctx;
  rlm_snapshot_free(c->sn), rlm_snapshot_free(c->sn2);
  rlm_free(c->img);
  rlm_session_free(c->T);
  c->sn = c->sn2 = NULL, c->img = NULL, c->T = NULL;
}

TEST(snapshot) {
  static const struct {
    const char *arch;
    int k_bits, v_bits;
  } v[] = {{"gemma4_text", 0, 0}, {"llama", 4, 8}};
  for (int a = 0; a < N_OF(v); a++) {
    char dir[512];
    fixture_dir(dir, sizeof dir, v[a].arch);
    static snap_ctx c;
    memset(&c, 0, sizeof c);
    c.m = load_model(dir);
    if (!c.m) return;
    const int32_t V = rlm_model_vocab_size(c.m);
    c.sp = sparams(1, 8), c.tp = sparams(2, 8);
    c.sp.k_bits = c.tp.k_bits = v[a].k_bits, c.sp.v_bits = c.tp.v_bits = v[a].v_bits;
    fill_ids(c.prompt, 0, SNAP_POS, V);
    c.S = open_session(c.m, &c.sp);
    if (!c.S) return;
    feed(c.S, 0, 0, SNAP_POS, V);
    snprintf(c.file, sizeof c.file, "%s/row.snapshot", g_dir);
    c.lg = xmalloc(2 * (size_t)V * sizeof(float));
    snap_target(&c); /* the untouched twin */
    for (int r = 0; r < 2; r++) {
      rlm_error err;
      c.untouched[r] = xmalloc((size_t)V * sizeof(float));
      CHECK_EQ(snap_decode_row(&c, r, c.untouched[r], &err), RLM_OK);
    }
    rlm_session_free(c.T);
    c.T = NULL;
    path p = {.n_steps = SNAP_STEPS, .ctx = &c, .reset = snap_reset, .step = snap_step, .state = snap_state,
              .after_fail = snap_after_fail, .fini = snap_fini};
    snprintf(p.name, sizeof p.name, "snapshot save/open/load, memory and file (%s, k%dv%d, %d ids)",
             v[a].arch, v[a].k_bits, v[a].v_bits, SNAP_POS);
    sweep(&p);
    free(c.untouched[0]), free(c.untouched[1]), free(c.lg);
    rlm_session_free(c.S);
    rlm_model_free(c.m);
    remove(c.file);
  }
}

/* ---- 8. the generation engine ---------------------------------------------------------- */

/* A target and a draft session of the llama fixture (3 rows each),
 * greedy speculative decoding with stop strings, streamed text and
 * logprobs: create the engine, add requests on rows 0 and 1, step; add a
 * 1-id request on row 2 (never used: its caches grow in the step's draft
 * pass 0 and in the target pass, after the draft passes), step; then a
 * longer request on row 0 (a bigger history, the draft row still holding
 * the last one), step. A failed call must leave the requests where they
 * were: the calls after it give the clean run's events and positions of
 * both sessions' rows. */
typedef struct gen_op {
  char op;                    /* 'c'reate, 'a'dd, 's'tep */
  int row, n_prompt;
  int64_t max_tokens, seed;
} gen_op;

static const gen_op k_gen_ops[] = {
    {'c', 0, 0, 0, 0},   {'a', 0, 12, 6, 0},  {'a', 1, 20, 5, 100}, {'s', 0, 0, 0, 0},
    {'s', 0, 0, 0, 0},   {'a', 2, 1, 4, 300}, {'s', 0, 0, 0, 0},    {'s', 0, 0, 0, 0},
    {'s', 0, 0, 0, 0},   {'a', 0, 30, 40, 200}, {'s', 0, 0, 0, 0},  {'s', 0, 0, 0, 0},
    {'s', 0, 0, 0, 0},   {'s', 0, 0, 0, 0},
};
/* A request without max_tokens outgrowing its history (room for 1,058
 * ids past the prompt): the step grows it first, and a failure there
 * changes nothing. Every step accepts all 3 proposals (the draft is the
 * target), so the 250 steps of gen_reset bring it to 1,000 ids, and the
 * growth comes within the swept steps. */
#define GEN_S {'s', 0, 0, 0, 0}
static const gen_op k_gen_long[] = {GEN_S, GEN_S, GEN_S, GEN_S, GEN_S, GEN_S, GEN_S,
                                    GEN_S, GEN_S, GEN_S, GEN_S, GEN_S, GEN_S, GEN_S,
                                    GEN_S, GEN_S, GEN_S, GEN_S, GEN_S, GEN_S};
#undef GEN_S
enum { GEN_LONG_WARM = 250 };
enum { GEN_ROWS = 3, GEN_CHUNK = 16, GEN_PROMPT_MAX = 64 };

typedef struct gen_ctx {
  const gen_op *ops;
  int warm_steps;     /* > 0: reset creates the engine, adds a request, steps this often */
  rlm_model *m;
  rlm_tokenizer *tok;
  rlm_session *t, *d;
  rlm_gen *g;
} gen_ctx;

static rlm_status gen_add(path *p, const gen_op *o, rlm_error *err);
static rlm_status gen_steps(path *p, int n, rlm_error *err);

static void gen_reset(path *p) {
  gen_ctx *c = p->ctx;
  rlm_session_params sp = sparams(GEN_ROWS, GEN_CHUNK);
  c->t = open_session(c->m, &sp);
  c->d = open_session(c->m, &sp);
  c->g = NULL;
  if (!c->warm_steps) return;
  rlm_gen_params gp = rlm_gen_params_default();
  gp.draft_max = 3;
  rlm_error err;
  CHECK_EQ(rlm_gen_create(&c->g, c->t, c->d, c->tok, &gp, &err), RLM_OK);
  CHECK_EQ(gen_add(p, &(gen_op){'a', 0, 4, -1, 5}, &err), RLM_OK);
  CHECK_EQ(gen_steps(p, c->warm_steps, &err), RLM_OK);
  p->out_len = 0;
  CHECK_EQ(rlm_session_row_position(c->t, 0), 4 + 4 * (c->warm_steps - 1) - 1); /* a prefill step, then 4 ids a step */
}

static rlm_status gen_add(path *p, const gen_op *o, rlm_error *err) {
  gen_ctx *c = p->ctx;
  static const char *const stops[] = {"qq", "zebra"};
  int32_t prompt[GEN_PROMPT_MAX];
  fill_ids(prompt, o->seed, o->n_prompt, rlm_model_vocab_size(c->m));
  rlm_gen_request rq = rlm_gen_request_default();
  rq.prompt = prompt, rq.n_prompt = o->n_prompt, rq.row = o->row, rq.max_tokens = o->max_tokens;
  rq.sampler.temp = 0, rq.ignore_eos = true, rq.stops = stops, rq.n_stops = 2, rq.logprobs = 2;
  int got = -1;
  rlm_status rc = rlm_gen_add(c->g, &rq, &got, err);
  put_i64(p, got), put_i64(p, rlm_gen_active(c->g));
  return rc;
}

static rlm_status gen_steps(path *p, int n, rlm_error *err) {
  gen_ctx *c = p->ctx;
  rlm_status rc = RLM_OK;
  for (int s = 0; s < n && !rc; s++) {
    const rlm_gen_event *ev = NULL;
    int n_ev = 0;
    rc = rlm_gen_step(c->g, &ev, &n_ev, err);
    for (int e = 0; !rc && e < n_ev; e++) {
      put_i64(p, ev[e].row), put_i64(p, ev[e].n_ids), put_i64(p, ev[e].finish);
      put(p, ev[e].ids, (size_t)ev[e].n_ids * sizeof *ev[e].ids);
      put(p, ev[e].text, ev[e].text_len);
      put(p, ev[e].logprob, (size_t)ev[e].n_ids * sizeof(float));
      put(p, ev[e].top_ids, (size_t)ev[e].n_ids * (size_t)ev[e].n_top * sizeof(int32_t));
    }
  }
  return rc;
}

static rlm_status gen_step(path *p, int i, rlm_error *err) {
  gen_ctx *c = p->ctx;
  const gen_op *o = &c->ops[i];
  rlm_status rc;
  if (o->op == 'c') {
    rlm_gen_params gp = rlm_gen_params_default();
    gp.draft_max = 3;
    rc = rlm_gen_create(&c->g, c->t, c->d, c->tok, &gp, err);
    if (rc) CHECK(c->g == NULL);
    return rc;
  }
  rc = o->op == 'a' ? gen_add(p, o, err) : gen_steps(p, 1, err);
  for (int r = 0; r < GEN_ROWS; r++) /* the engine drives both sessions' rows */
    put_i64(p, rlm_session_row_position(c->t, r)), put_i64(p, rlm_session_row_position(c->d, r));
  return rc;
}

static int gen_state(path *p, int64_t *st) {
  gen_ctx *c = p->ctx;
  st[0] = rlm_gen_active(c->g);
  for (int r = 0; r < GEN_ROWS; r++) st[1 + r] = rlm_session_row_position(c->t, r);
  rlm_gen_stats gs;
  rlm_gen_get_stats(c->g, -1, &gs);
  st[1 + GEN_ROWS] = gs.n_gen, st[2 + GEN_ROWS] = gs.steps;
  return 3 + GEN_ROWS;
}

static void gen_fini(path *p) {
  gen_ctx *c = p->ctx;
  rlm_gen_free(c->g);
  rlm_session_free(c->t), rlm_session_free(c->d);
  c->g = NULL, c->t = c->d = NULL;
}

TEST(generation) {
  char dir[512], tpath[600];
  fixture_dir(dir, sizeof dir, "llama");
  gen_ctx c = {.m = load_model(dir)};
  if (!c.m) return;
  snprintf(tpath, sizeof tpath, "%s/models/brown-15m-4bit/tokenizer.json", g_src);
  rlm_error err;
  CHECK_EQ(rlm_tokenizer_load(&c.tok, tpath, &err), RLM_OK);
  c.ops = k_gen_ops;
  path p = {.n_steps = N_OF(k_gen_ops), .ctx = &c, .reset = gen_reset, .step = gen_step,
            .state = gen_state, .fini = gen_fini};
  snprintf(p.name, sizeof p.name, "rlm_gen_create/add/step (llama target + draft, 3 rows, draft_max 3)");
  sweep(&p);
  c.ops = k_gen_long, c.warm_steps = GEN_LONG_WARM;
  p.n_steps = N_OF(k_gen_long);
  snprintf(p.name, sizeof p.name, "rlm_gen_step past the history's first 1,062 ids (no max_tokens, 20 steps)");
  sweep(&p);
  rlm_tokenizer_free(c.tok);
  rlm_model_free(c.m);
}

/* ---- 9. the server's requests and answers ---------------------------------------------- */

/* oai.c's parsing of completions and chat completions bodies (JSON,
 * sampling fields, stop strings, the chat template, the tokenizer) and its
 * answers (a finished call's body, stream chunks, usage, errors) as
 * `ringlm serve` runs them. A parse that fails must say 500 (out of
 * memory), never 400; an answer whose building met a failed allocation
 * must be refused (srv_json_text NULL: the server then answers 500),
 * never sent short. */
static const char *const k_bodies[] = {
    ("{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
     "\"content\": \"Tell me about the old village.\"}], \"n\": 2, \"temperature\": 0.7, \"top_p\": 0.9, "
     "\"stop\": [\"\\n\\n\", \"END\"], \"logprobs\": true, \"top_logprobs\": 2, \"seed\": 7, "
     "\"stream\": true, \"stream_options\": {\"include_usage\": true}, \"max_tokens\": 16}"),
    ("{\"prompt\": \"The old man walked into the village\", \"logprobs\": 2, \"stop\": \"x\", "
     "\"max_completion_tokens\": 8, \"frequency_penalty\": 0.5}"),
    "{\"prompt\": [1, 2, 3, 4, 5, 6], \"n\": 1, \"top_k\": 40, \"ignore_eos\": true}",
};

enum { SRV_IDS = 6 };

typedef struct srv_path_ctx {
  srv_ctx ctx;
  srv_req req[3];
  srv_call call;     /* a finished call answering req[0] or req[1]        */
  int32_t ids[SRV_IDS], top_ids[SRV_IDS * 2];
  float lp[SRV_IDS], top_lp[SRV_IDS * 2];
  srv_mark marks[3];
  char text[64];
} srv_path_ctx;

static void srv_reset(path *p) {
  srv_path_ctx *c = p->ctx;
  memset(c->req, 0, sizeof c->req);
}

/* The call's jobs: finished, with ids, logprobs and three events. */
static void srv_fill_call(srv_path_ctx *c, const srv_req *r) {
  memset(&c->call, 0, sizeof c->call);
  c->call.req = *r;
  c->call.req.logprobs = 2;
  for (int i = 0; i < r->n; i++) {
    srv_job *j = &c->call.jobs[i];
    *j = (srv_job){.call = &c->call, .index = i, .row = i, .text = c->text, .n_text = strlen(c->text),
                   .ids = c->ids, .lp = c->lp, .top_ids = c->top_ids, .top_lp = c->top_lp, .n_top = 2,
                   .n_ids = SRV_IDS, .marks = c->marks, .n_marks = 3, .done = true,
                   .finish = i ? RLM_FINISH_LENGTH : RLM_FINISH_STOP};
  }
}

/* Text without the "created" seconds, which may tick between runs. */
static void put_answer(path *p, const char *s) {
  for (const char *at; (at = strstr(s, "\"created\":"));) {
    put(p, s, (size_t)(at - s));
    for (s = at + 10; *s >= '0' && *s <= '9'; s++) {}
  }
  put(p, s, strlen(s));
}

/* One answer: built, then turned into text as the server does. */
static rlm_status srv_answer(path *p, json_t *(*build)(srv_path_ctx *c, int k), int k, rlm_error *err) {
  srv_path_ctx *c = p->ctx;
  const uint64_t fails = rlm_alloc_failures();
  char *s = srv_json_text(build(c, k), fails);
  if (!s && rlm_alloc_failures() == fails)
    return rlm__err(err, RLM_ERR_INTERNAL, "an answer was refused with no allocation failing");
  if (!s) return rlm__err(err, RLM_ERR_NOMEM, "building the answer: out of memory");
  put_answer(p, s);
  rlm__free(s);
  return RLM_OK;
}

static json_t *build_full(srv_path_ctx *c, int k) {
  srv_fill_call(c, &c->req[k]);
  return srv_completion_json(&c->ctx, &c->call, "chatcmpl-test");
}

static json_t *build_chunks(srv_path_ctx *c, int k) {
  srv_fill_call(c, &c->req[k]);
  int64_t sent[SRV_MAX_N] = {0};
  bool fin[SRV_MAX_N] = {0};
  json_t *a = json_array();
  for (bool first = true;; first = false) {
    json_t *o = srv_chunk_json(&c->ctx, &c->call, "cmpl-test", sent, fin, first);
    if (!o) break;
    json_array_append_new(a, o);
  }
  srv_err e;
  srv_nomem(&e, "for a test");
  json_array_append_new(a, srv_usage_json(&c->call));
  json_array_append_new(a, srv_error_json(&e));
  return a;
}

static rlm_status srv_step(path *p, int i, rlm_error *err) {
  srv_path_ctx *c = p->ctx;
  if (i >= 3) return srv_answer(p, i < 5 ? build_full : build_chunks, i == 4, err);
  srv_err e = {0};
  if (!srv_parse_completion(&c->ctx, k_bodies[i], strlen(k_bodies[i]), i == 0, &c->req[i], &e)) {
    CHECK_EQ(e.status, 500); /* out of memory is the server's fault, not the request's */
    return rlm__err(err, e.status == 500 ? RLM_ERR_NOMEM : RLM_ERR_INVALID, "%d %s", e.status, e.msg);
  }
  const srv_req *r = &c->req[i];
  put(p, r->prompt, (size_t)r->n_prompt * sizeof *r->prompt);
  for (int k = 0; k < r->n_stops; k++) put(p, r->stops[k], strlen(r->stops[k]) + 1);
  put_i64(p, r->n), put_i64(p, r->logprobs), put_i64(p, r->max_tokens);
  put(p, &r->smp, sizeof r->smp);
  return RLM_OK;
}

static void srv_fini(path *p) {
  srv_path_ctx *c = p->ctx;
  for (int i = 0; i < 3; i++) srv_req_free(&c->req[i]);
}

TEST(server_requests) {
  static srv_path_ctx c;
  char dir[512], tok[600];
  brown_dir(dir, sizeof dir);
  snprintf(tok, sizeof tok, "%s/tokenizer.json", dir);
  rlm_tokenizer *t = NULL;
  rlm_chat_template *tm = NULL;
  rlm_error err;
  c.ctx.h.model = load_model(dir);
  if (!c.ctx.h.model) return;
  CHECK_EQ(rlm_tokenizer_load(&t, tok, &err), RLM_OK);
  CHECK_EQ(rlm_chat_template_load(&tm, dir, &err), RLM_OK);
  c.ctx.h.tok = t, c.ctx.h.tmpl = tm;
  c.ctx.cfg.smp = rlm_sampler_params_default();
  c.ctx.cfg.max_tokens = -1, c.ctx.cfg.n_ctx = 256, c.ctx.cfg.model_name = "brown";
  snprintf(c.text, sizeof c.text, "the old village, caf\xc3\xa9 \xe6\x97\xa5");
  for (int i = 0; i < SRV_IDS; i++) {
    c.ids[i] = 100 + 7 * i, c.lp[i] = -0.25f * (float)i;
    c.top_ids[2 * i] = c.ids[i], c.top_ids[2 * i + 1] = 3 + i;
    c.top_lp[2 * i] = c.lp[i], c.top_lp[2 * i + 1] = c.lp[i] - 1.5f;
  }
  c.marks[0] = (srv_mark){4, 2}, c.marks[1] = (srv_mark){11, 4}, c.marks[2] = (srv_mark){strlen(c.text), SRV_IDS};
  path p = {.n_steps = 6, .ctx = &c, .reset = srv_reset, .step = srv_step, .fini = srv_fini};
  snprintf(p.name, sizeof p.name,
           "server: 3 request bodies parsed (chat, text, ids), 2 answers, a stream's chunks");
  sweep(&p);
  rlm_chat_template_free(tm);
  rlm_tokenizer_free(t);
  rlm_model_free(c.ctx.h.model);
}

int main(void) {
  g_src = t_env("RINGLM_SOURCE_DIR");
  t_tmpdir(g_dir, sizeof g_dir, "alloc-fail");
  const double t0 = now_s();
  RUN(model_load);
  RUN(session_create);
  RUN(session_eval);
  RUN(rows_joining);
  RUN(tokenizer);
  RUN(chat_template);
  RUN(snapshot);
  RUN(generation);
  RUN(server_requests);
  printf("total %.1f s\n", now_s() - t0);
  return t_finish(g_dir);
}
