/* gen.c -- the generation engine (ringlm.h, "Generation"): requests on the
 * rows of a target session, advanced together one step at a time, with
 * speculative decoding by a draft session or n-gram lookup.
 *
 * A row's history is its prompt and output ids; the target row's KV holds
 * all of it but the last id ("pending"), whose logits the next token needs.
 * So every step feeds each decoding row [pending, d_1..d_k] (k = 0 without
 * a proposer), wanting all k + 1 logits, and prefilling rows their next
 * prompt ids (no logits) in the same pass, decode rows first, prefill in
 * what is left of prefill_chunk tokens. Verification walks a row's
 * positions in order -- the penalties' history must hold every
 * token kept before the one judged -- and emits m tokens: the kept
 * proposals and one of the target's own (the agreeing prefix and the
 * argmax when greedy; the speculative sampling rule otherwise, spec.h).
 * The target row then rolls back the k + 1 - m ids it fed beyond the new
 * pending one, the draft row the proposals it fed that were not kept:
 * rings included, nothing is recomputed.
 *
 * The draft row follows the history lazily: its first pass of a step feeds
 * whatever it lacks (the whole prompt the first time, then the ids kept
 * since) and samples d_1; each further pass feeds one proposal. Rows
 * propose different numbers of tokens and leave the draft passes as they
 * finish.
 *
 * Logprobs (requests that want them) come from the target's logits of
 * the position that produced each emitted id, the verification pass's
 * for a proposal, so they cost no pass: a log-sum-exp over the vocabulary
 * and a partial selection of the top ids, taken before the sampler's
 * penalties edit those logits (it samples from a copy). They are stored
 * with the id in the step's output as it is emitted: the id then waits as
 * the pending one, and the next pass overwrites the logits it came from.
 *
 * Every buffer a step uses is sized at rlm_gen_create (logits of
 * rows x (draft_max + 1) positions, the draft's distributions when it
 * samples, each row's output and logprobs) or at rlm_gen_add (history,
 * sampler, text, stop-string room for any piece), so a step allocates
 * nothing unless a request without max_tokens outgrows its history, and
 * then only first, before it changes anything: a step that fails leaves
 * every row as it was.
 */
#include "generate/spec.h"
#include "model/model.h"

#include <math.h>
#include <stdlib.h>

enum { MAX_DRAFT = 32, PIECE_MAX = 4096, HIST_SLACK = 1024 };

typedef enum row_state { ROW_FREE = 0, ROW_PREFILL, ROW_DECODE } row_state;

typedef struct gen_row {
  row_state st;
  rlm_gen_request rq;          /* prompt and stops not kept               */
  int32_t *hist;               /* prompt then output (an ending EOS too)  */
  int64_t n_hist, cap_hist;
  int64_t fed;                 /* the target row holds hist[0, fed)       */
  int64_t dfed;                /* the draft row holds hist[0, dfed)       */
  int64_t limit;               /* positions the row may reach (0: none)   */
  rlm_sampler *smp, *dsmp;     /* target's; the draft's (draft session)   */
  rlm_detok_stream *ds;
  rlm_stop *stop;
  int k;                       /* proposal length now (adaptive)          */
  int idle;                    /* at k = 0: decode steps since a probe    */
  int n_draft;                 /* this step's proposals                   */
  int32_t draft[MAX_DRAFT];
  int lg0;                     /* its first logits row in the target pass */
  rlm_gen_stats st_row;
  /* this step's output */
  int32_t out[MAX_DRAFT + 1];
  int n_out;
  float *lp;                   /* [K + 1] log p of each out id            */
  int32_t *top_ids;            /* [K + 1][n_top] the most likely ids ...  */
  float *top_lp;               /* [K + 1][n_top] ... and their log p,
                                  n_top <= RLM_GEN_LOGPROBS_MAX           */
  char *text;                  /* [(K + 3) * PIECE_MAX]: the step's pieces
                                  and a held-back stop-string prefix      */
  size_t text_len;
  rlm_finish fin;
  bool by_string;              /* fin came from a stop string             */
} gen_row;

struct rlm_gen {
  rlm_session *t, *d;
  const rlm_tokenizer *tok;
  rlm_gen_params p;
  int R, K;                    /* rows; proposals per row and step (0: none) */
  int32_t V;
  gen_row *rows;
  int32_t *ids, *brow;         /* the pass being built [cap]              */
  bool *want;
  int cap;
  float *lg;                   /* target logits [R * (K + 1)][V]          */
  float *dlg;                  /* draft logits [R][V]                     */
  float *q;                    /* the draft's distributions [R][K][V]     */
  float *pv, *resid, *w;       /* [V] scratch                             */
  int32_t *ids_s;              /* [V]                                     */
  float *raw;                  /* [V] what judge samples from when the raw
                                  logits are wanted for logprobs          */
  uint32_t *wbits;             /* [V] the log-sum-exp's weights           */
  char *piece;                 /* [PIECE_MAX]                             */
  rlm_gen_event *ev;           /* [R]                                     */
  rlm_gen_stats tot;
};

rlm_gen_params rlm_gen_params_default(void) {
  return (rlm_gen_params){.draft_max = 8, .lookup_n = 0, .adaptive = false};
}

rlm_gen_request rlm_gen_request_default(void) {
  return (rlm_gen_request){.row = -1, .sampler = rlm_sampler_params_default(), .max_tokens = -1,
                           .speculate = true, .logprobs = -1};
}

/* ---- create / free -------------------------------------------------------- */

static rlm_status check_create(rlm_session *t, rlm_session *d, const rlm_gen_params *p,
                               rlm_error *err) {
  const char *fn = "rlm_gen_create";
  if (!t) return rlm__err(err, RLM_ERR_INVALID, "%s: NULL target session", fn);
  if (p->draft_max < 1 || p->draft_max > MAX_DRAFT)
    return rlm__err(err, RLM_ERR_INVALID, "%s: draft_max %d is out of range [1, %d]", fn, p->draft_max,
                    MAX_DRAFT);
  if (p->lookup_n < 0 || p->lookup_n > 64)
    return rlm__err(err, RLM_ERR_INVALID, "%s: lookup_n %d is out of range [0, 64]", fn, p->lookup_n);
  if (!d && !p->lookup_n) return RLM_OK;
  /* a verification appends draft_max + 1 ids that rollback must cover */
  if (p->draft_max + 1 > t->p.prefill_chunk || (d && p->draft_max + 1 > d->p.prefill_chunk))
    return rlm__err(err, RLM_ERR_INVALID, "%s: draft_max %d needs prefill_chunk >= %d", fn, p->draft_max,
                    p->draft_max + 1);
  if (!d) return RLM_OK;
  if (d->m->cfg.vocab != t->m->cfg.vocab)
    return rlm__err(err, RLM_ERR_INVALID, "%s: the draft model's vocabulary has %d ids, the target's %d",
                    fn, d->m->cfg.vocab, t->m->cfg.vocab);
  if (d->p.n_rows < t->p.n_rows)
    return rlm__err(err, RLM_ERR_INVALID, "%s: the draft session has %d rows, the target %d", fn,
                    d->p.n_rows, t->p.n_rows);
  return RLM_OK;
}

/* A row's step output: its text and logprobs (K + 1 ids at most). */
static bool alloc_row(gen_row *w, size_t K) {
  w->text = rlm__malloc((K + 3) * PIECE_MAX);
  w->lp = rlm__malloc((K + 1) * sizeof *w->lp);
  w->top_ids = rlm__malloc((K + 1) * RLM_GEN_LOGPROBS_MAX * sizeof *w->top_ids);
  w->top_lp = rlm__malloc((K + 1) * RLM_GEN_LOGPROBS_MAX * sizeof *w->top_lp);
  return w->text && w->lp && w->top_ids && w->top_lp;
}

static rlm_status alloc_engine(rlm_gen *g, rlm_error *err) {
  const size_t R = (size_t)g->R, K = (size_t)g->K, V = (size_t)g->V;
  g->cap = (int)(R * (K + 1)) + g->t->p.prefill_chunk;
  g->rows = rlm__calloc(R, sizeof *g->rows);
  g->ids = rlm__malloc((size_t)g->cap * sizeof *g->ids);
  g->brow = rlm__malloc((size_t)g->cap * sizeof *g->brow);
  g->want = rlm__malloc((size_t)g->cap * sizeof *g->want);
  g->lg = rlm_session_host_alloc(g->t, R * (K + 1) * V * sizeof *g->lg); /* a GPU's copies at full speed */
  g->dlg = g->d ? rlm_session_host_alloc(g->d, R * V * sizeof *g->dlg) : NULL;
  g->q = g->d ? rlm__malloc(R * K * V * sizeof *g->q) : NULL;
  g->pv = rlm__malloc(V * sizeof *g->pv);
  g->resid = rlm__malloc(V * sizeof *g->resid);
  g->w = rlm__malloc(V * sizeof *g->w);
  g->ids_s = rlm__malloc(V * sizeof *g->ids_s);
  g->raw = rlm__malloc(V * sizeof *g->raw);
  g->wbits = rlm__malloc(V * sizeof *g->wbits);
  g->piece = rlm__malloc(PIECE_MAX);
  g->ev = rlm__malloc(R * sizeof *g->ev);
  bool ok = g->rows && g->ids && g->brow && g->want && g->lg && (!g->d || (g->dlg && g->q)) && g->pv &&
            g->resid && g->w && g->ids_s && g->raw && g->wbits && g->piece && g->ev;
  for (size_t r = 0; ok && r < R; r++) ok = alloc_row(&g->rows[r], K);
  return ok ? RLM_OK : rlm__err_nomem(err, "generation engine", R * (K + 1) * V * sizeof(float));
}

rlm_status rlm_gen_create(rlm_gen **out, rlm_session *target, rlm_session *draft,
                          const rlm_tokenizer *tok, const rlm_gen_params *p, rlm_error *err) {
  if (!out) return rlm__err(err, RLM_ERR_INVALID, "rlm_gen_create: NULL argument");
  *out = NULL;
  const rlm_gen_params params = p ? *p : rlm_gen_params_default();
  rlm_status rc = check_create(target, draft, &params, err);
  if (rc) return rc;
  rlm_gen *g = rlm__calloc(1, sizeof *g);
  if (!g) return rlm__err_nomem(err, "generation engine", sizeof *g);
  g->t = target, g->d = draft, g->tok = tok, g->p = params;
  g->R = target->p.n_rows, g->V = target->m->cfg.vocab;
  g->K = draft || params.lookup_n ? params.draft_max : 0;
  if ((rc = alloc_engine(g, err))) {
    rlm_gen_free(g);
    return rc;
  }
  *out = g;
  return RLM_OK;
}

static void row_release(gen_row *w) {
  rlm_sampler_free(w->smp), rlm_sampler_free(w->dsmp);
  rlm_detok_stream_free(w->ds);
  rlm_stop_free(w->stop);
  w->smp = w->dsmp = NULL, w->ds = NULL, w->stop = NULL;
  w->st = ROW_FREE;
}

void rlm_gen_free(rlm_gen *g) {
  if (!g) return;
  for (int r = 0; g->rows && r < g->R; r++) {
    row_release(&g->rows[r]);
    rlm__free(g->rows[r].hist);
    rlm__free(g->rows[r].text);
    rlm__free(g->rows[r].lp), rlm__free(g->rows[r].top_ids), rlm__free(g->rows[r].top_lp);
  }
  rlm__free(g->rows), rlm__free(g->ids), rlm__free(g->brow), rlm__free(g->want);
  rlm_host_free(g->lg), rlm_host_free(g->dlg), rlm__free(g->q);
  rlm__free(g->pv), rlm__free(g->resid), rlm__free(g->w), rlm__free(g->ids_s);
  rlm__free(g->raw), rlm__free(g->wbits);
  rlm__free(g->piece), rlm__free(g->ev);
  rlm__free(g);
}

/* ---- requests ------------------------------------------------------------ */

static rlm_status pick_row(rlm_gen *g, const rlm_gen_request *r, int *row, rlm_error *err) {
  if (r->row >= g->R || r->row < -1)
    return rlm__err(err, RLM_ERR_INVALID, "rlm_gen_add: row %d is outside [0, %d)", r->row, g->R);
  if (r->row >= 0 && g->rows[r->row].st != ROW_FREE)
    return rlm__err(err, RLM_ERR_INVALID, "rlm_gen_add: row %d is busy", r->row);
  *row = r->row;
  for (int i = 0; *row < 0 && i < g->R; i++)
    if (g->rows[i].st == ROW_FREE) *row = i;
  if (*row < 0) return rlm__err(err, RLM_KV_FULL, "rlm_gen_add: all %d rows are busy", g->R);
  return RLM_OK;
}

static rlm_status check_request(rlm_gen *g, const rlm_gen_request *r, int row, int64_t limit,
                                rlm_error *err) {
  const char *fn = "rlm_gen_add";
  if (!r->prompt || r->n_prompt < 1 || r->n_prompt > (1 << 30))
    return rlm__err(err, RLM_ERR_INVALID, "%s: need a prompt of at least one id", fn);
  for (int64_t i = 0; i < r->n_prompt; i++)
    if (r->prompt[i] < 0 || r->prompt[i] >= g->V)
      return rlm__err(err, RLM_ERR_INVALID, "token id %d at index %lld is outside the vocabulary [0, %d)",
                      r->prompt[i], (long long)i, g->V);
  if (r->n_cached < 0 || r->n_cached >= r->n_prompt ||
      (r->n_cached && rlm_session_row_position(g->t, row) != r->n_cached))
    return rlm__err(err, RLM_ERR_INVALID, "%s: n_cached %lld: row %d holds %lld ids of a %lld-id prompt "
                    "(at most all but the last may be cached)", fn, (long long)r->n_cached, row,
                    (long long)rlm_session_row_position(g->t, row), (long long)r->n_prompt);
  for (int i = 0; i < r->n_stops; i++)
    if (!r->stops || !r->stops[i] || strlen(r->stops[i]) >= PIECE_MAX)
      return rlm__err(err, RLM_ERR_INVALID, "%s: stop string %d is missing or longer than %d bytes", fn, i,
                      PIECE_MAX - 1);
  if (r->logprobs < -1 || r->logprobs > RLM_GEN_LOGPROBS_MAX)
    return rlm__err(err, RLM_ERR_INVALID, "%s: logprobs %d is out of range [-1, %d]", fn, r->logprobs,
                    RLM_GEN_LOGPROBS_MAX);
  if (limit && r->n_prompt >= limit)
    return rlm__err(err, RLM_ERR_INVALID, "%s: the prompt reaches position %lld, no room in a context of %lld",
                    fn, (long long)r->n_prompt, (long long)limit);
  return RLM_OK;
}

/* The row's sampler(s), text stream and history. */
static rlm_status row_open(rlm_gen *g, gen_row *w, const rlm_gen_request *r, rlm_error *err) {
  rlm_status rc = rlm_sampler_create(&w->smp, &r->sampler, g->V, err);
  rlm_sampler_params dp = r->sampler;
  dp.seed = r->sampler.seed ^ 0x9e3779b97f4a7c15ull; /* the draft's own draws */
  if (!rc && g->d && r->speculate) rc = rlm_sampler_create(&w->dsmp, &dp, g->V, err);
  if (!rc && g->tok) rc = rlm_detok_stream_create(&w->ds, g->tok, true, err);
  if (!rc && g->tok) rc = rlm_stop_create(&w->stop, r->stops, r->n_stops, err);
  if (!rc && g->tok) rc = rlm__stop_reserve(w->stop, PIECE_MAX, err);
  const int64_t need = r->n_prompt + (r->max_tokens >= 0 ? r->max_tokens : HIST_SLACK) + MAX_DRAFT + 2;
  if (!rc && need > w->cap_hist) { /* the old history stays until then: the draft row holds it */
    int32_t *h = rlm__malloc((size_t)need * sizeof *h);
    if (!h) return rlm__err_nomem(err, "history", (size_t)need * sizeof *h);
    rlm__free(w->hist);
    w->hist = h;
    w->cap_hist = need;
  }
  return rc;
}

/* The draft row holds hist[0, dfed) of the row's last request (always:
 * every step rolls it back to what the history kept): the part of it a new
 * prompt starts with, all but the prompt's last id, need not be fed again
 * (a follow-up turn, a prompt cache hit, or the same prompt again). */
static int64_t draft_prefix(const gen_row *w, const rlm_gen_request *r) {
  int64_t k = 0;
  const int64_t n = RLM_MIN(w->dfed, r->n_prompt - 1);
  while (k < n && w->hist[k] == r->prompt[k]) k++;
  return k;
}

/* Brings the draft row back to keep ids, or empty when its rings cannot.
 * Keeping none clears the row: a draft session an earlier engine used
 * may still hold another sequence there. */
static void draft_reuse(rlm_gen *g, int row, int64_t keep) {
  gen_row *w = &g->rows[row];
  if (!keep || (w->dfed > keep && rlm_session_rollback(g->d, row, w->dfed - keep, NULL) != RLM_OK)) {
    rlm_session_row_clear(g->d, row, NULL);
    keep = 0;
  }
  w->dfed = keep;
}

rlm_status rlm_gen_add(rlm_gen *g, const rlm_gen_request *r, int *row, rlm_error *err) {
  if (!g || !r || !row) return rlm__err(err, RLM_ERR_INVALID, "rlm_gen_add: NULL argument");
  rlm_status rc = pick_row(g, r, row, err);
  if (rc) return rc;
  int64_t limit = r->max_context > 0 ? r->max_context : 0;
  if (g->t->p.n_ctx && (!limit || g->t->p.n_ctx < limit)) limit = g->t->p.n_ctx;
  if ((rc = check_request(g, r, *row, limit, err))) return rc;
  gen_row *w = &g->rows[*row];
  const int64_t keep = g->d ? draft_prefix(w, r) : 0; /* before row_open reuses hist */
  if ((rc = row_open(g, w, r, err))) {
    row_release(w);
    return rc;
  }
  if (!r->n_cached) rlm_session_row_clear(g->t, *row, NULL);
  if (g->d) draft_reuse(g, *row, keep);
  w->rq = *r;
  w->rq.prompt = NULL, w->rq.stops = NULL, w->rq.n_stops = 0;
  memcpy(w->hist, r->prompt, (size_t)r->n_prompt * sizeof *w->hist);
  for (int64_t i = 0; i < r->n_prompt; i++) rlm_sampler_accept(w->smp, r->prompt[i]);
  w->n_hist = r->n_prompt, w->fed = r->n_cached, w->limit = limit;
  w->k = g->p.draft_max;
  w->idle = 0;
  w->st = w->fed < w->n_hist - 1 ? ROW_PREFILL : ROW_DECODE;
  w->st_row = (rlm_gen_stats){.n_prompt = r->n_prompt - r->n_cached};
  g->tot.n_prompt += w->st_row.n_prompt;
  return RLM_OK;
}

void rlm_gen_cancel(rlm_gen *g, int row) {
  if (g && row >= 0 && row < g->R) row_release(&g->rows[row]);
}

int rlm_gen_active(const rlm_gen *g) {
  int n = 0;
  for (int r = 0; g && r < g->R; r++) n += g->rows[r].st != ROW_FREE;
  return n;
}

void rlm_gen_get_stats(const rlm_gen *g, int row, rlm_gen_stats *out) {
  if (!out) return;
  *out = (rlm_gen_stats){0};
  if (g && row < 0) *out = g->tot;
  else if (g && row < g->R) *out = g->rows[row].st_row;
}

/* ---- proposals ------------------------------------------------------------ */

/* Proposals worth making, of the `want` the schedule allows: no more than
 * the output has left (all kept, they end the request) and the context
 * has room to feed. */
static int proposal_room(const rlm_gen *g, const gen_row *w, int want) {
  if (!g->K || !w->rq.speculate) return 0;
  int64_t k = want;
  if (w->rq.max_tokens >= 0) k = RLM_MIN(k, w->rq.max_tokens - w->st_row.n_gen);
  if (w->limit) k = RLM_MIN(k, w->limit - w->n_hist);
  return (int)RLM_MAX(k, 0);
}

static void propose_lookup(rlm_gen *g) {
  for (int r = 0; r < g->R; r++) {
    gen_row *w = &g->rows[r];
    w->n_draft = 0;
    int k = w->st == ROW_DECODE ? proposal_room(g, w, rlm__spec_probe(w->k, &w->idle)) : 0;
    if (k) w->n_draft = rlm__ngram_propose(w->hist, w->n_hist, g->p.lookup_n, k, w->draft);
  }
}

/* The draft's proposal j for row w from its logits: argmax (greedy, with
 * the penalty over its history), or a draw from q_j kept for verification. */
static int32_t draft_pick(rlm_gen *g, int r, int j, float *logits) {
  gen_row *w = &g->rows[r];
  if (w->rq.sampler.temp == 0.0f) return rlm_sampler_sample(w->dsmp, logits);
  float *q = g->q + ((size_t)r * (size_t)g->K + (size_t)j) * (size_t)g->V;
  rlm__sampler_probs(w->dsmp, logits, q, g->ids_s, g->w);
  return rlm__dist_draw(q, g->V, rlm__sampler_uniform(w->dsmp));
}

/* Feeds the drafting rows' draft rows what they lack but the pending id
 * (the whole prompt the first time), in passes that fit the buffers. */
static rlm_status draft_catch_up(rlm_gen *g, const int *k_row, rlm_error *err) {
  for (;;) {
    int n = 0;
    for (int r = 0; r < g->R && n < g->cap; r++) {
      gen_row *w = &g->rows[r];
      int64_t take = k_row[r] ? RLM_MIN((int64_t)(g->cap - n), w->n_hist - 1 - w->dfed) : 0;
      for (int64_t i = 0; i < take; i++) g->ids[n] = w->hist[w->dfed + i], g->brow[n] = r, g->want[n++] = false;
    }
    if (!n) return RLM_OK;
    rlm_status rc = rlm_session_decode(g->d, &(rlm_batch){n, g->ids, g->brow, g->want}, NULL, err);
    if (rc) return rc;
    for (int i = 0; i < n; i++) g->rows[g->brow[i]].dfed++;
  }
}

/* One draft pass: pass 0 feeds each drafting row's pending id, pass j > 0
 * its d_j; each wants the logits that propose the next. */
static rlm_status draft_pass(rlm_gen *g, int j, int *k_row, rlm_error *err) {
  int n = 0, n_rows = 0, which[4096];
  for (int r = 0; r < g->R; r++) {
    gen_row *w = &g->rows[r];
    if (k_row[r] <= j) continue;
    g->ids[n] = j == 0 ? w->hist[w->n_hist - 1] : w->draft[j - 1], g->brow[n++] = r;
    which[n_rows++] = r;
  }
  if (!n) return RLM_OK;
  rlm_status rc = rlm_session_decode(g->d, &(rlm_batch){n, g->ids, g->brow, NULL}, g->dlg, err);
  if (rc) return rc;
  for (int i = 0; i < n_rows; i++) {
    gen_row *w = &g->rows[which[i]];
    w->dfed++;
    if (j == 0) rlm__sampler_copy_history(w->dsmp, w->smp); /* the history so far */
    else rlm_sampler_accept(w->dsmp, w->draft[j - 1]);
    w->draft[j] = draft_pick(g, which[i], j, g->dlg + (size_t)i * (size_t)g->V);
    w->n_draft = j + 1;
  }
  return RLM_OK;
}

static rlm_status propose_draft(rlm_gen *g, rlm_error *err) {
  int k_row[4096], kmax = 0;
  for (int r = 0; r < g->R; r++) {
    gen_row *w = &g->rows[r];
    w->n_draft = 0;
    k_row[r] = w->st == ROW_DECODE && w->dsmp ? proposal_room(g, w, rlm__spec_probe(w->k, &w->idle)) : 0;
    kmax = RLM_MAX(kmax, k_row[r]);
  }
  rlm_status rc = kmax ? draft_catch_up(g, k_row, err) : RLM_OK;
  if (rc) return rc;
  for (int j = 0; j < kmax; j++) {
    rc = draft_pass(g, j, k_row, err);
    if (rc) return rc;
  }
  return RLM_OK;
}

/* ---- the target pass -------------------------------------------------- */

/* A row with nothing left to generate (max_tokens 0): it ends with a
 * length event and feeds nothing. */
static bool spent(const gen_row *w) {
  return w->st == ROW_DECODE && w->rq.max_tokens >= 0 && w->st_row.n_gen >= w->rq.max_tokens;
}


/* Decode rows' [pending, proposals] with every logit wanted, then prefill
 * ids in what is left of prefill_chunk, but never less than a quarter of
 * it: decode goes first, yet a waiting prompt is not starved by rows that
 * verify long proposals. */
static int build_pass(rlm_gen *g) {
  int n = 0, n_lg = 0;
  for (int r = 0; r < g->R; r++) {
    gen_row *w = &g->rows[r];
    if (w->st != ROW_DECODE || spent(w)) continue;
    w->lg0 = n_lg;
    g->ids[n] = w->hist[w->n_hist - 1], g->brow[n] = r, g->want[n++] = true;
    for (int j = 0; j < w->n_draft; j++) g->ids[n] = w->draft[j], g->brow[n] = r, g->want[n++] = true;
    n_lg += w->n_draft + 1;
  }
  const int chunk = g->t->p.prefill_chunk;
  int budget = RLM_MAX(chunk - n, RLM_MAX(1, chunk / 4));
  for (int r = 0; r < g->R; r++)
    if (g->rows[r].st == ROW_PREFILL) g->rows[r].lg0 = 0;
  for (int r = 0; r < g->R && budget > 0; r++) {
    gen_row *w = &g->rows[r];
    if (w->st != ROW_PREFILL) continue;
    int64_t take = RLM_MIN((int64_t)budget, w->n_hist - 1 - w->fed);
    for (int64_t i = 0; i < take; i++) g->ids[n] = w->hist[w->fed + i], g->brow[n] = r, g->want[n++] = false;
    w->lg0 = -(int)take; /* ids fed this pass, no logits */
    budget -= (int)take;
  }
  return n;
}

/* ---- verification and output ------------------------------------------ */

/* The text id completes, through the stop strings, into the row's text. */
static rlm_status add_text(rlm_gen *g, gen_row *w, int32_t id, bool *stopped, rlm_error *err) {
  size_t len, el;
  const char *e;
  rlm_status rc = rlm_detok_stream_push(w->ds, id, g->piece, PIECE_MAX, &len, err);
  if (!rc) rc = rlm_stop_push(w->stop, g->piece, len, &e, &el, stopped, err);
  if (rc) return rc;
  memcpy(w->text + w->text_len, e, el);
  w->text_len += el;
  return RLM_OK;
}

static void end_text(gen_row *w) {
  const char *e;
  size_t el;
  rlm_stop_flush(w->stop, &e, &el);
  memcpy(w->text + w->text_len, e, el);
  w->text_len += el;
}

/* Appends one emitted id to the history and the step's output; sets the
 * row's finish when it ends the request. */
static rlm_status emit(rlm_gen *g, gen_row *w, int32_t id, rlm_error *err) {
  if (w->n_hist == w->cap_hist) /* reserve_history made room for the step */
    return rlm__err(err, RLM_ERR_INTERNAL, "rlm_gen_step: the history of row %d is full",
                    (int)(w - g->rows));
  w->hist[w->n_hist++] = id;
  if (!w->rq.ignore_eos && rlm_model_is_eos(g->t->m, id)) {
    w->fin = RLM_FINISH_STOP;
    return RLM_OK;
  }
  w->out[w->n_out++] = id;
  w->st_row.n_gen++, g->tot.n_gen++;
  bool stopped = false;
  rlm_status rc = w->ds ? add_text(g, w, id, &stopped, err) : RLM_OK;
  if (rc) return rc;
  if (stopped) w->fin = RLM_FINISH_STOP, w->by_string = true;
  else if (w->rq.max_tokens >= 0 && w->st_row.n_gen >= w->rq.max_tokens) w->fin = RLM_FINISH_LENGTH;
  else if (w->limit && w->n_hist >= w->limit) w->fin = RLM_FINISH_LENGTH;
  return RLM_OK;
}

/* Position j of the row's verification, from the target's logits L there
 * (the penalties edit them): the token it emits; *kept when it is
 * proposal j. */
static int32_t judge(rlm_gen *g, int r, int j, float *L, bool *kept) {
  gen_row *w = &g->rows[r];
  const bool proposal = j < w->n_draft;
  *kept = false;
  if (w->rq.sampler.temp == 0.0f) {
    int32_t t = rlm_sampler_sample(w->smp, L);
    *kept = proposal && t == w->draft[j];
    return t;
  }
  rlm__sampler_probs(w->smp, L, g->pv, g->ids_s, g->w);
  if (!proposal) return rlm__dist_draw(g->pv, g->V, rlm__sampler_uniform(w->smp));
  const float *q = w->dsmp ? g->q + ((size_t)r * (size_t)g->K + (size_t)j) * (size_t)g->V : NULL;
  int32_t next = -1;
  *kept = rlm__spec_accept_one(w->smp, g->pv, q, w->draft[j], g->resid, &next);
  return *kept ? w->draft[j] : next;
}

static int n_top(const rlm_gen *g, const gen_row *w) { return RLM_MIN(w->rq.logprobs, g->V); }

/* log(sum(exp(L))) over the vocabulary, by the sampler's exact vector
 * weights at temperature 1. */
static double log_sum_exp(rlm_gen *g, const float *L) {
  const float mx = L[rlm__sampler_argmax(L, g->V)];
  return mx + log(rlm__sampler_weigh(L, g->V, 1.0f, mx, g->wbits));
}

/* The ids of the n largest of L[V] into top[n], largest first, ties in id
 * order (as the argmax), without sorting L: an insertion into the sorted
 * n that most ids skip with one comparison. A NaN logit makes every
 * logprob NaN (the log-sum-exp is), and where it lands is left open. */
static void top_n(const float *L, int32_t V, int n, int32_t *top) {
  int m = 0;
  for (int32_t i = 0; i < V && n > 0; i++) {
    if (m == n && !(L[i] > L[top[n - 1]])) continue;
    int j = m < n ? m++ : n - 1;
    for (; j > 0 && L[i] > L[top[j - 1]]; j--) top[j] = top[j - 1];
    top[j] = i;
  }
}

/* The raw log-probabilities of id and of the most likely ids, from the
 * target's logits L, into the row's next output slot. */
static void note_logprobs(rlm_gen *g, gen_row *w, const float *L, int32_t id) {
  const int n = n_top(g, w);
  const double lse = log_sum_exp(g, L);
  int32_t *top = w->top_ids + (size_t)w->n_out * (size_t)n;
  float *top_lp = w->top_lp + (size_t)w->n_out * (size_t)n;
  top_n(L, g->V, n, top);
  for (int i = 0; i < n; i++) top_lp[i] = (float)(L[top[i]] - lse);
  w->lp[w->n_out] = (float)(L[id] - lse);
}

/* judge, plus the emitted id's logprobs when the request wants them: then
 * judge samples from a copy, so the logits stay raw. */
static int32_t judge_noting(rlm_gen *g, int r, int j, bool *kept) {
  gen_row *w = &g->rows[r];
  float *L = g->lg + (size_t)(w->lg0 + j) * (size_t)g->V;
  if (w->rq.logprobs < 0) return judge(g, r, j, L, kept);
  memcpy(g->raw, L, (size_t)g->V * sizeof *g->raw);
  const int32_t id = judge(g, r, j, g->raw, kept);
  note_logprobs(g, w, L, id);
  return id;
}

/* Adaptive proposal length (rlm__spec_next_k): to what was kept and down
 * to 0, where the row probes (rlm__spec_probe). */
static void adapt(rlm_gen *g, gen_row *w, int kept) {
  if (!g->p.adaptive || !w->n_draft) return;
  w->k = rlm__spec_next_k(w->k, kept, w->n_draft, g->p.draft_max);
}

/* Verifies a decode row, emits, and rolls both rows back to the history. */
static rlm_status verify_row(rlm_gen *g, int r, rlm_error *err) {
  gen_row *w = &g->rows[r];
  const int64_t old_hist = w->n_hist;
  int kept = 0, m = 0;
  rlm_status rc = RLM_OK;
  for (int j = 0; j <= w->n_draft && !rc && !w->fin; j++) {
    bool ok;
    int32_t id = judge_noting(g, r, j, &ok);
    rc = emit(g, w, id, err);
    m++;
    if (!ok) break;
    kept++;
    rlm_sampler_accept(w->smp, id);
  }
  if (rc) return rc;
  if (m > kept) rlm_sampler_accept(w->smp, w->hist[w->n_hist - 1]);
  w->st_row.drafted += w->n_draft, w->st_row.accepted += kept;
  g->tot.drafted += w->n_draft, g->tot.accepted += kept;
  adapt(g, w, kept);
  /* target: fed pending + n_draft proposals; holds all but the new last */
  rc = rlm_session_rollback(g->t, r, (int64_t)(w->n_draft + 1 - m), err);
  w->fed = w->n_hist - 1;
  if (!rc && w->dsmp) { /* draft: fed pending + n_draft - 1 proposals */
    const int64_t valid = old_hist + RLM_MIN(RLM_MIN(kept, m), w->n_draft - 1);
    if (w->dfed > valid) rc = rlm_session_rollback(g->d, r, w->dfed - valid, err);
    w->dfed = RLM_MIN(w->dfed, valid);
  }
  return rc;
}

/* Row r's event for this step: its output (with logprobs if asked). */
static rlm_gen_event row_event(const rlm_gen *g, const gen_row *w, int r, rlm_finish fin) {
  rlm_gen_event e = {.row = r, .ids = w->out, .n_ids = w->n_out, .text = w->ds ? w->text : NULL,
                     .text_len = w->text_len, .finish = fin};
  if (w->rq.logprobs < 0) return e;
  e.logprob = w->lp, e.top_ids = w->top_ids, e.top_logprobs = w->top_lp, e.n_top = n_top(g, w);
  return e;
}

static rlm_status after_pass(rlm_gen *g, int *n_events, rlm_error *err) {
  int n_ev = 0;
  for (int r = 0; r < g->R; r++) {
    gen_row *w = &g->rows[r];
    w->n_out = 0, w->text_len = 0, w->fin = RLM_FINISH_NONE, w->by_string = false;
    if (spent(w)) {
      if (w->ds) end_text(w);
      g->ev[n_ev++] = row_event(g, w, r, RLM_FINISH_LENGTH);
      row_release(w);
      continue;
    }
    if (w->st == ROW_PREFILL) {
      w->fed -= w->lg0; /* lg0 = -ids fed this pass */
      if (w->fed == w->n_hist - 1) w->st = ROW_DECODE;
      continue;
    }
    if (w->st != ROW_DECODE) continue;
    rlm_status rc = verify_row(g, r, err);
    if (rc) return rc;
    if (w->fin && w->ds && !w->by_string) end_text(w); /* the held-back tail */
    g->ev[n_ev++] = row_event(g, w, r, w->fin);
    if (w->fin) row_release(w);
  }
  *n_events = n_ev;
  return RLM_OK;
}

/* A step that failed after draft passes: each draft row forgets the
 * pending id and proposals they fed, back to what draft_catch_up leaves,
 * so the step can run again (its pass 0 feeds the pending id). */
static void draft_unwind(rlm_gen *g) {
  for (int r = 0; r < g->R; r++) {
    gen_row *w = &g->rows[r];
    if (w->st != ROW_FREE && w->dfed > w->n_hist - 1) draft_reuse(g, r, w->n_hist - 1);
  }
}

/* Room in every busy row's history for what one step can emit (a request
 * without max_tokens outgrows HIST_SLACK), made before the step changes
 * anything: once the target pass has run, the step cannot fail. */
static rlm_status reserve_history(rlm_gen *g, rlm_error *err) {
  for (int r = 0; r < g->R; r++) {
    gen_row *w = &g->rows[r];
    if (w->st == ROW_FREE || w->n_hist + MAX_DRAFT + 2 <= w->cap_hist) continue;
    const int64_t cap = 2 * w->cap_hist;
    int32_t *h = rlm__realloc(w->hist, (size_t)cap * sizeof *h);
    if (!h) return rlm__err_nomem(err, "history", (size_t)cap * sizeof *h);
    w->hist = h, w->cap_hist = cap;
  }
  return RLM_OK;
}

rlm_status rlm_gen_step(rlm_gen *g, const rlm_gen_event **events, int *n_events, rlm_error *err) {
  if (!g || !events || !n_events) return rlm__err(err, RLM_ERR_INVALID, "rlm_gen_step: NULL argument");
  *events = g->ev, *n_events = 0;
  rlm_status rc = reserve_history(g, err);
  if (rc) return rc;
  if (g->d) rc = propose_draft(g, err);
  else if (g->p.lookup_n) propose_lookup(g);
  const int n = rc ? 0 : build_pass(g);
  if (n && !rc) rc = rlm_session_decode(g->t, &(rlm_batch){n, g->ids, g->brow, g->want}, g->lg, err);
  if (rc) {
    if (g->d) draft_unwind(g);
    return rc;
  }
  g->tot.steps += n > 0;
  for (int r = 0; r < g->R; r++) g->rows[r].st_row.steps += g->rows[r].st != ROW_FREE;
  return after_pass(g, n_events, err);
}
