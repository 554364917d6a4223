/* test_gen.c -- the generation engine: speculative decoding against plain
 * decoding, on every fixture architecture and the embedded model.
 *
 * Greedy: the draft proposer (another fixture architecture: they share a
 * 256-id vocabulary) and n-gram lookup must give the plain engine's tokens
 * exactly, with prompts longer than the 16-token sliding window (rings wrap
 * during verification), under dense, 4-bit and K8V4 KV and max_kv rings
 * with sinks, several requests batched at once, fixed and adaptive
 * proposal lengths. Sampling: 20,000 seeded draws of the first generated
 * token, chi-square against the target's own distribution, for both
 * proposers (proposals must have been rejected and accepted both). Also:
 * seeded runs repeat, a draft with another vocabulary is refused naming
 * both sizes, and engine steps allocate nothing. Penalties: greedy
 * speculative output with frequency and presence penalties is still the
 * plain engine's. Logprobs: each one is log_softmax of the logits that
 * rlm_session_eval gives on a second session, greedy and sampled, plain
 * and speculative (whose greedy logprobs are the plain run's); the top
 * ids descend and start with the greedy id; -1 gives NULL. Verification
 * passes' logits are one-token steps' to the bit under int8 activations.
 */
#include "generate/spec.h"
#include "model/model.h"
#include "test.h"

#include <jansson.h>

static const char *g_src;
static char g_tmp[256];

static const char *const archs[] = {"llama", "qwen3", "mistral", "gemma3_text", "gemma4_text",
                                    "gemma4_keqv", "gemma4_moe"};
enum { N_ARCHS = sizeof archs / sizeof *archs, N_GEN = 40, N_REQ = 3 };

static int32_t g_prompt[96];

/* g_prompt = the fixture's prompt ids. */
static void load_prompt(const char *arch) {
  char path[600];
  snprintf(path, sizeof path, "%s/tests/fixtures/models/%s/fixture.json", g_src, arch);
  json_error_t je;
  json_t *j = json_load_file(path, 0, &je), *p = json_object_get(j, "prompt_ids");
  for (int i = 0; i < 96; i++) g_prompt[i] = (int32_t)json_integer_value(json_array_get(p, i));
  json_decref(j);
}

static rlm_model *load(const char *arch) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/tests/fixtures/models/%s", g_src, arch);
  load_prompt(arch);
  rlm_model *m = NULL;
  rlm_error err;
  CHECK_EQ(rlm_model_load(&m, dir, &err), RLM_OK);
  return m;
}

typedef struct kv_case {
  const char *name;
  int k_bits, v_bits;
  int64_t max_kv;
  int sinks;
} kv_case;

static const kv_case kv_cases[] = {
    {"dense", 0, 0, 0, 0}, {"4-bit", 4, 4, 0, 0}, {"k8v4", 8, 4, 0, 0}, {"rings+sinks", 0, 0, 24, 4}};

static rlm_session *open_rows(rlm_model *m, int rows, const kv_case *kc) {
  rlm_session_params p = rlm_session_params_default();
  p.n_rows = rows, p.prefill_chunk = 16, p.n_threads = 2, p.kv_group_size = 32;
  p.k_bits = kc->k_bits, p.v_bits = kc->v_bits, p.max_kv = kc->max_kv, p.kv_sinks = kc->sinks;
  rlm_session *s = NULL;
  rlm_error err;
  CHECK_EQ(rlm_session_create(&s, m, &p, &err), RLM_OK);
  if (!s) test_note("%s", err.msg);
  return s;
}

/* Request i's prompt: 40..60 ids that repeat a stretch (so lookup finds
 * matches), longer than the window. */
static int make_prompt(int i, int32_t *out) {
  int n = 0;
  for (int j = 0; j < 24 + 4 * i; j++) out[n++] = g_prompt[(i * 11 + j) % 96];
  for (int j = 0; j < 20 + 2 * i; j++) out[n++] = out[j];
  return n;
}

/* Runs N_REQ greedy requests through one engine; the ids land in
 * gen[req][N_GEN]. Returns drafted proposals (stats), -1 on error. */
static int64_t run_engine(rlm_session *t, rlm_session *d, int lookup, bool adaptive,
                          int32_t gen[N_REQ][N_GEN]) {
  rlm_gen_params gp = rlm_gen_params_default();
  gp.lookup_n = lookup, gp.draft_max = 6, gp.adaptive = adaptive;
  rlm_gen *g = NULL;
  rlm_error err;
  CHECK_EQ(rlm_gen_create(&g, t, d, NULL, &gp, &err), RLM_OK);
  if (!g) return -1;
  int32_t prompts[N_REQ][128];
  int n_got[N_REQ] = {0}, row_req[8];
  for (int i = 0; i < N_REQ; i++) {
    rlm_gen_request r = rlm_gen_request_default();
    r.prompt = prompts[i], r.n_prompt = make_prompt(i, prompts[i]), r.max_tokens = N_GEN, r.ignore_eos = true;
    int row;
    CHECK_EQ(rlm_gen_add(g, &r, &row, &err), RLM_OK);
    row_req[row] = i;
  }
  for (int steps = 0; rlm_gen_active(g) && steps < 1000; steps++) {
    const rlm_gen_event *ev;
    int n_ev;
    CHECK_EQ(rlm_gen_step(g, &ev, &n_ev, &err), RLM_OK);
    for (int e = 0; e < n_ev; e++) {
      int q = row_req[ev[e].row];
      for (int k = 0; k < ev[e].n_ids && n_got[q] < N_GEN; k++) gen[q][n_got[q]++] = ev[e].ids[k];
    }
  }
  for (int i = 0; i < N_REQ; i++) CHECK_EQ(n_got[i], N_GEN);
  rlm_gen_stats st;
  rlm_gen_get_stats(g, -1, &st);
  rlm_gen_free(g);
  return st.drafted;
}

static void check_greedy_arch(int a) {
  rlm_model *m = load(archs[a]), *dm = load(archs[(a + 1) % N_ARCHS]);
  load_prompt(archs[a]); /* the target's fixture prompt */
  if (!m || !dm) return;
  for (size_t c = 0; c < sizeof kv_cases / sizeof *kv_cases; c++) {
    const kv_case *kc = &kv_cases[c];
    int32_t plain[N_REQ][N_GEN], spec[N_REQ][N_GEN];
    rlm_session *t = open_rows(m, N_REQ, kc), *d = open_rows(dm, N_REQ, kc);
    if (!t || !d) break;
    CHECK_EQ(run_engine(t, NULL, 0, false, plain), 0);
    for (int mode = 0; mode < 4; mode++) { /* lookup, draft; each fixed and adaptive */
      int64_t drafted = run_engine(t, mode < 2 ? NULL : d, mode < 2 ? 2 : 0, mode % 2, spec);
      test_note("%s (draft %s) kv %s mode %d: drafted %lld", archs[a], archs[(a + 1) % N_ARCHS], kc->name,
                mode, (long long)drafted);
      CHECK(drafted > 0);
      CHECK(!memcmp(plain, spec, sizeof plain));
    }
    rlm_session_free(t), rlm_session_free(d);
  }
  rlm_model_free(m), rlm_model_free(dm);
}

TEST(greedy_speculative_equals_plain) {
  for (int a = 0; a < N_ARCHS; a++) check_greedy_arch(a);
}

/* The embedded model with its own draft, and a draft of another
 * vocabulary refused with both sizes named. */
TEST(embedded_model_and_its_draft) {
  char dir[512], ddir[512], fdir[512];
  snprintf(dir, sizeof dir, "%s/models/brown-15m-4bit", g_src);
  snprintf(ddir, sizeof ddir, "%s/models/brown-draft-1m-4bit", g_src);
  snprintf(fdir, sizeof fdir, "%s/tests/fixtures/models/llama", g_src);
  rlm_model *m = NULL, *dm = NULL, *fm = NULL;
  rlm_error err;
  CHECK_EQ(rlm_model_load(&m, dir, &err), RLM_OK);
  CHECK_EQ(rlm_model_load(&dm, ddir, &err), RLM_OK);
  CHECK_EQ(rlm_model_load(&fm, fdir, &err), RLM_OK);
  if (!m || !dm || !fm) return;
  load_prompt("llama");
  const kv_case *kc = &kv_cases[0];
  rlm_session *t = open_rows(m, N_REQ, kc), *d = open_rows(dm, N_REQ, kc), *f = open_rows(fm, N_REQ, kc);
  int32_t plain[N_REQ][N_GEN], spec[N_REQ][N_GEN];
  CHECK_EQ(run_engine(t, NULL, 0, false, plain), 0);
  CHECK(run_engine(t, d, 0, false, spec) > 0);
  CHECK(!memcmp(plain, spec, sizeof plain));
  CHECK(run_engine(t, NULL, 3, true, spec) > 0);
  CHECK(!memcmp(plain, spec, sizeof plain));
  rlm_gen *g = NULL;
  CHECK_EQ(rlm_gen_create(&g, t, f, NULL, NULL, &err), RLM_ERR_INVALID);
  char want[96];
  snprintf(want, sizeof want, "has %d ids, the target's %d", rlm_model_vocab_size(fm), rlm_model_vocab_size(m));
  CHECK_STR_CONTAINS(err.msg, want);
  rlm_gen_params gp = rlm_gen_params_default();
  gp.draft_max = 0;
  CHECK_EQ(rlm_gen_create(&g, t, d, NULL, &gp, &err), RLM_ERR_INVALID);
  gp.draft_max = 33;
  CHECK_EQ(rlm_gen_create(&g, t, d, NULL, &gp, &err), RLM_ERR_INVALID);
  CHECK_STR_CONTAINS(err.msg, "draft_max");
  rlm_session_free(t), rlm_session_free(d), rlm_session_free(f);
  rlm_model_free(m), rlm_model_free(dm), rlm_model_free(fm);
}

/* ---- sampling ------------------------------------------------------------ */

enum { DRAWS = 20000, ROWS = 50 };

/* Chi-square of counts against probabilities, cells with an expected
 * count below 5 merged; *df its degrees of freedom. */
static double chi_square(const long *count, const float *p, int V, long n, int *df) {
  double chi = 0, e_rest = 0, o_rest = 0;
  int cells = 0;
  for (int i = 0; i < V; i++) {
    double e = p[i] * (double)n;
    if (e < 5) {
      e_rest += e, o_rest += (double)count[i];
      continue;
    }
    chi += (count[i] - e) * (count[i] - e) / e, cells++;
  }
  if (e_rest >= 5) chi += (o_rest - e_rest) * (o_rest - e_rest) / e_rest, cells++;
  *df = cells - 1;
  return chi;
}

/* The 0.999 quantile of chi-square with df degrees of freedom (Wilson-
 * Hilferty; within 1% for df >= 3). */
static double chi_bound(int df) {
  const double z = 3.0902, k = df;
  double t = 1 - 2 / (9 * k) + z * sqrt(2 / (9 * k));
  return k * t * t * t;
}

/* 20,000 first tokens of one prompt, each a request with its own seed on
 * rows that already hold all but the prompt's last id (n_cached), so only
 * the verification pass runs per draw. */
static void first_tokens(rlm_session *t, rlm_session *d, int lookup, const int32_t *prompt, int n,
                         const rlm_sampler_params *sp, long *count, rlm_gen_stats *st) {
  rlm_gen_params gp = rlm_gen_params_default();
  gp.lookup_n = lookup, gp.draft_max = 4;
  rlm_gen *g = NULL;
  rlm_error err;
  CHECK_EQ(rlm_gen_create(&g, t, d, NULL, &gp, &err), RLM_OK);
  if (!g) return;
  for (int r = 0; r < ROWS; r++) {
    int32_t rows[128];
    for (int i = 0; i < n - 1; i++) rows[i] = r;
    CHECK_EQ(rlm_session_decode(t, &(rlm_batch){n - 1, prompt, rows, NULL}, NULL, &err), RLM_OK);
  }
  long done = 0;
  uint64_t seed = 1;
  while (done < DRAWS) {
    for (int r = 0; r < ROWS && done + r < DRAWS; r++) {
      rlm_gen_request rq = rlm_gen_request_default();
      rq.prompt = prompt, rq.n_prompt = n, rq.n_cached = n - 1, rq.row = r, rq.max_tokens = 1;
      rq.sampler = *sp, rq.sampler.seed = seed++, rq.ignore_eos = true;
      int row;
      CHECK_EQ(rlm_gen_add(g, &rq, &row, &err), RLM_OK);
    }
    const rlm_gen_event *ev;
    int n_ev;
    CHECK_EQ(rlm_gen_step(g, &ev, &n_ev, &err), RLM_OK);
    for (int e = 0; e < n_ev; e++) {
      CHECK_EQ(ev[e].n_ids, 1);
      if (ev[e].n_ids == 1) count[ev[e].ids[0]]++;
      /* the row holds the prompt now: back to all but its last id */
      CHECK_EQ(rlm_session_rollback(t, ev[e].row, 1, &err), RLM_OK);
    }
    done += n_ev;
    if (!n_ev) break;
  }
  rlm_gen_get_stats(g, -1, st);
  rlm_gen_free(g);
}

/* The target's distribution of the token after prompt[0:n). */
static void target_probs(rlm_model *m, const int32_t *prompt, int n, const rlm_sampler_params *sp,
                         float *p) {
  const int V = rlm_model_vocab_size(m);
  rlm_session *one = open_rows(m, 1, &kv_cases[0]);
  float *logits = malloc(sizeof(float) * V), *w = malloc(sizeof(float) * V);
  int32_t *ids = malloc(sizeof(int32_t) * V);
  rlm_sampler *smp = NULL;
  rlm_error err;
  CHECK_EQ(rlm_session_eval(one, prompt, n, logits, false, &err), RLM_OK);
  CHECK_EQ(rlm_sampler_create(&smp, sp, V, &err), RLM_OK);
  for (int i = 0; i < n; i++) rlm_sampler_accept(smp, prompt[i]);
  rlm__sampler_probs(smp, logits, p, ids, w);
  rlm_sampler_free(smp);
  free(logits), free(w), free(ids);
  rlm_session_free(one);
}

/* A prompt whose n-gram lookup (n = 3) proposes a token c that the
 * target keeps about half the time: base + [c] + base's last 3 ids, c
 * chosen among all ids for p(c) after it nearest 1/2. */
static int lookup_prompt(rlm_model *m, const rlm_sampler_params *sp, int32_t *out, float *p) {
  const int V = rlm_model_vocab_size(m);
  int n = make_prompt(1, out);
  memcpy(out + n + 1, out + n - 3, 3 * sizeof *out);
  int best = 0;
  float best_p = -10;
  for (int c = 0; c < V; c++) {
    out[n] = c;
    target_probs(m, out, n + 4, sp, p);
    if (fabsf(p[c] - 0.5f) < fabsf(best_p - 0.5f)) best_p = p[c], best = c;
  }
  out[n] = best;
  target_probs(m, out, n + 4, sp, p);
  test_note("lookup proposes %d, p %.3f", best, best_p);
  return n + 4;
}

TEST(speculative_sampling_keeps_the_target_distribution) {
  rlm_model *m = load("gemma3_text"), *dm = NULL;
  if (!m) return;
  /* the draft: the target with 4-bit weights, close to it but not equal */
  char src[512], q4[300];
  snprintf(src, sizeof src, "%s/tests/fixtures/models/gemma3_text", g_src);
  snprintf(q4, sizeof q4, "%s/q4", g_tmp);
  rlm_quantize_params qp = rlm_quantize_params_default();
  qp.bits = 4, qp.group_size = 32;
  rlm_error err;
  CHECK_EQ(rlm_quantize_model(src, q4, &qp, NULL, &err), RLM_OK);
  CHECK_EQ(rlm_model_load(&dm, q4, &err), RLM_OK);
  if (!dm) return;
  const int V = rlm_model_vocab_size(m);
  rlm_sampler_params sp = rlm_sampler_params_default();
  sp.temp = 1.2f, sp.top_k = 40;
  int32_t prompt[128], lprompt[128];
  float *p = malloc(sizeof(float) * V), *lp = malloc(sizeof(float) * V);
  const int n = make_prompt(1, prompt), ln = lookup_prompt(m, &sp, lprompt, lp);
  target_probs(m, prompt, n, &sp, p);
  for (int proposer = 0; proposer < 3; proposer++) { /* plain, lookup, draft */
    rlm_session *t = open_rows(m, ROWS, &kv_cases[0]), *d = proposer == 2 ? open_rows(dm, ROWS, &kv_cases[0]) : NULL;
    long *count = calloc((size_t)V, sizeof *count);
    rlm_gen_stats st = {0};
    const int32_t *pr = proposer == 1 ? lprompt : prompt;
    first_tokens(t, d, proposer == 1 ? 3 : 0, pr, proposer == 1 ? ln : n, &sp, count, &st);
    int df;
    double chi = chi_square(count, proposer == 1 ? lp : p, V, DRAWS, &df);
    test_note("proposer %d: chi2 %.1f df %d bound %.1f; drafted %lld accepted %lld", proposer, chi, df,
              chi_bound(df), (long long)st.drafted, (long long)st.accepted);
    fprintf(stderr, "     proposer %s: chi2 %.1f df %d bound %.1f, drafted %lld accepted %lld\n",
            proposer == 0 ? "none" : proposer == 1 ? "lookup" : "draft", chi, df, chi_bound(df),
            (long long)st.drafted, (long long)st.accepted);
    CHECK(df >= 3 && chi < chi_bound(df));
    if (proposer) CHECK(st.accepted > DRAWS / 50 && st.accepted < st.drafted - DRAWS / 50);
    free(count);
    rlm_session_free(t), rlm_session_free(d);
  }
  free(p), free(lp);
  rlm_model_free(m), rlm_model_free(dm);
}

/* Two seeded sampling runs with the draft give the same tokens; another
 * seed gives others. */
TEST(seeded_runs_repeat) {
  rlm_model *m = load("qwen3"), *dm = load("mistral");
  load_prompt("qwen3");
  if (!m || !dm) return;
  int32_t out[3][64], prompt[128];
  const int n = make_prompt(0, prompt);
  for (int run = 0; run < 3; run++) {
    rlm_session *t = open_rows(m, 1, &kv_cases[1]), *d = open_rows(dm, 1, &kv_cases[1]);
    rlm_gen *g = NULL;
    rlm_error err;
    CHECK_EQ(rlm_gen_create(&g, t, d, NULL, NULL, &err), RLM_OK);
    rlm_gen_request rq = rlm_gen_request_default();
    rq.prompt = prompt, rq.n_prompt = n, rq.max_tokens = 64, rq.ignore_eos = true;
    rq.sampler.temp = 0.9f, rq.sampler.top_p = 0.9f, rq.sampler.repeat_penalty = 1.2f;
    rq.sampler.seed = run == 2 ? 99 : 7;
    int row, k = 0;
    CHECK_EQ(rlm_gen_add(g, &rq, &row, &err), RLM_OK);
    while (rlm_gen_active(g)) {
      const rlm_gen_event *ev;
      int n_ev;
      CHECK_EQ(rlm_gen_step(g, &ev, &n_ev, &err), RLM_OK);
      for (int e = 0; e < n_ev; e++)
        for (int i = 0; i < ev[e].n_ids; i++) out[run][k++] = ev[e].ids[i];
    }
    CHECK_EQ(k, 64);
    rlm_gen_free(g);
    rlm_session_free(t), rlm_session_free(d);
  }
  CHECK(!memcmp(out[0], out[1], sizeof out[0]));
  CHECK(memcmp(out[0], out[2], sizeof out[0]) != 0);
  rlm_model_free(m), rlm_model_free(dm);
}

/* ---- penalties and logprobs ------------------------------------------------ */

enum { N_LP = 24, N_TOP = 5 };

/* One request's output and what its events said about logprobs. */
typedef struct lp_run {
  int32_t ids[N_LP];
  float lp[N_LP];
  int32_t top[N_LP][N_TOP];
  float top_lp[N_LP][N_TOP];
  int n;
  bool all_null;              /* no event had a logprob pointer           */
  rlm_gen_stats st;
} lp_run;

static void take_event(const rlm_gen_event *e, int n_top, lp_run *out) {
  out->all_null = out->all_null && !e->logprob && !e->top_ids && !e->top_logprobs && !e->n_top;
  if (n_top >= 0) CHECK(e->logprob && e->top_ids && e->top_logprobs && e->n_top == n_top);
  for (int i = 0; i < e->n_ids && out->n < N_LP; i++, out->n++) {
    out->ids[out->n] = e->ids[i];
    if (!e->logprob) continue;
    out->lp[out->n] = e->logprob[i];
    for (int k = 0; k < e->n_top && k < N_TOP; k++) { /* the first N_TOP */
      out->top[out->n][k] = e->top_ids[i * e->n_top + k];
      out->top_lp[out->n][k] = e->top_logprobs[i * e->n_top + k];
    }
  }
}

/* One request of N_LP ids with logprobs n_top through an engine on fresh
 * one-row sessions of m (and of the draft dm, or n-gram lookup). */
static void run_one(rlm_model *m, rlm_model *dm, int lookup, const int32_t *prompt, int n,
                    const rlm_sampler_params *sp, int n_top, lp_run *out) {
  rlm_session *t = open_rows(m, 1, &kv_cases[0]), *d = dm ? open_rows(dm, 1, &kv_cases[0]) : NULL;
  rlm_gen_params gp = rlm_gen_params_default();
  gp.lookup_n = lookup, gp.draft_max = 4;
  rlm_gen *g = NULL;
  rlm_error err;
  CHECK_EQ(rlm_gen_create(&g, t, d, NULL, &gp, &err), RLM_OK);
  rlm_gen_request rq = rlm_gen_request_default();
  rq.prompt = prompt, rq.n_prompt = n, rq.max_tokens = N_LP, rq.ignore_eos = true;
  rq.sampler = *sp, rq.logprobs = n_top;
  int row;
  CHECK_EQ(rlm_gen_add(g, &rq, &row, &err), RLM_OK);
  *out = (lp_run){.all_null = true};
  for (int steps = 0; rlm_gen_active(g) && steps < 1000; steps++) {
    const rlm_gen_event *ev;
    int n_ev;
    CHECK_EQ(rlm_gen_step(g, &ev, &n_ev, &err), RLM_OK);
    for (int e = 0; e < n_ev; e++) take_event(&ev[e], n_top, out);
  }
  CHECK_EQ(out->n, N_LP);
  rlm_gen_get_stats(g, -1, &out->st);
  test_note("lookup %d, draft %s: drafted %lld accepted %lld", lookup, dm ? "yes" : "no",
            (long long)out->st.drafted, (long long)out->st.accepted);
  rlm_gen_free(g);
  rlm_session_free(t), rlm_session_free(d);
}

/* log_softmax(x) in double. */
static void log_softmax(const float *x, int V, double *out) {
  double mx = x[0], sum = 0;
  for (int i = 1; i < V; i++) mx = x[i] > mx ? x[i] : mx;
  for (int i = 0; i < V; i++) sum += exp(x[i] - mx);
  for (int i = 0; i < V; i++) out[i] = x[i] - mx - log(sum);
}

/* Mistakes in position k's logprobs against ls = log_softmax: its id's,
 * the top ids' (descending, the n_top largest), and top[0] the id itself
 * when greedy. */
static int logprob_errors(const lp_run *r, int k, const double *ls, int V, int n_top, bool greedy) {
  int bad = fabs(r->lp[k] - ls[r->ids[k]]) > 1e-4;
  for (int i = 0; i < n_top; i++) {
    bad += fabs(r->top_lp[k][i] - ls[r->top[k][i]]) > 1e-4;
    bad += i > 0 && r->top_lp[k][i] > r->top_lp[k][i - 1];
  }
  for (int j = 0; j < V && n_top > 0; j++) { /* nothing left out beats the last */
    bool in = false;
    for (int i = 0; i < n_top; i++) in = in || r->top[k][i] == j;
    bad += !in && ls[j] > ls[r->top[k][n_top - 1]] + 1e-4;
  }
  return bad + (greedy && n_top > 0 && r->top[k][0] != r->ids[k]);
}

/* The run's logprobs against a second session fed the prompt, then each
 * generated id in turn. */
static void check_against_eval(rlm_model *m, const int32_t *prompt, int n, const lp_run *r, int n_top,
                               bool greedy) {
  const int V = rlm_model_vocab_size(m);
  rlm_session *one = open_rows(m, 1, &kv_cases[0]);
  float *logits = malloc(sizeof(float) * V);
  double *ls = malloc(sizeof(double) * V);
  rlm_error err;
  CHECK_EQ(rlm_session_eval(one, prompt, n, logits, false, &err), RLM_OK);
  int bad = 0;
  for (int k = 0; k < r->n; k++) {
    log_softmax(logits, V, ls);
    bad += logprob_errors(r, k, ls, V, n_top, greedy);
    CHECK_EQ(rlm_session_eval(one, &r->ids[k], 1, logits, false, &err), RLM_OK);
  }
  CHECK_EQ(bad, 0);
  free(logits), free(ls);
  rlm_session_free(one);
}

/* Two runs' ids equal and logprobs within 1e-4. */
static bool same_logprobs(const lp_run *a, const lp_run *b, int n_top) {
  bool same = !memcmp(a->ids, b->ids, sizeof a->ids);
  for (int k = 0; k < N_LP && same; k++) {
    same = fabsf(a->lp[k] - b->lp[k]) <= 1e-4f;
    for (int i = 0; i < n_top && same; i++)
      same = a->top[k][i] == b->top[k][i] && fabsf(a->top_lp[k][i] - b->top_lp[k][i]) <= 1e-4f;
  }
  return same;
}

/* The draft is the target itself (on a session of its own), so that its
 * proposals are kept and events carry several verified ids. */
TEST(logprobs_are_the_raw_log_softmax) {
  rlm_model *m = load("gemma3_text");
  if (!m) return;
  int32_t prompt[128];
  const int n = make_prompt(0, prompt);
  rlm_sampler_params greedy = rlm_sampler_params_default(), hot = greedy;
  hot.temp = 0.9f, hot.top_k = 20, hot.seed = 3, hot.repeat_penalty = 1.3f, hot.frequency_penalty = 0.5f;
  lp_run plain, spec, none;
  run_one(m, NULL, 0, prompt, n, &greedy, N_TOP, &plain);
  check_against_eval(m, prompt, n, &plain, N_TOP, true);
  for (int proposer = 0; proposer < 2; proposer++) { /* lookup, draft */
    run_one(m, proposer ? m : NULL, proposer ? 0 : 2, prompt, n, &greedy, N_TOP, &spec);
    CHECK(spec.st.accepted > 0);
    CHECK(same_logprobs(&plain, &spec, N_TOP));
  }
  /* sampled, penalised: still the raw distribution's (the test's own
   * log_softmax knows no penalty), plain and verified */
  for (int proposer = 0; proposer < 3; proposer++) {
    run_one(m, proposer == 2 ? m : NULL, proposer == 1 ? 2 : 0, prompt, n, &hot, N_TOP, &spec);
    CHECK(proposer == 0 || spec.st.accepted > 0);
    check_against_eval(m, prompt, n, &spec, N_TOP, false);
  }
  run_one(m, NULL, 0, prompt, n, &greedy, 0, &spec); /* the id's alone */
  CHECK(same_logprobs(&plain, &spec, 0));
  run_one(m, NULL, 0, prompt, n, &greedy, RLM_GEN_LOGPROBS_MAX, &spec);
  check_against_eval(m, prompt, n, &spec, N_TOP, true); /* its first N_TOP */
  run_one(m, NULL, 2, prompt, n, &greedy, -1, &none);
  CHECK(none.all_null && !plain.all_null);
  CHECK(!memcmp(none.ids, plain.ids, sizeof none.ids));
  rlm_model_free(m);
}

/* Out of range logprobs name the field. */
TEST(logprobs_range) {
  rlm_model *m = load("llama");
  if (!m) return;
  rlm_session *t = open_rows(m, 1, &kv_cases[0]);
  rlm_gen *g = NULL;
  rlm_error err;
  CHECK_EQ(rlm_gen_create(&g, t, NULL, NULL, NULL, &err), RLM_OK);
  CHECK_EQ(rlm_gen_request_default().logprobs, -1);
  rlm_gen_request rq = rlm_gen_request_default();
  rq.prompt = g_prompt, rq.n_prompt = 8, rq.logprobs = RLM_GEN_LOGPROBS_MAX + 1;
  int row;
  CHECK_EQ(rlm_gen_add(g, &rq, &row, &err), RLM_ERR_INVALID);
  CHECK_STR_CONTAINS(err.msg, "logprobs 21 is out of range [-1, 20]");
  rq.logprobs = -2;
  CHECK_EQ(rlm_gen_add(g, &rq, &row, &err), RLM_ERR_INVALID);
  CHECK_STR_CONTAINS(err.msg, "logprobs -2");
  rlm_gen_free(g);
  rlm_session_free(t);
  rlm_model_free(m);
}

/* Greedy with repetition, frequency and presence penalties over a window
 * shorter than the output (ids leave it during verification): lookup and
 * a draft (the target itself, penalised alike, so proposals are kept) give
 * the plain engine's tokens, which the penalties changed. */
TEST(penalties_speculative_equals_plain) {
  rlm_model *m = load("qwen3");
  if (!m) return;
  rlm_sampler_params sp = rlm_sampler_params_default(), off = sp;
  sp.repeat_penalty = 1.1f, sp.frequency_penalty = 0.6f, sp.presence_penalty = 0.4f, sp.repeat_last_n = 16;
  int32_t prompt[128];
  const int n = make_prompt(2, prompt);
  lp_run plain, spec, unpenalised;
  run_one(m, NULL, 0, prompt, n, &sp, -1, &plain);
  run_one(m, NULL, 0, prompt, n, &off, -1, &unpenalised);
  CHECK(memcmp(plain.ids, unpenalised.ids, sizeof plain.ids) != 0);
  for (int proposer = 0; proposer < 2; proposer++) {
    run_one(m, proposer ? m : NULL, proposer ? 0 : 2, prompt, n, &sp, -1, &spec);
    CHECK(spec.st.accepted > 0);
    CHECK(!memcmp(plain.ids, spec.ids, sizeof plain.ids));
  }
  rlm_model_free(m);
}

/* A verification pass's logits are a run of one-token steps' to the bit
 * under int8 activations (backend_cpu.c's STEPWISE RUNS): session a feeds
 * seq one id a step, session b CH at a time wanting every logit, after
 * the same prompt, longer than the window (rings wrap), two threads, on
 * the embedded model (KV-shared layers) and a Gemma 4 fixture, for dense,
 * 4-bit and ring+sink caches. Before, a two-token pass's logits were up to
 * 0.36 off the steps' on the embedded model. CH = 6, 11 and 33: under,
 * past the AMX tiles' 8 rows (an AMX machine's products differed there
 * until the verification's products were made row-exact) and past the
 * 4-bit panels' 32. */
static void check_stepwise(rlm_model *m, const kv_case *kc, int n_prompt, int32_t V, int CH) {
  enum { T = 66 };
  rlm_session_params p = rlm_session_params_default();
  p.n_threads = 2, p.act_bits = 8, p.kv_group_size = 32, p.prefill_chunk = 64;
  p.k_bits = kc->k_bits, p.v_bits = kc->v_bits, p.max_kv = kc->max_kv, p.kv_sinks = kc->sinks;
  rlm_session *a = NULL, *b = NULL;
  rlm_error err;
  CHECK_EQ(rlm_session_create(&a, m, &p, &err), RLM_OK);
  CHECK_EQ(rlm_session_create(&b, m, &p, &err), RLM_OK);
  int32_t *ids = xmalloc((size_t)(n_prompt + T) * sizeof *ids);
  float *la = xmalloc((size_t)T * (size_t)V * sizeof *la), *lb = xmalloc((size_t)CH * (size_t)V * sizeof *lb);
  for (int i = 0; i < n_prompt + T; i++) ids[i] = (int32_t)((i * 37 + 11) % (V - 8) + 5);
  if (a && b) {
    CHECK_EQ(rlm_session_eval(a, ids, n_prompt, la, false, &err), RLM_OK);
    CHECK_EQ(rlm_session_eval(b, ids, n_prompt, lb, false, &err), RLM_OK);
    for (int t = 0; t < T; t++)
      CHECK_EQ(rlm_session_eval(a, ids + n_prompt + t, 1, la + (size_t)t * V, false, &err), RLM_OK);
    int differ = 0;
    for (int t = 0; t < T; t += CH) {
      CHECK_EQ(rlm_session_eval(b, ids + n_prompt + t, CH, lb, true, &err), RLM_OK);
      differ += memcmp(lb, la + (size_t)t * V, (size_t)CH * (size_t)V * sizeof *lb) != 0;
    }
    test_note("kv %s, %d-token passes: %d of %d differ", kc->name, CH, differ, T / CH);
    CHECK_EQ(differ, 0);
  }
  free(ids), free(la), free(lb);
  rlm_session_free(a), rlm_session_free(b);
}

TEST(verification_logits_are_decode_steps) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/models/brown-15m-4bit", g_src);
  rlm_model *m = NULL, *f = load("gemma4_text");
  rlm_error err;
  CHECK_EQ(rlm_model_load(&m, dir, &err), RLM_OK);
  static const kv_case cases[] = {{"dense", 0, 0, 0, 0}, {"4-bit", 4, 4, 0, 0}, {"rings+sinks", 0, 0, 24, 4}};
  static const int chunks[] = {6, 11, 33};
  for (int c = 0; c < N_OF(cases); c++)
    for (int k = 0; k < N_OF(chunks); k++) {
      if (m) check_stepwise(m, &cases[c], 140, rlm_model_vocab_size(m), chunks[k]);
      if (f) check_stepwise(f, &cases[c], 40, rlm_model_vocab_size(f), chunks[k]);
    }
  rlm_model_free(m), rlm_model_free(f);
}

/* Engine steps (decode, draft passes, verification, rollback) allocate
 * nothing once the requests are running, logprobs and penalties too. */
TEST(engine_steps_do_not_allocate) {
  rlm_model *m = load("gemma4_text"), *dm = load("gemma3_text");
  load_prompt("gemma4_text");
  if (!m || !dm) return;
  for (int mode = 0; mode < 3; mode++) {
    rlm_session_params p = rlm_session_params_default();
    p.n_rows = 3, p.prefill_chunk = 16, p.kv_group_size = 32, p.k_bits = 4, p.v_bits = 4, p.n_ctx = 512;
    rlm_session *t = NULL, *d = NULL;
    rlm_error err;
    CHECK_EQ(rlm_session_create(&t, m, &p, &err), RLM_OK);
    CHECK_EQ(rlm_session_create(&d, dm, &p, &err), RLM_OK);
    rlm_gen_params gp = rlm_gen_params_default();
    gp.lookup_n = mode == 1 ? 2 : 0, gp.adaptive = true;
    rlm_gen *g = NULL;
    CHECK_EQ(rlm_gen_create(&g, t, mode == 2 ? d : NULL, NULL, &gp, &err), RLM_OK);
    int32_t prompts[3][128];
    int n_prompt[3];
    for (int i = 0; i < 3; i++) {
      rlm_gen_request rq = rlm_gen_request_default();
      rq.prompt = prompts[i], rq.n_prompt = n_prompt[i] = make_prompt(i, prompts[i]);
      rq.max_tokens = 300, rq.ignore_eos = true;
      rq.sampler.temp = i == 2 ? 0.8f : 0.0f;
      rq.sampler.frequency_penalty = i == 1 ? 0.3f : 0.0f;
      rq.logprobs = i == 0 ? -1 : i == 1 ? 0 : RLM_GEN_LOGPROBS_MAX;
      int row;
      CHECK_EQ(rlm_gen_add(g, &rq, &row, &err), RLM_OK);
    }
    const rlm_gen_event *ev;
    int n_ev;
    /* until every prompt is in (and its draft row caught up: one more) */
    for (int s = 0, in = 0; in < 2 && s < 100; s++) {
      CHECK_EQ(rlm_gen_step(g, &ev, &n_ev, &err), RLM_OK);
      bool all = true;
      for (int i = 0; i < 3; i++) all = all && rlm_session_row_position(t, i) >= n_prompt[i] - 1;
      in += all;
    }
    uint64_t before = rlm__alloc_count();
    for (int s = 0; s < 10; s++) CHECK_EQ(rlm_gen_step(g, &ev, &n_ev, &err), RLM_OK);
    test_note("mode %d", mode);
    CHECK_EQ(rlm__alloc_count() - before, 0);
    rlm_gen_free(g);
    rlm_session_free(t), rlm_session_free(d);
  }
  rlm_model_free(m), rlm_model_free(dm);
}

int main(void) {
  g_src = t_env("RINGLM_SOURCE_DIR");
  if (!g_src) return 1;
  t_tmpdir(g_tmp, sizeof g_tmp, "gen");
  RUN(greedy_speculative_equals_plain);
  RUN(embedded_model_and_its_draft);
  RUN(speculative_sampling_keeps_the_target_distribution);
  RUN(seeded_runs_repeat);
  RUN(logprobs_are_the_raw_log_softmax);
  RUN(logprobs_range);
  RUN(penalties_speculative_equals_plain);
  RUN(engine_steps_do_not_allocate);
  RUN(verification_logits_are_decode_steps);
  return t_finish(g_tmp);
}
