/* session.c -- sessions: rows (independent sequences, each with its own
 * caches and position), the ragged batch a forward pass consumes, row
 * clearing and per-row rollback, and the single-sequence rlm_session_eval.
 *
 * A batch is planned before anything changes: ids, rows and the rule that
 * a row's tokens are one consecutive run are checked, the n_ctx budget is
 * checked (RLM_KV_FULL), and every cache of every fed row grows to hold
 * what the batch appends. Only then do passes run, and a pass cannot fail
 * (forward.c reads and writes slots that exist). So a failed call leaves
 * every row as it was, and a batch that fits allocates nothing.
 *
 * Rows are separate 1-row caches rather than rows of one multi-row cache:
 * each grows to its own length (a 32-token row beside a 32k-token one
 * costs 32 slots, not 32k), joins and leaves without re-laying the others,
 * and feeds any number of tokens in a pass without padding. The rows of a
 * layer share one operation scratch (rlm__kv_create_sharing), since a
 * session's passes use them one at a time.
 *
 * Session params are checked against the model before anything is
 * allocated; a KV group size that does not divide a head names config.json
 * (where the head dims come from) and the group size that would.
 */
#include "model/backend.h"

enum { MAX_ROWS = 4096 };

rlm_session_params rlm_session_params_default(void) {
  return (rlm_session_params){.n_threads = 0, .prefill_chunk = 512, .kv_group_size = 64, .n_rows = 1,
                              .kv_dtype = RLM_DTYPE_COUNT};
}

/* ---- params ------------------------------------------------------------- */

/* The largest KV group size dividing the head dim of every layer with a
 * cache of its own, or 0 when none does. */
static int kv_group_fit(const rlm_model_config *c) {
  static const int groups[] = {128, 64, 32};
  for (size_t g = 0; g < sizeof groups / sizeof *groups; g++) {
    bool fits = true;
    for (int i = 0; i < c->n_layers; i++)
      fits = fits && (c->kv_donor[i] >= 0 || c->layer_head_dim[i] % groups[g] == 0);
    if (fits) return groups[g];
  }
  return 0;
}

/* Quantized KV: bits and group size the quantizer takes, and a group size
 * that divides every cached head (config.json's head dims, so the message
 * names that file and says which group size would do). */
static rlm_status check_kv_params(const rlm_model *m, const rlm_session_params *p,
                                  rlm_error *err) {
  const char *fn = "rlm_session_create";
  const int bits[2] = {p->k_bits, p->v_bits};
  for (int b = 0; b < 2; b++)
    if (bits[b] && !rlm__quant_bits_ok(bits[b]))
      return rlm__err(err, RLM_ERR_INVALID, "%s: %s %d is not supported (accepted: 0, 2, 3, 4, "
                      "5, 6, 8)", fn, b ? "v_bits" : "k_bits", bits[b]);
  if (!p->k_bits && !p->v_bits) return RLM_OK;
  if (!rlm__quant_group_ok(p->kv_group_size))
    return rlm__err(err, RLM_ERR_INVALID, "%s: kv_group_size %d is not supported (accepted: 32, "
                    "64, 128)", fn, p->kv_group_size);
  const rlm_model_config *c = &m->cfg;
  const int fit = kv_group_fit(c);
  char hint[96];
  if (fit) snprintf(hint, sizeof hint, "use kv_group_size %d", fit);
  else snprintf(hint, sizeof hint, "quantized KV needs head dims that are multiples of 32");
  for (int i = 0; i < c->n_layers; i++) {
    const int hd = c->layer_head_dim[i];
    if (c->kv_donor[i] >= 0 || hd % p->kv_group_size == 0) continue;
    char layer[32] = "";
    if (hd != c->head_dim) snprintf(layer, sizeof layer, " (layer %d)", i);
    return rlm__err(err, RLM_ERR_INVALID, "%s: head_dim %d%s is not a multiple of kv_group_size "
                    "%d (%s)", m->config_path, hd, layer, p->kv_group_size, hint);
  }
  return RLM_OK;
}

/* Session params against the model, before anything is allocated. */
static rlm_status check_params(const rlm_model *m, const rlm_session_params *p, rlm_error *err) {
  const char *fn = "rlm_session_create";
  if (p->prefill_chunk < 1 || p->prefill_chunk > 65536)
    return rlm__err(err, RLM_ERR_INVALID, "%s: prefill_chunk %d is out of range [1, 65536]", fn,
                    p->prefill_chunk);
  if (p->max_kv < 0 || p->max_kv > (1 << 30))
    return rlm__err(err, RLM_ERR_INVALID, "%s: max_kv %lld is out of range [0, %d]", fn,
                    (long long)p->max_kv, 1 << 30);
  if (p->act_bits != 0 && p->act_bits != 8)
    return rlm__err(err, RLM_ERR_INVALID, "%s: act_bits %d: act_bits accepts only 0 or 8", fn,
                    p->act_bits);
  if (p->kv_sinks < 0 || (p->kv_sinks && p->kv_sinks >= p->max_kv))
    return rlm__err(err, RLM_ERR_INVALID, "%s: kv_sinks %d needs max_kv above it (max_kv %lld)", fn,
                    p->kv_sinks, (long long)p->max_kv);
  if (p->n_rows < 1 || p->n_rows > MAX_ROWS)
    return rlm__err(err, RLM_ERR_INVALID, "%s: n_rows %d is out of range [1, %d]", fn, p->n_rows,
                    MAX_ROWS);
  if (p->n_ctx < 0 || p->n_ctx > (1 << 30))
    return rlm__err(err, RLM_ERR_INVALID, "%s: n_ctx %lld is out of range [0, %d]", fn,
                    (long long)p->n_ctx, 1 << 30);
  if (p->kv_dtype != RLM_DTYPE_COUNT && p->kv_dtype != RLM_DTYPE_F32 && p->kv_dtype != RLM_DTYPE_F16 &&
      p->kv_dtype != RLM_DTYPE_BF16)
    return rlm__err(err, RLM_ERR_INVALID, "%s: kv_dtype %d: F32, F16, BF16 or RLM_DTYPE_COUNT (the model's)",
                    fn, (int)p->kv_dtype);
  return check_kv_params(m, p, err);
}

/* ---- create / free -------------------------------------------------------- */

/* Layer i's cache of row r (KV-shared layers have none); rows after the
 * first borrow row 0's scratch and pool. */
static rlm_status make_cache(rlm_session *s, int r, int i, rlm_error *err) {
  if (s->m->cfg.kv_donor[i] >= 0) return RLM_OK; /* attends its donor's cache */
  rlm_kv_config k;
  rlm__layer_kv_config(&s->m->cfg, &s->p, i, &k);
  if (r > 0) return rlm__kv_create_sharing(&s->rows[r].kv[i], &k, s->rows[0].kv[i], err);
  rlm_status rc = rlm_kv_create(&s->rows[0].kv[i], &k, err);
  return rc ? rc : rlm__kv_use_pool(s->rows[0].kv[i], s->pool, err);
}

/* Rows and, on the CPU, their caches (a device backend holds its own). */
static rlm_status make_rows(rlm_session *s, rlm_error *err) {
  const int L = s->m->cfg.n_layers;
  s->rows = rlm__calloc((size_t)s->p.n_rows, sizeof *s->rows);
  if (!s->rows) return rlm__err_nomem(err, "session rows", 0);
  for (int r = 0; r < s->p.n_rows; r++) {
    if (!(s->rows[r].kv = rlm__calloc((size_t)L, sizeof *s->rows[r].kv)))
      return rlm__err_nomem(err, "session caches", 0);
    for (int i = 0; s->be == &rlm__backend_cpu && i < L; i++) {
      rlm_status rc = make_cache(s, r, i, err);
      if (rc) return rc;
    }
  }
  return RLM_OK;
}

static rlm_status alloc_scratch(rlm_session *s, rlm_error *err) {
  const rlm_model_config *c = &s->m->cfg;
  size_t n = (size_t)s->p.prefill_chunk, qd = (size_t)c->n_heads * c->max_head_dim;
  size_t kd = (size_t)c->max_kv_heads * c->max_head_dim, ple = (size_t)c->n_layers * c->ple_dim;
  size_t wide = RLM_MAX(RLM_MAX((size_t)c->max_inter, qd), (size_t)c->ple_dim);
  size_t in_max = RLM_MAX(RLM_MAX((size_t)c->max_inter, (size_t)c->hidden), qd);
  size_t moe = c->n_experts ? 4 * (size_t)c->hidden + (size_t)c->n_experts + 3 * (size_t)c->moe_inter : 1;
  float **bufs[] = {&s->x, &s->h, &s->q, &s->k, &s->v, &s->att, &s->g, &s->u, &s->ple, &s->ple_tmp, &s->rope,
                    &s->logits};
  size_t sizes[] = {n * c->hidden, n * c->hidden, n * qd, n * kd, n * kd, n * qd, n * wide, n * wide,
                    RLM_MAX(n * ple, 1), RLM_MAX(n * ple, 1), 2 * n * (size_t)c->max_head_dim,
                    RLM_MAX((size_t)s->be->logit_rows * (size_t)c->vocab, 1)};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
    if (!(*bufs[i] = s->be->alloc(s, sizes[i] * sizeof(float))))
      return rlm__err_nomem(err, "session scratch", sizes[i] * 4);
  if (s->be == &rlm__backend_cpu) { /* the CPU kernels' own scratch */
    s->xsum = rlm__malloc(n * in_max * sizeof(float));
    s->moe = rlm__malloc(moe * sizeof(float));
    if (!s->xsum || !s->moe) return rlm__err_nomem(err, "session scratch", n * in_max * 4);
    size_t q8 = s->p.act_bits == 8 ? rlm__linear_q8_bytes((int64_t)n, (int64_t)in_max) : 0;
    if (q8 && !(s->q8 = rlm__malloc(q8))) return rlm__err_nomem(err, "session scratch", q8);
  }
  const size_t R = (size_t)s->p.n_rows;
  s->runs = rlm__malloc(R * sizeof *s->runs);
  s->tok_pos = rlm__malloc(n * sizeof *s->tok_pos);
  s->want = rlm__malloc(n * sizeof *s->want);
  s->row_mark = rlm__calloc(R, sizeof *s->row_mark);
  s->row_need = rlm__calloc(R, sizeof *s->row_need);
  if (!s->runs || !s->tok_pos || !s->want || !s->row_mark || !s->row_need)
    return rlm__err_nomem(err, "session plan", 0);
  return RLM_OK;
}

static rlm_status cuda_init(rlm_session *s, rlm_error *err) {
#ifdef RLM_HAVE_CUDA
  return rlm__cuda_session_init(s, err);
#else
  (void)s;
  return rlm__err(err, RLM_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend (configure with "
                  "-DRINGLM_CUDA=ON)");
#endif
}

rlm_status rlm_session_create(rlm_session **out, rlm_model *m, const rlm_session_params *p,
                              rlm_error *err) {
  if (!out || !m) return rlm__err(err, RLM_ERR_INVALID, "rlm_session_create: NULL argument");
  *out = NULL;
  const rlm_session_params params = p ? *p : rlm_session_params_default();
  rlm_status rc = check_params(m, &params, err);
  if (rc) return rc;
  rlm_session *s = rlm__calloc(1, sizeof *s);
  if (!s) return rlm__err_nomem(err, "session", sizeof *s);
  s->m = m;
  s->p = params;
  s->be = &rlm__backend_cpu;
  rc = rlm__pool_acquire(&s->pool, s->p.n_threads, err); /* the process's shared workers */
  if (!rc && s->p.device == RLM_DEVICE_CUDA) rc = cuda_init(s, err);
  if (!rc) rc = make_rows(s, err);
  if (!rc) rc = alloc_scratch(s, err);
  if (rc) {
    rlm_session_free(s);
    return rc;
  }
  *out = s;
  return RLM_OK;
}

/* rlm_session_host_alloc's blocks: a header of HOST_HEAD bytes before the
 * caller's part says how to free the block (the backend's host_free, or
 * the heap's), so rlm_host_free needs no session. */
enum { HOST_HEAD = 64 };
typedef struct host_head {
  uint64_t magic;
  void (*release)(void *);
} host_head;
#define HOST_MAGIC 0x726c6d486f737431ull /* "rlmHost1" */

void *rlm_session_host_alloc(const rlm_session *s, size_t bytes) {
  if (!s || !bytes || bytes > SIZE_MAX - HOST_HEAD) return NULL;
  const bool dev = s->be->host_alloc != NULL;
  unsigned char *b = dev ? s->be->host_alloc(bytes + HOST_HEAD) : rlm__malloc(bytes + HOST_HEAD);
  if (!b) return NULL;
  *(host_head *)b = (host_head){HOST_MAGIC, dev ? s->be->host_free : rlm__free};
  return b + HOST_HEAD;
}

void rlm_host_free(void *p) {
  if (!p) return;
  unsigned char *b = (unsigned char *)p - HOST_HEAD;
  host_head h = *(host_head *)b;
  if (h.magic != HOST_MAGIC) return; /* not ours: leaking beats freeing the wrong way */
  ((host_head *)b)->magic = 0;
  h.release(b);
}

void rlm_session_free(rlm_session *s) {
  if (!s) return;
  /* Borrowers first: row 0's caches own the scratch. */
  for (int r = s->p.n_rows - 1; s->rows && r >= 0; r--) {
    for (int i = 0; s->rows[r].kv && i < s->m->cfg.n_layers; i++) rlm_kv_free(s->rows[r].kv[i]);
    rlm__free(s->rows[r].kv);
  }
  rlm__free(s->rows);
  float *bufs[] = {s->x, s->h, s->q, s->k, s->v, s->att, s->g, s->u, s->ple, s->ple_tmp, s->rope, s->logits};
  for (size_t i = 0; s->be && i < sizeof bufs / sizeof *bufs; i++)
    if (bufs[i]) s->be->release(s, bufs[i]);
  if (s->be) s->be->fini(s);
  rlm__free(s->xsum), rlm__free(s->moe), rlm__free(s->q8);
  rlm__free(s->runs), rlm__free(s->tok_pos), rlm__free(s->want);
  rlm__free(s->row_mark), rlm__free(s->row_need);
  rlm__pool_release(s->pool);
  rlm__free(s);
}

/* ---- rows --------------------------------------------------------------- */

int rlm_session_rows(const rlm_session *s) { return s ? s->p.n_rows : 0; }

int64_t rlm_session_row_position(const rlm_session *s, int row) {
  return s && row >= 0 && row < s->p.n_rows ? s->rows[row].pos : -1;
}

int64_t rlm_session_position(const rlm_session *s) { return s ? s->rows[0].pos : 0; }

size_t rlm_session_kv_bytes(const rlm_session *s) {
  size_t t = 0;
  for (int r = 0; s && r < s->p.n_rows; r++) t += rlm_session_row_kv_bytes(s, r);
  return t;
}

static rlm_status bad_row(const char *fn, const rlm_session *s, int row, rlm_error *err) {
  return rlm__err(err, RLM_ERR_INVALID, "%s: row %d is outside [0, %d)", fn, row, s ? s->p.n_rows : 0);
}

rlm_status rlm_session_row_clear(rlm_session *s, int row, rlm_error *err) {
  if (!s || row < 0 || row >= s->p.n_rows) return bad_row("rlm_session_row_clear", s, row, err);
  for (int i = 0; i < s->m->cfg.n_layers; i++)
    if (s->rows[row].kv[i]) rlm__kv_reset(s->rows[row].kv[i]);
  s->rows[row].pos = 0;
  return RLM_OK;
}

rlm_status rlm_session_row_release(rlm_session *s, int row, rlm_error *err) {
  if (!s || row < 0 || row >= s->p.n_rows) return bad_row("rlm_session_row_release", s, row, err);
  for (int i = 0; i < s->m->cfg.n_layers; i++)
    if (s->rows[row].kv[i]) rlm__kv_release(s->rows[row].kv[i]);
  s->rows[row].pos = 0;
  return RLM_OK;
}

size_t rlm_session_row_kv_bytes(const rlm_session *s, int row) {
  if (!s || row < 0 || row >= s->p.n_rows) return 0;
  return s->be->row_kv_bytes(s, row);
}

rlm_status rlm_session_rollback(rlm_session *s, int row, int64_t n, rlm_error *err) {
  const char *fn = "rlm_session_rollback";
  if (!s || row < 0 || row >= s->p.n_rows) return bad_row(fn, s, row, err);
  rlm_row *R = &s->rows[row];
  if (n < 0 || n > R->pos)
    return rlm__err(err, RLM_ERR_INVALID, "%s: row %d holds %lld tokens, cannot forget %lld", fn, row,
                    (long long)R->pos, (long long)n);
  const int L = s->m->cfg.n_layers, blocker = s->be->rewind_blocker(s, row, R->pos - n);
  if (blocker >= 0) /* every layer can, or nothing changes */
    return rlm__err(err, RLM_ERR_INVALID,
                    "%s: row %d cannot forget %lld tokens: layer %d's ring has overwritten keys "
                    "it would need (at most prefill_chunk=%d tokens fed since can be forgotten)",
                    fn, row, (long long)n, blocker, s->p.prefill_chunk);
  for (int i = 0; i < L; i++)
    if (R->kv[i] && rlm_kv_trim(R->kv[i], n, err)) return RLM_ERR_INTERNAL; /* checked above */
  R->pos -= n;
  return RLM_OK;
}

/* ---- batches ------------------------------------------------------------ */

static int tok_row(const rlm_batch *b, int i) { return b->rows ? b->rows[i] : 0; }

/* Token i ends its row's run (then NULL logits flags want it). */
static bool run_end(const rlm_batch *b, int i) {
  return i == b->n_tokens - 1 || tok_row(b, i + 1) != tok_row(b, i);
}

static bool wanted(const rlm_batch *b, bool all, int i) {
  return all || (b->logits ? b->logits[i] : run_end(b, i));
}

/* Ids and rows valid, each row one run; row_need[r] counts its tokens. */
static rlm_status check_batch(rlm_session *s, const rlm_batch *b, rlm_error *err) {
  const char *fn = "rlm_session_decode";
  if (!b || b->n_tokens < 1 || !b->ids)
    return rlm__err(err, RLM_ERR_INVALID, "%s: need a batch of at least one token", fn);
  const int64_t stamp = ++s->stamp;
  for (int i = 0; i < b->n_tokens; i++) {
    const int32_t id = b->ids[i], r = tok_row(b, i);
    if (id < 0 || id >= s->m->cfg.vocab)
      return rlm__err(err, RLM_ERR_INVALID, "token id %d at index %d is outside the vocabulary [0, %d)",
                      id, i, s->m->cfg.vocab);
    if (r < 0 || r >= s->p.n_rows)
      return rlm__err(err, RLM_ERR_INVALID, "%s: token %d's row %d is outside [0, %d)", fn, i, r,
                      s->p.n_rows);
    bool starts = i == 0 || tok_row(b, i - 1) != r;
    if (starts && s->row_mark[r] == stamp)
      return rlm__err(err, RLM_ERR_INVALID, "%s: row %d's tokens are not consecutive (token %d)", fn,
                      r, i);
    if (starts) s->row_mark[r] = stamp, s->row_need[r] = 0;
    s->row_need[r]++;
  }
  return RLM_OK;
}

/* The budget and the room: n_ctx, then every cache of every fed row grown
 * for what the batch appends (n_ctx reserved whole at first use). */
static rlm_status reserve_rows(rlm_session *s, const rlm_batch *b, rlm_error *err) {
  const int64_t n_ctx = s->p.n_ctx;
  for (int i = 0; i < b->n_tokens; i++) {
    const int r = tok_row(b, i);
    if (i > 0 && tok_row(b, i - 1) == r) continue;
    const int64_t end = s->rows[r].pos + s->row_need[r];
    if (n_ctx && end > n_ctx)
      return rlm__err(err, RLM_KV_FULL, "rlm_session_decode: row %d: %lld + %lld tokens exceed n_ctx %lld",
                      r, (long long)s->rows[r].pos, (long long)s->row_need[r], (long long)n_ctx);
    for (int l = 0; l < s->m->cfg.n_layers; l++) {
      rlm_kv *kv = s->rows[r].kv[l];
      rlm_status rc = !kv ? RLM_OK : n_ctx ? rlm__kv_reserve(kv, n_ctx, err) : rlm__kv_grow(kv, end, err);
      if (rc) return rc;
    }
  }
  return RLM_OK;
}

/* Plans tokens [t0, t1) of the batch as one pass and runs it. */
static rlm_status run_pass(rlm_session *s, const rlm_batch *b, bool all, int t0, int t1, float *logits,
                           int *n_want, rlm_error *err) {
  rlm_pass ps = {.ids = b->ids + t0, .n = t1 - t0, .runs = s->runs, .tok_pos = s->tok_pos, .want = s->want};
  for (int i = t0; i < t1; i++) {
    const int r = tok_row(b, i), j = i - t0;
    if (i == t0 || tok_row(b, i - 1) != r) s->runs[ps.n_runs++] = (rlm_run){r, j, 0};
    s->tok_pos[j] = s->rows[r].pos + s->runs[ps.n_runs - 1].n++;
    if (wanted(b, all, i)) s->want[ps.n_want++] = j;
  }
  *n_want = ps.n_want;
  return rlm__forward(s, &ps, logits, err);
}

/* all: every token's logits whatever b->logits says (rlm_session_eval). */
static rlm_status decode(rlm_session *s, const rlm_batch *b, bool all, float *logits, rlm_error *err) {
  rlm_status rc = check_batch(s, b, err);
  if (!rc) rc = reserve_rows(s, b, err);
  const int64_t V = s->m->cfg.vocab;
  for (int t0 = 0; !rc && t0 < b->n_tokens; t0 += s->p.prefill_chunk) {
    int t1 = RLM_MIN(b->n_tokens, t0 + s->p.prefill_chunk), n_want = 0;
    rc = run_pass(s, b, all, t0, t1, logits, &n_want, err);
    if (logits) logits += (size_t)n_want * (size_t)V;
  }
  return rc;
}

rlm_status rlm_session_decode(rlm_session *s, const rlm_batch *b, float *logits, rlm_error *err) {
  if (!s) return rlm__err(err, RLM_ERR_INVALID, "rlm_session_decode: NULL session");
  return decode(s, b, false, logits, err);
}

rlm_status rlm_session_eval(rlm_session *s, const int32_t *ids, int n, float *logits, bool all,
                            rlm_error *err) {
  if (!s || !ids || n < 1) return rlm__err(err, RLM_ERR_INVALID, "rlm_session_eval: bad arguments");
  return decode(s, &(rlm_batch){n, ids, NULL, NULL}, all, logits, err);
}
