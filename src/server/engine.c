/* engine.c -- the server's engine thread: the bounded queue, admission of
 * queued jobs into free rows under the memory budget, reuse of what a free
 * row's KV still holds (the prompt cache: the free row sharing the longest
 * prefix with the new prompt keeps that prefix, rolled back to it), the
 * step loop over rlm_gen, and cancellation of jobs whose client hung up,
 * found by polling the sockets before every step.
 *
 * The engine thread is the only one that touches the session and the
 * engine (rlm_gen's contract); everything shared with the connections is
 * under ctx->mu, which is released around rlm_gen_step. */
#include "srv.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void srv_count_status(srv_ctx *ctx, int status) {
  pthread_mutex_lock(&ctx->mu);
  int i = 0;
  while (i < SRV_N_STATUS && ctx->status_code[i] && ctx->status_code[i] != status) i++;
  if (i < SRV_N_STATUS) ctx->status_code[i] = status, ctx->status_count[i]++;
  pthread_mutex_unlock(&ctx->mu);
}

/* ---- calls and jobs ------------------------------------------------------ */

static void job_free_buffers(srv_job *j) {
  free(j->marks);
  free(j->text);
  free(j->ids);
  free(j->lp);
  free(j->top_ids);
  free(j->top_lp);
}

static void call_unref(srv_call *c) {
  if (--c->refs) return;
  for (int i = 0; i < c->req.n; i++) job_free_buffers(&c->jobs[i]);
  srv_req_free(&c->req);
  pthread_cond_destroy(&c->cv);
  free(c);
}

/* The job is over: wake its waiter and drop the engine's reference. */
static void job_done(srv_ctx *ctx, srv_job *j) {
  j->done = true;
  pthread_cond_broadcast(&j->call->cv);
  call_unref(j->call);
}

/* KV bytes a job may come to hold: its prompt and output, within the
 * context (rings cost their fixed size). */
static int64_t job_reserve(const srv_ctx *ctx, const srv_req *r) {
  int64_t n = r->max_tokens < 0 ? ctx->cfg.n_ctx : r->n_prompt + r->max_tokens;
  if (ctx->cfg.n_ctx > 0 && n > ctx->cfg.n_ctx) n = ctx->cfg.n_ctx;
  return (int64_t)(ctx->cfg.kv_grow_per_token * (double)n + ctx->cfg.kv_ring_bytes);
}

/* What a row's KV counts against the budget: what it holds, or for a
 * running job what it may come to hold. */
static int64_t row_cost(const srv_ctx *ctx, int r) {
  const srv_job *j = ctx->active[r];
  const int64_t held = ctx->rows[r].bytes;
  return j && j->reserve > held ? j->reserve : held;
}

/* Bytes counted: weights, the prompt cache, every row but `except`. */
static int64_t used_except(const srv_ctx *ctx, int except) {
  int64_t n = ctx->cfg.weights_bytes + ctx->pcache.bytes;
  for (int r = 0; r < ctx->n_rows; r++)
    if (r != except) n += row_cost(ctx, r);
  return n;
}

/* A free row other than `keep` that holds storage, least recently used
 * first; -1 when none. */
static int idle_with_storage(const srv_ctx *ctx, int keep) {
  int best = -1;
  for (int r = 0; r < ctx->n_rows; r++)
    if (r != keep && !ctx->rows[r].busy && ctx->rows[r].bytes > ctx->fresh_row_bytes &&
        (best < 0 || ctx->rows[r].used < ctx->rows[best].used))
      best = r;
  return best;
}

/* Whether a job booking `need` bytes fits on `row` (whose storage it
 * reuses) within the budget. Snapshots of the prompt cache give way
 * first, then the storage of other free rows. */
static bool budget_fits(srv_ctx *ctx, int row, int64_t need) {
  if (!ctx->cfg.memory_budget) return true;
  for (;;) {
    const int64_t held = ctx->rows[row].bytes;
    if (used_except(ctx, row) + (need > held ? need : held) <= ctx->cfg.memory_budget) return true;
    if (srv_pcache_evict_one(&ctx->pcache)) continue;
    const int r = idle_with_storage(ctx, row);
    if (r < 0) return false;
    rlm_session_row_release(ctx->h.session, r, NULL);
    ctx->rows[r].n_hist = 0;
    ctx->rows[r].bytes = (int64_t)rlm_session_row_kv_bytes(ctx->h.session, r);
  }
}

static void set_503(srv_err *e, const char *code, const char *msg, int retry) {
  *e = (srv_err){.status = 503, .type = "server_error", .code = code, .retry_after = retry};
  snprintf(e->msg, sizeof e->msg, "%s", msg);
}

srv_call *srv_submit(srv_ctx *ctx, srv_req *req, int fd, srv_err *e) {
  srv_call *c = calloc(1, sizeof *c);
  if (!c) {
    set_503(e, "out_of_memory", "out of memory", 1);
    return NULL;
  }
  c->req = *req;
  memset(req, 0, sizeof *req);
  c->fd = fd;
  pthread_cond_init(&c->cv, NULL);
  const int64_t each = job_reserve(ctx, &c->req);
  pthread_mutex_lock(&ctx->mu);
  const char *why = NULL;
  if (ctx->draining) why = "the server is shutting down";
  else if (ctx->cfg.memory_budget && ctx->cfg.weights_bytes + each * c->req.n > ctx->cfg.memory_budget)
    why = "the request's KV cache (prompt + max_tokens) does not fit in --memory-budget";
  else if (ctx->n_queued + c->req.n > ctx->cfg.queue_max) why = "the request queue is full";
  if (why) {
    pthread_mutex_unlock(&ctx->mu);
    set_503(e, ctx->draining ? "shutting_down" : "overloaded", why, ctx->draining ? 5 : 1);
    c->refs = 1;
    call_unref(c);
    return NULL;
  }
  c->refs = 1 + c->req.n;
  for (int i = 0; i < c->req.n; i++) {
    srv_job *j = &c->jobs[i];
    *j = (srv_job){.call = c, .index = i, .row = -1, .reserve = each};
    *ctx->queue_tail = j;
    ctx->queue_tail = &j->next;
    ctx->n_queued++;
  }
  pthread_cond_signal(&ctx->wake);
  pthread_mutex_unlock(&ctx->mu);
  return c;
}

void srv_call_release(srv_ctx *ctx, srv_call *c) {
  pthread_mutex_lock(&ctx->mu);
  c->abandoned = true; /* the engine cancels what still runs */
  pthread_cond_signal(&ctx->wake);
  call_unref(c);
  pthread_mutex_unlock(&ctx->mu);
}

int srv_busy(srv_ctx *ctx) {
  pthread_mutex_lock(&ctx->mu);
  int n = ctx->n_queued + ctx->n_active;
  pthread_mutex_unlock(&ctx->mu);
  return n;
}

/* ---- admission and the prompt cache -------------------------------------- */

static int64_t common_prefix(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
  int64_t n = na < nb ? na : nb, i = 0;
  while (i < n && a[i] == b[i]) i++;
  return i;
}

/* The free row for a prompt: the one whose KV shares the longest prefix
 * with it, else the least recently used; *keep is the prefix to keep. */
static int pick_row(const srv_ctx *ctx, const srv_req *r, int64_t *keep) {
  int best = -1;
  int64_t best_n = -1;
  *keep = 0;
  for (int i = 0; i < ctx->n_rows; i++) {
    const srv_row *w = &ctx->rows[i];
    if (w->busy) continue;
    int64_t n = ctx->cfg.prompt_cache_bytes ? common_prefix(w->hist, w->n_hist, r->prompt, r->n_prompt) : 0;
    if (n > r->n_prompt - 1) n = r->n_prompt - 1; /* one id must be fed for logits */
    if (n > best_n || (n == best_n && w->used < ctx->rows[best].used)) best = i, best_n = n;
  }
  if (best >= 0) *keep = best_n;
  return best;
}

/* Rolls row back to its first keep ids; 0 when the rings cannot (the
 * engine then clears it). */
static int64_t keep_prefix(srv_ctx *ctx, int row, int64_t keep) {
  const int64_t pos = rlm_session_row_position(ctx->h.session, row);
  if (keep <= 0 || pos < keep) return 0;
  if (pos > keep && rlm_session_rollback(ctx->h.session, row, pos - keep, NULL)) return 0;
  return keep;
}

/* The prompt ids the row will hold before it is fed: what its own KV
 * shares with the prompt (keep_row), or a longer prefix restored from a
 * snapshot; 0 when neither applies (the engine clears the row). */
static int64_t reuse(srv_ctx *ctx, int row, const srv_req *r, int64_t keep_row) {
  int64_t keep_snap = 0;
  const srv_snap *sn = srv_pcache_best(&ctx->pcache, r->prompt, r->n_prompt, &keep_snap);
  if (!sn || keep_snap <= keep_row) return keep_prefix(ctx, row, keep_row);
  ctx->rows[row].n_hist = 0;
  if (rlm_session_row_restore(ctx->h.session, row, sn->img, sn->len, NULL)) return 0;
  return keep_prefix(ctx, row, keep_snap);
}

static void fail_job(srv_ctx *ctx, srv_job *j, const char *msg) {
  snprintf(j->fail, sizeof j->fail, "%s", msg);
  job_done(ctx, j);
}

/* Choice 0's row once it holds the prompt (all but its last id, as the
 * engine leaves it after prefill), for the other choices to copy; -1
 * while it prefills. A first choice that is over is no source. */
static int sibling_row(const srv_ctx *ctx, const srv_job *j) {
  const srv_job *first = &j->call->jobs[0];
  if (j->index == 0 || first->done || first->row < 0) return -1;
  const int64_t pos = rlm_session_row_position(ctx->h.session, first->row);
  return pos >= j->call->req.n_prompt - 1 ? first->row : -1;
}

/* Whether job j must wait: choices past the first wait for its prefill,
 * so that n choices compute the prompt once. */
static bool waits(const srv_ctx *ctx, const srv_job *j) {
  const srv_job *first = &j->call->jobs[0];
  return j->index > 0 && !first->done && sibling_row(ctx, j) < 0 && !j->call->abandoned;
}

/* The free row for job j with the prompt copied from its first choice's
 * row (rolled back to the prompt); 0 kept when that fails. */
static int64_t copy_prompt(srv_ctx *ctx, const srv_job *j, int src, int row) {
  void *img = NULL;
  size_t len = 0;
  const int64_t keep = j->call->req.n_prompt - 1;
  ctx->rows[row].n_hist = 0;
  if (rlm_session_row_save(ctx->h.session, src, NULL, 0, &img, &len, NULL)) return 0;
  rlm_status rc = rlm_session_row_restore(ctx->h.session, row, img, len, NULL);
  rlm_free(img);
  return rc ? 0 : keep_prefix(ctx, row, keep);
}

/* Starts one job on a free row; false when the engine refused it (the job
 * is then failed). Called with ctx->mu held, on the engine thread. */
static void admit(srv_ctx *ctx, srv_job *j, int row, int64_t keep_row) {
  const srv_req *r = &j->call->req;
  const int src = sibling_row(ctx, j);
  const int64_t keep = src >= 0 ? copy_prompt(ctx, j, src, row) : reuse(ctx, row, r, keep_row);
  rlm_gen_request q = rlm_gen_request_default();
  q.prompt = r->prompt, q.n_prompt = r->n_prompt, q.row = row, q.n_cached = keep;
  q.sampler = r->smp, q.max_tokens = r->max_tokens, q.max_context = ctx->cfg.n_ctx;
  q.ignore_eos = r->ignore_eos, q.stops = (const char *const *)r->stops, q.n_stops = r->n_stops;
  q.speculate = ctx->cfg.speculate, q.logprobs = r->logprobs;
  if (j->index > 0) q.sampler.seed += (uint64_t)j->index; /* n choices differ */
  rlm_error err = {0};
  int got;
  if (rlm_gen_add(ctx->h.gen, &q, &got, &err)) {
    fail_job(ctx, j, err.msg[0] ? err.msg : "the engine refused the request");
    return;
  }
  j->row = got, j->n_cached = keep, j->n_top = r->logprobs > 0 ? r->logprobs : 0;
  if (j->n_top > rlm_model_vocab_size(ctx->h.model)) j->n_top = rlm_model_vocab_size(ctx->h.model);
  ctx->rows[got].busy = true;
  ctx->rows[got].n_hist = 0;
  ctx->active[got] = j;
  ctx->n_active++;
  ctx->rows[got].bytes = (int64_t)rlm_session_row_kv_bytes(ctx->h.session, got);
  ctx->n_prompt_tokens += r->n_prompt - keep;
  ctx->n_cache_hit += keep;
}

static void admit_queued(srv_ctx *ctx) {
  srv_job **link = &ctx->queue;
  while (*link && ctx->n_active < ctx->n_rows) {
    srv_job *j = *link;
    int64_t keep = 0;
    const int row = pick_row(ctx, &j->call->req, &keep);
    if (waits(ctx, j)) { /* later jobs may go ahead of it */
      link = &j->next;
      continue;
    }
    if (!j->call->abandoned && !budget_fits(ctx, row, j->reserve)) break; /* until rows finish */
    *link = j->next;
    if (ctx->queue_tail == &j->next) ctx->queue_tail = link;
    ctx->n_queued--;
    j->next = NULL;
    if (j->call->abandoned) job_done(ctx, j);
    else admit(ctx, j, row, keep);
  }
}

/* ---- the step loop -------------------------------------------------------- */

static bool grow(void **p, int64_t *cap, int64_t need, size_t elem) {
  if (need <= *cap) return true;
  int64_t n = *cap ? *cap : 64;
  while (n < need) n *= 2;
  void *q = realloc(*p, (size_t)n * elem);
  if (!q) return false;
  *p = q;
  *cap = n;
  return true;
}

static bool append_text(srv_job *j, const char *t, size_t n) {
  if (j->n_text + n + 1 > j->cap_text) {
    size_t c = j->cap_text ? j->cap_text : 256;
    while (c < j->n_text + n + 1) c *= 2;
    char *p = realloc(j->text, c);
    if (!p) return false;
    j->text = p, j->cap_text = c;
  }
  memcpy(j->text + j->n_text, t, n);
  j->n_text += n;
  j->text[j->n_text] = 0;
  return true;
}

/* Room for need ids (and their logprobs when the request wants them). */
static bool reserve_ids(srv_job *j, int64_t need, bool lp) {
  if (need <= j->cap_ids) return true;
  int64_t c = j->cap_ids, c1 = j->cap_ids, c2 = j->cap_ids, c3 = j->cap_ids;
  const size_t top = (size_t)(j->n_top > 0 ? j->n_top : 1);
  bool ok = grow((void **)&j->ids, &c, need, sizeof *j->ids);
  if (ok && lp)
    ok = grow((void **)&j->lp, &c1, need, sizeof *j->lp) &&
         grow((void **)&j->top_ids, &c2, need, top * sizeof *j->top_ids) &&
         grow((void **)&j->top_lp, &c3, need, top * sizeof *j->top_lp);
  if (ok) j->cap_ids = c;
  return ok;
}

static bool append_output(srv_job *j, const rlm_gen_event *e);

/* Where the output so far ends, as the end of one piece. */
static bool add_mark(srv_job *j) {
  const srv_mark *last = j->n_marks ? &j->marks[j->n_marks - 1] : NULL;
  if ((last && last->text == j->n_text && last->ids == j->n_ids) || (!j->n_text && !j->n_ids))
    return true;
  if (!grow((void **)&j->marks, &j->cap_marks, j->n_marks + 1, sizeof *j->marks)) return false;
  j->marks[j->n_marks++] = (srv_mark){j->n_text, j->n_ids};
  return true;
}

/* The ids, logprobs and text of one event, appended to its job as one
 * piece. */
static bool append_event(srv_job *j, const rlm_gen_event *e) {
  return append_output(j, e) && add_mark(j);
}

static bool append_output(srv_job *j, const rlm_gen_event *e) {
  const bool lp = e->logprob != NULL;
  if (!e->n_ids) return !e->text_len || append_text(j, e->text, e->text_len);
  if (!reserve_ids(j, j->n_ids + e->n_ids, lp)) return false;
  memcpy(j->ids + j->n_ids, e->ids, (size_t)e->n_ids * sizeof *e->ids);
  if (lp) {
    const size_t k = (size_t)j->n_top;
    memcpy(j->lp + j->n_ids, e->logprob, (size_t)e->n_ids * sizeof *e->logprob);
    memcpy(j->top_ids + (size_t)j->n_ids * k, e->top_ids, (size_t)e->n_ids * k * sizeof *e->top_ids);
    memcpy(j->top_lp + (size_t)j->n_ids * k, e->top_logprobs, (size_t)e->n_ids * k * sizeof *e->top_logprobs);
  }
  j->n_ids += e->n_ids;
  return !e->text_len || append_text(j, e->text, e->text_len);
}

/* What a finished row's KV holds: prompt + output, up to its position. */
static void remember_row(srv_ctx *ctx, srv_job *j) {
  srv_row *w = &ctx->rows[j->row];
  const srv_req *r = &j->call->req;
  const int64_t pos = rlm_session_row_position(ctx->h.session, j->row);
  w->busy = false;
  w->used = ++ctx->clock;
  w->n_hist = 0;
  if (!ctx->cfg.prompt_cache_bytes || pos <= 0 || pos > r->n_prompt + j->n_ids ||
      !grow((void **)&w->hist, &w->cap, pos, sizeof *w->hist))
    return;
  const int64_t from_prompt = pos < r->n_prompt ? pos : r->n_prompt;
  memcpy(w->hist, r->prompt, (size_t)from_prompt * sizeof *w->hist);
  if (pos > from_prompt) /* j->ids is NULL when none came */
    memcpy(w->hist + from_prompt, j->ids, (size_t)(pos - from_prompt) * sizeof *w->hist);
  w->n_hist = pos;
  if (!j->cancelled) srv_pcache_put(&ctx->pcache, ctx->h.session, j->row, w->hist, pos);
}

static void end_job(srv_ctx *ctx, srv_job *j) {
  ctx->active[j->row] = NULL;
  ctx->n_active--;
  remember_row(ctx, j);
  job_done(ctx, j);
}

static void deliver(srv_ctx *ctx, const rlm_gen_event *ev, int n_ev) {
  for (int i = 0; i < n_ev; i++) {
    srv_job *j = ctx->active[ev[i].row];
    if (!j) continue;
    ctx->n_gen_tokens += ev[i].n_ids;
    if (!append_event(j, &ev[i])) {
      rlm_gen_cancel(ctx->h.gen, j->row);
      snprintf(j->fail, sizeof j->fail, "out of memory");
      end_job(ctx, j);
      continue;
    }
    if (ev[i].finish != RLM_FINISH_NONE) {
      j->finish = ev[i].finish;
      end_job(ctx, j);
    } else {
      pthread_cond_broadcast(&j->call->cv);
    }
  }
}

/* Whether a client's socket was closed by the peer. */
static bool hung_up(int fd) {
  if (fd < 0) return false;
  struct pollfd p = {.fd = fd, .events = POLLRDHUP};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* Jobs whose connection gave up or whose client hung up end now. */
static void reap(srv_ctx *ctx) {
  for (int r = 0; r < ctx->n_rows; r++) {
    srv_job *j = ctx->active[r];
    if (!j || !(j->call->abandoned || hung_up(j->call->fd))) continue;
    rlm_gen_cancel(ctx->h.gen, r);
    j->cancelled = true;
    end_job(ctx, j);
  }
}

static void fail_active(srv_ctx *ctx, const char *msg) {
  for (int r = 0; r < ctx->n_rows; r++) {
    srv_job *j = ctx->active[r];
    if (!j) continue;
    rlm_gen_cancel(ctx->h.gen, r);
    snprintf(j->fail, sizeof j->fail, "%s", msg);
    end_job(ctx, j);
  }
}

/* One step with the lock released; the decode rate is smoothed over
 * steps so /metrics shows the recent aggregate. */
static void step(srv_ctx *ctx) {
  const rlm_gen_event *ev;
  int n_ev;
  rlm_error err = {0};
  pthread_mutex_unlock(&ctx->mu);
  const double t0 = now_s();
  rlm_status rc = rlm_gen_step(ctx->h.gen, &ev, &n_ev, &err);
  const double dt = now_s() - t0;
  const double kv = (double)rlm_session_kv_bytes(ctx->h.session);
  pthread_mutex_lock(&ctx->mu);
  ctx->kv_bytes = kv;
  for (int r = 0; r < ctx->n_rows; r++) /* the rows only this thread changes */
    ctx->rows[r].bytes = (int64_t)rlm_session_row_kv_bytes(ctx->h.session, r);
  if (rc) {
    fail_active(ctx, err.msg[0] ? err.msg : rlm_status_str(rc));
    return;
  }
  int64_t n = 0;
  for (int i = 0; i < n_ev; i++) n += ev[i].n_ids;
  if (n && dt > 0) ctx->tok_per_s = ctx->tok_per_s ? 0.9 * ctx->tok_per_s + 0.1 * (double)n / dt
                                                   : (double)n / dt;
  deliver(ctx, ev, n_ev);
}

static void *engine_main(void *arg) {
  srv_ctx *ctx = arg;
  pthread_mutex_lock(&ctx->mu);
  for (;;) {
    reap(ctx);
    admit_queued(ctx);
    if (ctx->n_active) {
      step(ctx);
      continue;
    }
    if (ctx->quit && !ctx->queue) break;
    pthread_cond_wait(&ctx->wake, &ctx->mu);
  }
  pthread_mutex_unlock(&ctx->mu);
  return NULL;
}

rlm_status srv_engine_start(srv_ctx *ctx, rlm_error *err) {
  ctx->n_rows = rlm_session_rows(ctx->h.session);
  ctx->active = calloc((size_t)ctx->n_rows, sizeof *ctx->active);
  ctx->rows = calloc((size_t)ctx->n_rows, sizeof *ctx->rows);
  ctx->queue_tail = &ctx->queue;
  if (!srv_pcache_init(&ctx->pcache, ctx->cfg.prompt_cache_bytes) || !ctx->active || !ctx->rows) {
    snprintf(err->msg, sizeof err->msg, "serve: out of memory");
    return err->code = RLM_ERR_NOMEM;
  }
  ctx->fresh_row_bytes = (int64_t)rlm_session_row_kv_bytes(ctx->h.session, 0);
  for (int r = 0; r < ctx->n_rows; r++)
    ctx->rows[r].bytes = (int64_t)rlm_session_row_kv_bytes(ctx->h.session, r);
  if (pthread_create(&ctx->thread, NULL, engine_main, ctx)) {
    snprintf(err->msg, sizeof err->msg, "serve: cannot start the engine thread");
    return err->code = RLM_ERR_INTERNAL;
  }
  ctx->thread_started = true;
  return RLM_OK;
}

void srv_engine_stop(srv_ctx *ctx) {
  if (ctx->thread_started) {
    pthread_mutex_lock(&ctx->mu);
    ctx->quit = true;
    pthread_cond_signal(&ctx->wake);
    pthread_mutex_unlock(&ctx->mu);
    pthread_join(ctx->thread, NULL);
  }
  for (int i = 0; ctx->rows && i < ctx->n_rows; i++) free(ctx->rows[i].hist);
  free(ctx->rows);
  free(ctx->active);
  srv_pcache_free(&ctx->pcache);
  ctx->rows = NULL, ctx->active = NULL;
}
