/* cmd_batch.c -- `ringlm batch`: a completion for every line of a prompts
 * file, all in one continuous batch, as llama.cpp's llama-parallel and
 * vLLM's offline generate do it.
 *
 * Every line is read and encoded first, so each invalid one is known (and
 * gets its error object) before anything generates. Then the library's
 * engine (rlm_gen, the one `run` uses) advances up to --parallel rows of
 * one session at once, and a waiting prompt takes the row of each request
 * that finishes. Requests finish in any order; the results are printed as
 * JSON Lines in input order, each as soon as every earlier one is out.
 * A row's output is the same as that prompt alone on row 0 (`ringlm run`):
 * each row has its own sampler, stop strings and budget, and batched
 * decoding does not mix rows. Options: model_cli.c (the C_BATCH rows). */
#include "model_cli.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const char batch_help[] =
    "usage: ringlm batch [-m DIR] -f PROMPTS [--parallel P] [-n N] [options]\n"
    "A completion for every line of PROMPTS in one continuous batch, as\n"
    "llama-parallel and vLLM's offline generate do: at most P prompts run at once\n"
    "and a waiting prompt takes the place of each one that ends. Every line is a\n"
    "prompt (\"index\": its 0-based line number): plain text, encoded as run encodes\n"
    "-p (BOS as the tokenizer adds it), or a JSON object (first non-blank '{') with\n"
    "\"prompt\" (text) or \"ids\" (token ids), and optionally \"max_tokens\" (>= 0, in\n"
    "place of -n); other keys are ignored. stdout: one JSON object per line, in\n"
    "input order: {\"index\", \"ids\", \"text\", \"n_prompt\", \"n_gen\", \"finish_reason\"}\n"
    "(\"stop\": EOS or a --stop string, which \"text\" leaves out; \"length\": -n or\n"
    "-c; \"text\" is null without tokenizer.json). Each line's output equals\n"
    "`ringlm run` of its prompt with the same options. An invalid line (empty,\n"
    "bad JSON, an id outside the vocabulary, no room in -c) gets {\"index\",\n"
    "\"error\"} and the others still run; the exit status is then 1, after every\n"
    "line is written. Progress and a summary (tokens/s) on stderr.\n";

/* One line of the file: its prompt, then its result. */
typedef struct batch_item {
  int32_t *prompt;      /* [n_prompt] encoded ids; freed once it starts  */
  int64_t n_prompt;
  int64_t max_tokens;   /* "max_tokens", else -n                         */
  char *error;          /* why the line is invalid (malloc'd), or NULL   */
  int32_t *out;         /* [n_out] generated ids, room for cap_out       */
  size_t n_out, cap_out;
  char *text;           /* [text_len] their text, room for cap_text      */
  size_t text_len, cap_text;
  rlm_finish finish;
  bool done;            /* result (or error) complete: may be printed    */
} batch_item;

typedef struct batch_run {
  model_ctx *c;
  const model_opts *o;
  rlm_gen *g;
  batch_item *items;    /* [n_items], one per line of the file           */
  long n_items;
  long next_start;      /* first item not yet given to the engine        */
  long next_print;      /* first item not yet printed                    */
  long *row_item;       /* [rows]: the item running on each row          */
  int rows;
  long n_failed;        /* error objects printed                         */
  double t0, t_progress; /* generation start, last progress line (s)     */
} batch_run;

/* ---- the lines ------------------------------------------------------------ */

/* Marks the line invalid with a one-line message; RLM_ERR_NOMEM when even
 * that cannot be kept. */
static rlm_status item_fail(batch_item *it, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static rlm_status item_fail(batch_item *it, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  free(it->prompt), it->prompt = NULL;
  it->error = strdup(msg);
  it->done = true;
  return it->error ? RLM_OK : RLM_ERR_NOMEM;
}

static rlm_status encode_text(const model_ctx *c, batch_item *it, const char *t, size_t len) {
  if (!c->tok) return item_fail(it, "no tokenizer.json, so text cannot be encoded (give \"ids\")");
  if (!len) return item_fail(it, "empty prompt");
  rlm_error err = {0};
  size_t n;
  rlm_status rc = cli_encode(c->tok, t, len, true, &it->prompt, &n, &err);
  if (rc == RLM_ERR_NOMEM) return rc;
  if (rc) return item_fail(it, "%s", err.msg[0] ? err.msg : rlm_status_str(rc));
  it->n_prompt = (int64_t)n;
  return RLM_OK;
}

/* "ids": integers in the vocabulary, checked here so that a bad one is the
 * line's error before anything runs. */
static rlm_status json_ids(const model_ctx *c, batch_item *it, const json_t *a) {
  const size_t n = json_array_size(a);
  if (!n) return item_fail(it, "empty prompt (\"ids\" is [])");
  if (!(it->prompt = malloc(n * sizeof *it->prompt))) return RLM_ERR_NOMEM;
  for (size_t i = 0; i < n; i++) {
    const json_t *v = json_array_get(a, i);
    const long long id = json_integer_value(v);
    if (!json_is_integer(v)) return item_fail(it, "\"ids\"[%zu] is not an integer", i);
    if (id < 0 || id >= c->vocab)
      return item_fail(it, "token id %lld at index %zu is outside the vocabulary [0, %ld)", id, i,
                       c->vocab);
    it->prompt[i] = (int32_t)id;
  }
  it->n_prompt = (int64_t)n;
  return RLM_OK;
}

static rlm_status json_fields(const model_ctx *c, batch_item *it, const json_t *j) {
  const json_t *p = json_object_get(j, "prompt"), *ids = json_object_get(j, "ids");
  const json_t *mt = json_object_get(j, "max_tokens");
  const long long mt_max = 1073741824; /* -n's bound */
  if (mt && (!json_is_integer(mt) || json_integer_value(mt) < 0 || json_integer_value(mt) > mt_max))
    return item_fail(it, "\"max_tokens\" must be an integer in [0, %lld]", mt_max);
  if (mt) it->max_tokens = json_integer_value(mt);
  if (!p == !ids)
    return item_fail(it, "give one of \"prompt\" (a string) and \"ids\" (an array of token ids)");
  if (p && !json_is_string(p)) return item_fail(it, "\"prompt\" must be a string");
  if (ids && !json_is_array(ids)) return item_fail(it, "\"ids\" must be an array of token ids");
  return p ? encode_text(c, it, json_string_value(p), json_string_length(p)) : json_ids(c, it, ids);
}

static rlm_status parse_json(const model_ctx *c, batch_item *it, const char *s, size_t len) {
  json_error_t je;
  bool nomem;
  json_t *j = rlm_json_loadb(s, len, 0, &je, &nomem); /* '{' first: an object, or an error */
  if (nomem) return RLM_ERR_NOMEM;
  if (!j) return item_fail(it, "invalid JSON at column %d: %s", je.column, je.text);
  rlm_status rc = json_fields(c, it, j);
  json_decref(j);
  return rc;
}

/* The prompt must leave the context room for one generated token. */
static rlm_status check_room(model_ctx *c, const model_opts *o, batch_item *it) {
  if (c->n_ctx && it->n_prompt >= c->n_ctx)
    return item_fail(it, "the prompt reaches position %lld, no room in the context of %ld",
                     (long long)it->n_prompt, c->n_ctx);
  mcli_warn_positions(c, o, it->n_prompt, "a prompt");
  return RLM_OK;
}

/* One line s[0:len) (its '\n' cut) into it; only running out of memory is
 * an error, an invalid line is the item's. */
static rlm_status parse_line(model_ctx *c, const model_opts *o, batch_item *it, const char *s,
                             size_t len) {
  size_t lead = 0;
  if (len && s[len - 1] == '\r') len--; /* a CRLF file */
  while (lead < len && (s[lead] == ' ' || s[lead] == '\t')) lead++;
  it->max_tokens = o->n_gen;
  rlm_status rc = RLM_OK;
  if (!len) rc = item_fail(it, "empty line");
  else if (lead < len && s[lead] == '{') rc = parse_json(c, it, s + lead, len - lead);
  else rc = encode_text(c, it, s, len);
  if (!rc && !it->done) rc = check_room(c, o, it);
  if (!rc && !it->done && it->max_tokens == 0) { /* nothing to generate: no request */
    it->finish = RLM_FINISH_LENGTH, it->done = true;
    free(it->prompt), it->prompt = NULL;
  }
  return rc;
}

/* Lines of text[0:len): each '\n' ends one; a last line without it counts. */
static long count_lines(const char *text, size_t len) {
  long n = len && text[len - 1] != '\n';
  for (const char *p = text; (p = memchr(p, '\n', len - (size_t)(p - text))); p++) n++;
  return n;
}

static rlm_status read_items(batch_run *b, const char *text, size_t len) {
  b->n_items = count_lines(text, len);
  if (!(b->items = calloc((size_t)b->n_items + 1, sizeof *b->items))) return RLM_ERR_NOMEM;
  const char *p = text, *end = text + len;
  rlm_status rc = RLM_OK;
  for (long i = 0; !rc && i < b->n_items; i++) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
    rc = parse_line(b->c, b->o, &b->items[i], p, n);
    p += n + 1;
  }
  return rc;
}

static void free_item(batch_item *it) {
  free(it->prompt), free(it->error), free(it->out), free(it->text);
  it->prompt = it->out = NULL, it->error = it->text = NULL;
}

long mcli_batch_parse(model_ctx *c, const model_opts *o, const char *text, size_t len, long *n_invalid) {
  batch_run b = {.c = c, .o = o};
  rlm_status rc = read_items(&b, text, len);
  long n = rc ? -1 : b.n_items;
  *n_invalid = 0;
  for (long i = 0; b.items && i < b.n_items; i++) {
    *n_invalid += b.items[i].error != NULL;
    free_item(&b.items[i]);
  }
  free(b.items);
  return n;
}

/* ---- output, in input order ------------------------------------------------ */

/* The line's result object, keys in the documented order (json_pack
 * keeps them); NULL when out of memory. */
static json_t *result_json(const batch_run *b, const batch_item *it, long index) {
  json_t *ids = json_array();
  for (size_t i = 0; ids && i < it->n_out; i++)
    if (json_array_append_new(ids, json_integer(it->out[i]))) json_decref(ids), ids = NULL;
  json_t *text = b->c->tok ? json_stringn(it->text ? it->text : "", it->text_len) : json_null();
  /* "o" takes ids and text, also when packing fails */
  return json_pack("{s:I, s:o, s:o, s:I, s:I, s:s}", "index", (json_int_t)index, "ids", ids,
                   "text", text, "n_prompt", (json_int_t)it->n_prompt, "n_gen",
                   (json_int_t)it->n_out, "finish_reason",
                   it->finish == RLM_FINISH_STOP ? "stop" : "length");
}

static json_t *error_json(const batch_item *it, long index) {
  return json_pack("{s:I, s:s}", "index", (json_int_t)index, "error", it->error);
}

/* Prints every finished item that no earlier unfinished one holds back. */
static rlm_status print_ready(batch_run *b) {
  for (; b->next_print < b->n_items && b->items[b->next_print].done; b->next_print++) {
    batch_item *it = &b->items[b->next_print];
    const uint64_t fails = rlm_alloc_failures();
    json_t *j = it->error ? error_json(it, b->next_print) : result_json(b, it, b->next_print);
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    if (s && rlm_alloc_failures() != fails) { /* a member may be missing */
      free(s);
      s = NULL;
    }
    if (!s) return RLM_ERR_NOMEM;
    puts(s);
    free(s);
    b->n_failed += it->error != NULL;
    free_item(it);
  }
  fflush(stdout);
  return RLM_OK;
}

/* ---- generation ------------------------------------------------------------ */

/* Gives waiting items the free rows. A request the engine refuses
 * (RLM_ERR_INVALID) becomes that line's error; other failures end all. */
static rlm_status start_waiting(batch_run *b, rlm_error *err) {
  while (b->next_start < b->n_items && rlm_gen_active(b->g) < b->rows) {
    const long i = b->next_start++;
    batch_item *it = &b->items[i];
    if (it->done) continue;
    rlm_gen_request rq = mcli_request(b->c, b->o, it->prompt, (size_t)it->n_prompt);
    rq.max_tokens = it->max_tokens;
    int row;
    rlm_status rc = rlm_gen_add(b->g, &rq, &row, err);
    if (rc == RLM_ERR_INVALID) rc = item_fail(it, "%s", err->msg), *err = (rlm_error){0};
    if (rc) return rc;
    if (!it->done) b->row_item[row] = i;
    free(it->prompt), it->prompt = NULL; /* the engine keeps its own copy */
  }
  return RLM_OK;
}

static bool append_ids(batch_item *it, const int32_t *ids, size_t n) {
  if (it->n_out + n > it->cap_out) {
    size_t cap = it->cap_out ? it->cap_out : 64;
    while (cap < it->n_out + n) cap *= 2;
    int32_t *p = realloc(it->out, cap * sizeof *p);
    if (!p) return false;
    it->out = p, it->cap_out = cap;
  }
  memcpy(it->out + it->n_out, ids, n * sizeof *ids);
  it->n_out += n;
  return true;
}

static bool append_text(batch_item *it, const char *s, size_t n) {
  if (it->text_len + n > it->cap_text) {
    size_t cap = it->cap_text ? it->cap_text : 256;
    while (cap < it->text_len + n) cap *= 2;
    char *p = realloc(it->text, cap);
    if (!p) return false;
    it->text = p, it->cap_text = cap;
  }
  memcpy(it->text + it->text_len, s, n);
  it->text_len += n;
  return true;
}

/* One row's step into its item's result. */
static rlm_status take_event(batch_run *b, const rlm_gen_event *e) {
  batch_item *it = &b->items[b->row_item[e->row]];
  if (!append_ids(it, e->ids, (size_t)e->n_ids) ||
      (e->text && !append_text(it, e->text, e->text_len)))
    return RLM_ERR_NOMEM;
  if (e->finish != RLM_FINISH_NONE) it->finish = e->finish, it->done = true;
  return RLM_OK;
}

/* A line on stderr at most every 2 s: long files show they move. */
static void progress(batch_run *b) {
  const double now = cli_now_s();
  if (now - b->t_progress < 2.0) return;
  rlm_gen_stats st;
  rlm_gen_get_stats(b->g, -1, &st);
  fprintf(stderr, "batch: %ld/%ld prompts written, %d running, %lld tokens generated, %.1f tok/s\n",
          b->next_print, b->n_items, rlm_gen_active(b->g), (long long)st.n_gen,
          (double)st.n_gen / (now - b->t0 + 1e-12));
  b->t_progress = now;
}

static rlm_status generate_all(batch_run *b, rlm_error *err) {
  rlm_status rc = start_waiting(b, err);
  if (!rc) rc = print_ready(b); /* invalid lines at the top need not wait */
  while (!rc && rlm_gen_active(b->g) > 0) {
    const rlm_gen_event *ev;
    int n_ev;
    rc = rlm_gen_step(b->g, &ev, &n_ev, err);
    for (int i = 0; !rc && i < n_ev; i++) rc = take_event(b, &ev[i]);
    if (!rc) rc = start_waiting(b, err); /* the rows that finished are free now */
    if (!rc) rc = print_ready(b);
    progress(b);
  }
  return rc;
}

static void summary(const batch_run *b) {
  rlm_gen_stats st;
  char spec[96] = "", kv[32], rss[32];
  rlm_gen_get_stats(b->g, -1, &st);
  const double t = cli_now_s() - b->t0;
  if (st.drafted)
    snprintf(spec, sizeof spec, ", drafted %lld accepted %lld (%.1f%%)", (long long)st.drafted,
             (long long)st.accepted, 100.0 * (double)st.accepted / (double)st.drafted);
  fprintf(stderr,
          "batch: %ld prompt%s (%ld failed) on %d row%s, prompt %lld tokens, generated %lld "
          "token%s in %.2f s, %.1f tok/s%s, KV %s, peak RSS %s\n",
          b->n_items, cli_s(b->n_items), b->n_failed, b->rows, cli_s(b->rows),
          (long long)st.n_prompt, (long long)st.n_gen, cli_s((long)st.n_gen), t,
          (double)st.n_gen / (t + 1e-12), spec,
          cli_bytes((double)rlm_session_kv_bytes(b->c->s), kv, sizeof kv),
          cli_bytes(cli_peak_rss(), rss, sizeof rss));
}

static int batch(model_ctx *c, const model_opts *o, const char *text, size_t len) {
  batch_run b = {.c = c, .o = o, .rows = o->sp.n_rows};
  rlm_error err = {0};
  const rlm_gen_params gp = mcli_gen_params(o);
  rlm_status rc = read_items(&b, text, len);
  if (!rc && !(b.row_item = calloc((size_t)b.rows, sizeof *b.row_item))) rc = RLM_ERR_NOMEM;
  if (!rc) rc = rlm_gen_create(&b.g, c->s, c->ds, c->tok, &gp, &err);
  b.t0 = b.t_progress = cli_now_s();
  if (!rc) rc = generate_all(&b, &err);
  if (!rc) summary(&b);
  rlm_gen_free(b.g);
  for (long i = 0; b.items && i < b.n_items; i++) free_item(&b.items[i]);
  free(b.items);
  free(b.row_item);
  if (rc == RLM_ERR_NOMEM && !err.msg[0]) snprintf(err.msg, sizeof err.msg, "out of memory");
  if (rc) return cli_fail(&err);
  if (ferror(stdout)) {
    fprintf(stderr, "ringlm: batch: cannot write the results: %s\n", strerror(errno));
    return CLI_FAIL;
  }
  return b.n_failed ? CLI_FAIL : CLI_OK;
}

int cmd_batch(int argc, char **argv) {
  model_opts o = mcli_defaults();
  int rc = mcli_parse(argc, argv, &o, "batch", batch_help);
  if (rc) return rc == MCLI_HELP ? CLI_OK : rc;
  if (!o.file) return cli_usage_error("batch", "needs -f PROMPTS");
  size_t len;
  char *text = cli_read_file(o.file, &len);
  if (!text)
    return fprintf(stderr, "ringlm: %s: cannot read: %s\n", cli_path_name(o.file), strerror(errno)),
           CLI_FAIL;
  /* No more rows than prompts: each row may hold KV memory. The draft
   * session (--draft) gets the same rows. */
  const long n_lines = count_lines(text, len);
  o.sp.n_rows = n_lines < o.parallel ? (n_lines > 0 ? (int)n_lines : 1) : o.parallel;
  model_ctx c;
  if (!(rc = mcli_open(&o, &c, false))) {
    rc = batch(&c, &o, text, len);
    mcli_close(&c);
  }
  free(text);
  return rc;
}
