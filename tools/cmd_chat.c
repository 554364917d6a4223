/* cmd_chat.c -- `ringlm chat`: an interactive conversation. Each user line
 * joins the message list, the model's chat template renders the whole
 * conversation with the generation prompt, and only the tokens past what
 * the session already holds are fed (the session restarts when the new
 * rendering departs from them). Replies stream as they are generated and
 * end at an EOS id (generation_config.json), e.g. <end_of_turn>. */
#include "model_cli.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char chat_help[] =
    "usage: ringlm chat [-m DIR] [--system TEXT] [-n N] [--temp T] [--top-k K] [--top-p P]\n"
    "                   [--min-p P] [--repeat-penalty R] [--seed S] [--stop STR]...\n"
    "                   [--kv-bits B] [--k-bits B] [--v-bits B] [--kv-group-size G]\n"
    "                   [--max-kv N] [--prefill-chunk N] [-t N] [--verbose-prompt]\n"
    "Reads one user message per line from stdin and streams each reply (at most N\n"
    "tokens, default 512). The conversation is rendered with the model's chat\n"
    "template (tokenizer_config.json). --verbose-prompt prints each rendered prompt\n"
    "on stderr. End with an empty line or end of input.\n";

/* A growing byte buffer. */
typedef struct buf {
  char *p;
  size_t n, cap;
} buf;

static bool buf_add(buf *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t cap = (b->n + n + 1) * 2;
    char *p = realloc(b->p, cap);
    if (!p) return false;
    b->p = p, b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
  return true;
}

/* Appends {"role": role, "content": text} (JSON-escaped) to a messages
 * array held open as "[...": the caller closes it with "]". */
static bool add_message(buf *b, const char *role, const char *text) {
  const char *open = b->n > 1 ? ", {\"role\": \"" : "{\"role\": \"", *mid = "\", \"content\": \"";
  bool ok = buf_add(b, open, strlen(open)) && buf_add(b, role, strlen(role)) && buf_add(b, mid, strlen(mid));
  for (const unsigned char *c = (const unsigned char *)text; ok && *c; c++) {
    char esc[8];
    if (*c == '"' || *c == '\\') esc[0] = '\\', esc[1] = (char)*c, esc[2] = 0;
    else if (*c < 0x20) snprintf(esc, sizeof esc, "\\u%04x", *c);
    else esc[0] = (char)*c, esc[1] = 0;
    ok = buf_add(b, esc, strlen(esc));
  }
  return ok && buf_add(b, "\"}", 2);
}

typedef struct chat {
  model_ctx c;
  rlm_chat_template *tpl;
  buf msgs;             /* "[{...}, {...}" */
  int32_t *hist;        /* ids the session holds, in order */
  size_t n_hist, cap_hist;
  int32_t *gen;
} chat;

/* Renders the conversation and returns its ids (malloc'd). */
static int render_ids(chat *ch, const model_opts *o, int32_t **ids, size_t *n) {
  rlm_error err = {0};
  char *text = NULL;
  size_t len;
  if (!buf_add(&ch->msgs, "]", 1)) return cli_fail(&(rlm_error){RLM_ERR_NOMEM, "out of memory"});
  rlm_status rc = rlm_chat_template_render(ch->tpl, ch->msgs.p, NULL, true, &text, &len, &err);
  ch->msgs.p[--ch->msgs.n] = 0; /* reopen the array */
  if (rc) return cli_fail(&err);
  if (o->verbose_prompt) fprintf(stderr, "%s", text);
  rc = cli_encode(ch->c.tok, text, len, false, ids, n, &err); /* the template wrote the specials */
  rlm_free(text);
  return rc ? cli_fail(&err) : CLI_OK;
}

/* Feeds ids past the common prefix with what the session holds (or the
 * whole rendering on a fresh session), then generates the reply. */
static int reply(chat *ch, const model_opts *o, const int32_t *ids, size_t n) {
  size_t keep = 0;
  while (keep < ch->n_hist && keep < n && ch->hist[keep] == ids[keep]) keep++;
  if (keep < ch->n_hist || keep == n) { /* diverged: start over */
    rlm_error err = {0};
    rlm_session_free(ch->c.s), ch->c.s = NULL;
    if (rlm_session_create(&ch->c.s, ch->c.m, &o->sp, &err)) return cli_fail(&err);
    keep = 0;
  }
  long n_gen = 0;
  int rc = mcli_generate(&ch->c, o, ids + keep, n - keep, ch->gen, &n_gen);
  if (rc) return rc;
  if (n + (size_t)n_gen > ch->cap_hist) {
    int32_t *h = realloc(ch->hist, (n + (size_t)n_gen) * 2 * sizeof *h);
    if (!h) return cli_fail(&(rlm_error){RLM_ERR_NOMEM, "out of memory"});
    ch->hist = h, ch->cap_hist = (n + (size_t)n_gen) * 2;
  }
  memcpy(ch->hist, ids, n * sizeof *ids);
  memcpy(ch->hist + n, ch->gen, (size_t)n_gen * sizeof *ids);
  ch->n_hist = n + (size_t)n_gen;
  /* The reply's text joins the conversation. */
  size_t len = 0;
  rlm_error err = {0};
  char *text = NULL;
  rlm_status st = rlm_detokenize(ch->c.tok, ch->gen, (size_t)n_gen, true, NULL, 0, &len, &err);
  if (st == RLM_ERR_INVALID && (text = malloc(len + 1)))
    st = rlm_detokenize(ch->c.tok, ch->gen, (size_t)n_gen, true, text, len + 1, &len, &err);
  bool ok = st == RLM_OK && add_message(&ch->msgs, "assistant", text ? text : "");
  free(text);
  return ok ? CLI_OK : cli_fail(&(rlm_error){RLM_ERR_NOMEM, "cannot record the reply"});
}

static int converse(chat *ch, const model_opts *o) {
  char *line = NULL;
  size_t cap = 0;
  ssize_t got;
  int rc = CLI_OK;
  bool tty = isatty(0);
  while (!rc) {
    if (tty) fputs("> ", stdout), fflush(stdout);
    if ((got = getline(&line, &cap, stdin)) <= 0) break;
    while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
    if (!got) break;
    int32_t *ids = NULL;
    size_t n;
    if (!add_message(&ch->msgs, "user", line)) rc = cli_fail(&(rlm_error){RLM_ERR_NOMEM, "out of memory"});
    if (!rc) rc = render_ids(ch, o, &ids, &n);
    if (!rc) rc = reply(ch, o, ids, n);
    free(ids);
  }
  free(line);
  return rc;
}

int cmd_chat(int argc, char **argv) {
  model_opts o = mcli_defaults();
  o.n_gen = 512;
  int rc = mcli_parse(argc, argv, &o, "chat", chat_help);
  if (rc) return rc == MCLI_HELP ? CLI_OK : rc;
  if (o.ids_arg || o.prompt || o.print_ids) return cli_usage_error("chat", "reads its messages from stdin (no --ids, --prompt or --print-ids)");
  chat ch = {0};
  rlm_error err = {0};
  if ((rc = mcli_open(&o, &ch.c, true))) return rc;
  if (rlm_chat_template_load(&ch.tpl, o.dir, &err)) rc = cli_fail(&err);
  else if (!(ch.gen = malloc(((size_t)o.n_gen + 1) * sizeof *ch.gen)) || !buf_add(&ch.msgs, "[", 1))
    rc = cli_fail(&(rlm_error){RLM_ERR_NOMEM, "out of memory"});
  else if (o.system && !add_message(&ch.msgs, "system", o.system))
    rc = cli_fail(&(rlm_error){RLM_ERR_NOMEM, "out of memory"});
  o.no_stats = true; /* a conversation, not a benchmark */
  if (!rc) rc = converse(&ch, &o);
  free(ch.msgs.p), free(ch.hist), free(ch.gen);
  rlm_chat_template_free(ch.tpl);
  mcli_close(&ch.c);
  return rc;
}
