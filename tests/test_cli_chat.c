/* test_cli_chat.c -- `ringlm chat` as a user meets it, on the embedded
 * model (models/brown-15m-4bit, whose template is Gemma's): a line that
 * is not UTF-8 refused and the chat going on, /clear and /exit, a
 * --chat-template file in place of the model's, Ctrl-C (SIGINT) ending a
 * reply but not the program, and the terminal path (libedit) driven
 * through a pseudo-terminal: arrow keys edit the line and recall history,
 * Ctrl-C at the prompt ends the chat. --verbose-prompt shows each
 * rendering on stderr, which is what most checks read.
 *
 * What the chat's session holds is not visible from outside, so the
 * turns themselves (cli_conv, tools/cli_chat.c) also run in this process,
 * the tool sources compiled in: after replies that end at a stop string,
 * at -n and at EOS, the session's logits must be those of a fresh session
 * fed the whole rendered conversation. */
#include "test.h"

/* The tool sources (cmd_chat.c, with libedit, stays out); their embedded
 * model is found through RINGLM_SOURCE_DIR here, never the default. */
#define RLM_DEFAULT_MODEL_DIRS ""
#include "../tools/cli_chat.c"
#include "../tools/cli_text.c"
#include "../tools/model_cli.c"

#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

static char g_dir[256], g_model[512], g_tpl[600];
static const char *g_bin;

#define run t_run_cmd

static int count(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

static int count_lines(const char *s) {
  int n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (!f) return;
  fputs(text, f);
  fclose(f);
}

/* The whole file, NUL-terminated (malloc'd), "" when it cannot be read. */
static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  size_t n = 0, cap = 1 << 16;
  char *s = xmalloc(cap + 1);
  for (size_t got; f && (got = fread(s + n, 1, cap - n, f)) > 0;) {
    n += got;
    if (n == cap) {
      char *t = xmalloc(2 * cap + 1);
      memcpy(t, s, n);
      free(s);
      s = t;
      cap *= 2;
    }
  }
  if (f) fclose(f);
  s[n] = 0;
  return s;
}

/* printf LINES | ringlm chat -n 4 --verbose-prompt FLAGS: its stderr (the
 * renderings and the messages) into out; its exit status. */
static int chat_stderr(char *out, size_t n, const char *lines, const char *flags) {
  return run(out, n, "(printf '%s' | %s chat -m %s -n 4 --verbose-prompt %s 2>&1 >/dev/null)",
             lines, g_bin, g_model, flags);
}

/* A line that is not UTF-8 gets one error line and changes nothing: the
 * next line is the conversation's first message, and the chat ends
 * normally. */
TEST(invalid_utf8_line_is_refused) {
  char out[16384];
  CHECK_EQ(chat_stderr(out, sizeof out, "Hi \\377 there\\nAgain\\n", "--system Be"), 0);
  CHECK_EQ(count(out, "ringlm chat: that line is not valid UTF-8; type it again\n"), 1);
  CHECK_STR_CONTAINS(out, "<bos><start_of_turn>system\nBe<end_of_turn>\n<start_of_turn>user\nAgain"
                          "<end_of_turn>\n<start_of_turn>model\n");
  CHECK(!strstr(out, "Hi "));
  CHECK(!strstr(out, "JSON"));
  CHECK_EQ(count(out, "<start_of_turn>user\n"), 1);
}

/* /clear: the next rendering is the system prompt and the new line only;
 * an unknown /command names the commands and is not sent either. */
TEST(clear_forgets_all_but_the_system_prompt) {
  char out[16384];
  CHECK_EQ(chat_stderr(out, sizeof out, "Hi\\n/clear\\n/frob x\\nAgain\\n", "--system Be"), 0);
  CHECK_EQ(count(out, "<start_of_turn>user\nHi<end_of_turn>"), 1);
  CHECK_STR_CONTAINS(out, "<bos><start_of_turn>system\nBe<end_of_turn>\n<start_of_turn>user\nAgain"
                          "<end_of_turn>\n<start_of_turn>model\n");
  CHECK_STR_CONTAINS(out, "'/frob' is not a command; the commands are /clear");
  CHECK(!strstr(out, "user\n/"));
  CHECK_EQ(count(out, "<bos>"), 2);
}

/* /exit and /quit end the chat (status 0) before the lines after them. */
TEST(exit_ends_the_chat) {
  char out[16384];
  static const char *const lines[2] = {"Hi\\n/exit\\nAgain\\n", "Hi\\n/quit  \\nAgain\\n"};
  for (int i = 0; i < 2; i++) {
    CHECK_EQ(chat_stderr(out, sizeof out, lines[i], ""), 0);
    CHECK_EQ(count(out, "<start_of_turn>user\nHi<end_of_turn>"), 1);
    CHECK(!strstr(out, "Again"));
    CHECK(!strstr(out, "user\n/"));
  }
}

/* --chat-template FILE renders in place of the model's template, with the
 * tokenizer's BOS as bos_token; a missing or malformed file is one line
 * naming it, status 1. */
TEST(chat_template_file) {
  char out[16384], bad[700], flags[800];
  snprintf(flags, sizeof flags, "--chat-template %s --system Be", g_tpl);
  CHECK_EQ(chat_stderr(out, sizeof out, "Hi\\nAgain\\n", flags), 0);
  CHECK_STR_CONTAINS(out, "<bos>[system] Be\n[user] Hi\n[assistant] ");
  CHECK_STR_CONTAINS(out, "\n[user] Again\n[assistant] ");
  CHECK(!strstr(out, "<start_of_turn>"));
  snprintf(bad, sizeof bad, "%s/missing.jinja", g_dir);
  snprintf(flags, sizeof flags, "--chat-template %s", bad);
  CHECK_EQ(chat_stderr(out, sizeof out, "Hi\\n", flags), 1);
  CHECK_STR_CONTAINS(out, bad);
  CHECK_EQ(count_lines(out), 1);
  snprintf(bad, sizeof bad, "%s/bad.jinja", g_dir);
  write_file(bad, "{% for m in messages %}{{ m.content }}\n");
  snprintf(flags, sizeof flags, "--chat-template %s", bad);
  CHECK_EQ(chat_stderr(out, sizeof out, "Hi\\n", flags), 1);
  CHECK_STR_CONTAINS(out, bad);
  CHECK_EQ(count_lines(out), 1);
}

/* ------------------------------------------------------------------------
 * Ctrl-C through a pipe: SIGINT sent while a reply streams.
 * ---------------------------------------------------------------------- */

typedef struct child {
  pid_t pid;
  bool done;
  int status;
} child;

static bool child_done(child *c) {
  if (!c->done && waitpid(c->pid, &c->status, WNOHANG) == c->pid) c->done = true;
  return c->done;
}

/* Waits (60 s at most, less when the child ends) for the file at path to
 * hold more than min bytes and, when want is given, to contain it. */
static bool wait_file(child *c, const char *path, size_t min, const char *want) {
  for (int i = 0; i < 3000; i++) {
    char *s = slurp(path);
    bool ok = strlen(s) > min && (!want || strstr(s, want));
    free(s);
    if (ok) return true;
    if (child_done(c)) return false;
    usleep(20000);
  }
  return false;
}

static size_t file_size(const char *path) {
  char *s = slurp(path);
  size_t n = strlen(s);
  free(s);
  return n;
}

/* Waits 60 s at most for the child to end, then kills it. */
static void finish(child *c) {
  for (int i = 0; i < 3000 && !child_done(c); i++) usleep(20000);
  if (c->done) return;
  kill(c->pid, SIGKILL);
  waitpid(c->pid, &c->status, 0);
  c->done = true;
}

/* ringlm chat -n n_gen on a pipe, its stdout and stderr into files. */
static child start_chat(const char *n_gen, int *to, const char *out_path, const char *err_path) {
  int p[2];
  child c = {0};
  if (pipe(p)) return c;
  if ((c.pid = fork()) == 0) {
    dup2(p[0], 0);
    close(p[0]);
    close(p[1]);
    int fo = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int fe = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fo, 1);
    dup2(fe, 2);
    execl(g_bin, g_bin, "chat", "-m", g_model, "-n", n_gen, "--ignore-eos", "--verbose-prompt",
          (char *)NULL);
    _exit(127);
  }
  close(p[0]);
  *to = p[1];
  return c;
}

/* The first reply (100000 tokens asked) cut by SIGINT: the program
 * survives, the second line is rendered with what came of the reply, a
 * second SIGINT cuts that reply too, end of input ends the chat with 0. */
TEST(ctrl_c_stops_only_the_reply) {
  char out_path[600], err_path[600];
  snprintf(out_path, sizeof out_path, "%s/replies.txt", g_dir);
  snprintf(err_path, sizeof err_path, "%s/prompts.txt", g_dir);
  int to = -1;
  child c = start_chat("100000", &to, out_path, err_path);
  CHECK(c.pid > 0);
  if (c.pid <= 0) return;
  CHECK(write(to, "Tell me a story\n", 16) == 16);
  CHECK(wait_file(&c, out_path, 64, NULL)); /* the reply streams */
  kill(c.pid, SIGINT);
  CHECK(write(to, "And then?\n", 10) == 10);
  static const char again[] = "user\nAnd then?<end_of_turn>\n<start_of_turn>model\n";
  bool answered = wait_file(&c, err_path, 0, again);
  CHECK(answered);
  size_t before = file_size(out_path);
  CHECK(answered && wait_file(&c, out_path, before + 64, NULL)); /* the second reply streams */
  kill(c.pid, SIGINT);
  close(to);
  finish(&c);
  test_note("status %#x", c.status);
  CHECK(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0);
  /* The cut reply is in the second rendering, as it was streamed. */
  static const char asked[] = "user\nTell me a story<end_of_turn>\n<start_of_turn>model\n";
  char *prompts = slurp(err_path), *replies = slurp(out_path);
  const char *turn = strstr(prompts, asked);
  turn = turn ? strstr(turn + 1, asked) : NULL; /* the second rendering's */
  const char *end = turn ? strstr(turn, "<end_of_turn>\n<start_of_turn>user\nAnd then?") : NULL;
  CHECK(turn && end);
  if (turn && end) {
    turn += strlen(asked);
    char *said = xmalloc((size_t)(end - turn) + 1);
    memcpy(said, turn, (size_t)(end - turn));
    CHECK(strlen(said) > 16);
    CHECK(strstr(replies, said) != NULL);
    free(said);
  }
  free(prompts);
  free(replies);
}

/* SIGINT after a reply, while the next line is awaited: the chat ends
 * (130, as llama.cpp), the lines after it unread. */
TEST(ctrl_c_at_the_prompt_ends_the_chat) {
  char out_path[600], err_path[600];
  snprintf(out_path, sizeof out_path, "%s/replies2.txt", g_dir);
  snprintf(err_path, sizeof err_path, "%s/prompts2.txt", g_dir);
  int to = -1;
  child c = start_chat("4", &to, out_path, err_path);
  CHECK(c.pid > 0);
  if (c.pid <= 0) return;
  CHECK(write(to, "Hi\n", 3) == 3);
  CHECK(wait_file(&c, out_path, 0, "\n")); /* the reply is over */
  usleep(200000);                            /* and the chat waits for a line */
  kill(c.pid, SIGINT);
  finish(&c);
  test_note("status %#x", c.status);
  CHECK(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 130);
  ssize_t w = write(to, "Again\n", 6); /* nobody reads it */
  (void)w;
  close(to);
  char *prompts = slurp(err_path);
  CHECK_EQ(count(prompts, "<bos>"), 1);
  free(prompts);
}

/* ------------------------------------------------------------------------
 * What the session holds: the turns in this process. The streamed
 * replies go to a file (stdout moved there for each turn), which is also
 * what the user saw.
 * ---------------------------------------------------------------------- */

/* The id of a text that encodes to one id, or -1. */
static int32_t one_id(const rlm_tokenizer *tok, const char *text) {
  int32_t *ids = NULL;
  size_t n = 0;
  rlm_error err = {0};
  rlm_status st = cli_encode(tok, text, strlen(text), false, &ids, &n, &err);
  int32_t id = st == RLM_OK && n == 1 ? ids[0] : -1;
  free(ids);
  return id;
}

/* The embedded model in dir (links to its files) with "\n", "." and ","
 * added to its EOS ids: a reply the tiny model rarely ends at
 * <end_of_turn> then ends at EOS within a few dozen ids. */
static void eos_model(char *dir, size_t n) {
  static const char *const files[] = {"config.json", "model.safetensors", "tokenizer.json",
                                      "tokenizer_config.json"};
  snprintf(dir, n, "%s/eos-model", g_dir);
  CHECK(mkdir(dir, 0755) == 0);
  for (int i = 0; i < N_OF(files); i++) {
    char from[800], to[800];
    snprintf(from, sizeof from, "%s/%s", g_model, files[i]);
    snprintf(to, sizeof to, "%s/%s", dir, files[i]);
    CHECK(symlink(from, to) == 0);
  }
  rlm_tokenizer *tok = NULL;
  rlm_error err = {0};
  CHECK_EQ(rlm_tokenizer_load(&tok, g_model, &err), RLM_OK);
  int32_t nl = tok ? one_id(tok, "\n") : -1, dot = tok ? one_id(tok, ".") : -1;
  int32_t comma = tok ? one_id(tok, ",") : -1;
  CHECK(nl >= 0 && dot >= 0 && comma >= 0);
  char path[800], cfg[256]; /* the embedded model's, plus the three */
  snprintf(path, sizeof path, "%s/generation_config.json", dir);
  snprintf(cfg, sizeof cfg, "{\"bos_token_id\": 2, \"eos_token_id\": [1, 4, %d, %d, %d], "
           "\"pad_token_id\": 0}\n", (int)nl, (int)dot, (int)comma);
  write_file(path, cfg);
  rlm_tokenizer_free(tok);
}

/* ids as text, special ones dropped (malloc'd). */
static char *detok(const rlm_tokenizer *tok, const int32_t *ids, size_t n) {
  char *text = xmalloc(4096);
  size_t len = 0;
  rlm_error err = {0};
  CHECK_EQ(rlm_detokenize(tok, ids, n, true, text, 4096, &len, &err), RLM_OK);
  return text;
}

/* One turn: -n n_gen, ending at EOS only when eos, at stop when given.
 * Returns the reply as it was streamed (malloc'd). */
static char *turn(cli_conv *v, model_opts *o, const char *line, long n_gen, bool eos,
                  const char *stop, const char *out_path) {
  o->n_gen = n_gen;
  o->ignore_eos = !eos;
  o->stops[0] = stop;
  o->n_stops = stop != NULL;
  fflush(stdout);
  int saved = dup(STDOUT_FILENO), fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  CHECK(saved >= 0 && fd >= 0);
  dup2(fd, STDOUT_FILENO);
  close(fd);
  int rc = cli_conv_turn(v, o, line);
  fflush(stdout);
  dup2(saved, STDOUT_FILENO);
  close(saved);
  CHECK_EQ(rc, CLI_OK);
  char *said = slurp(out_path);
  size_t len = strlen(said);
  if (len && said[len - 1] == '\n') said[len - 1] = 0; /* mcli_generate ends the line */
  return said;
}

/* Whether the conversation's last message is the assistant's text. */
static bool last_reply_is(const cli_conv *v, const char *text) {
  cli_msgs one = {0};
  bool ok = cli_msgs_add(&one, "assistant", text);
  size_t n = ok ? one.n - 1 : 0; /* without its "[" */
  ok = ok && v->msgs.n >= n && !memcmp(v->msgs.p + v->msgs.n - n, one.p + 1, n);
  if (!ok) test_note("the reply streamed: '%s'; the conversation: ...%s", text,
                     v->msgs.n > 120 ? v->msgs.p + v->msgs.n - 120 : v->msgs.p);
  cli_msgs_free(&one);
  return ok;
}

/* The next turn's rendering fed past what the session holds must give
 * the logits a fresh session gives for the whole rendering. The held
 * prefix must be reused, not fed again: a session started over would
 * pass trivially. */
static void check_holds_conversation(cli_conv *v, const model_opts *o) {
  int32_t *ids = NULL;
  size_t n = 0, keep = 0, held = v->n_held;
  long restarts = v->n_restarts;
  CHECK(cli_msgs_add(&v->msgs, "user", "Bye"));
  CHECK_EQ(cli_chat_render_ids(v->c, o, v->tpl, &v->msgs, &ids, &n), CLI_OK);
  CHECK_EQ(cli_conv_sync(v, o, ids, n, &keep), CLI_OK);
  CHECK_EQ(v->n_restarts, restarts);
  CHECK(keep > 0 && keep == held && keep < n);
  float *got = xmalloc((size_t)v->c->vocab * sizeof *got);
  float *want = xmalloc((size_t)v->c->vocab * sizeof *want);
  rlm_error err = {0};
  rlm_session *fresh = NULL;
  CHECK_EQ(rlm_session_eval(v->c->s, ids + keep, (int)(n - keep), got, false, &err), RLM_OK);
  CHECK_EQ(rlm_session_position(v->c->s), (long long)n);
  CHECK_EQ(rlm_session_create(&fresh, v->c->m, &o->sp, &err), RLM_OK);
  if (fresh) CHECK_EQ(rlm_session_eval(fresh, ids, (int)n, want, false, &err), RLM_OK);
  double max_want = 0, max_diff = 0;
  for (long i = 0; i < v->c->vocab; i++) {
    max_want = fmax(max_want, fabs(want[i]));
    max_diff = fmax(max_diff, fabs((double)got[i] - want[i]));
  }
  test_note("%zu ids, %zu held, max |diff| %g, max |logit| %g", n, held, max_diff, max_want);
  /* Not bit-equal: the chat session decoded its replies one id at a time,
   * which sums in another order than a prefill (about 1e-6), and the
   * embedded model keeps its KV in bf16, whose rounding turns that into
   * about 1e-4 x max |logit| after a few dozen decoded ids; a lost id
   * shows as 2.5e-2. */
  CHECK(max_want > 0 && max_diff <= 1e-3 * max_want);
  rlm_session_free(fresh);
  free(want);
  free(got);
  free(ids);
}

/* Replies that end at a stop string (two ids: the first fed, and cut
 * from the text), at -n (the last id never fed) and at EOS, then one more
 * at -n: each reply joins the conversation as it was streamed, and the
 * session holds the rendered conversation. */
TEST(session_holds_the_conversation) {
  char dir[700], out[800];
  eos_model(dir, sizeof dir);
  snprintf(out, sizeof out, "%s/streamed.txt", g_dir);
  model_opts o = mcli_defaults();
  o.cmd = "chat";
  o.dir = dir;
  o.system = "Be brief.";
  o.no_stats = true;
  o.n_gen = 60; /* the most any turn asks: the room cli_conv_init gives gen */
  model_ctx c;
  rlm_chat_template *t = NULL;
  cli_conv v;
  CHECK_EQ(mcli_open(&o, &c, true), CLI_OK);
  CHECK_EQ(cli_chat_load_template(&o, &t), CLI_OK);
  CHECK_EQ(cli_conv_init(&v, &c, &o, t), CLI_OK);
  if (!c.s || !t || !v.gen) return;
  free(turn(&v, &o, "Hi", 3, false, NULL, out)); /* the stop string: ids 1 and 2 of this reply */
  char *stop = detok(c.tok, v.gen + 1, 2), *said;
  test_note("stop '%s'", stop);
  CHECK(strlen(stop) > 0);
  CHECK_EQ(cli_conv_clear(&v, &o), CLI_OK);
  said = turn(&v, &o, "Hi", 40, false, stop, out);
  CHECK_EQ(v.n_gen, 3);
  CHECK(!strstr(said, stop));
  CHECK(last_reply_is(&v, said));
  free(said);
  said = turn(&v, &o, "Tell me more", 6, false, NULL, out);
  CHECK_EQ(v.n_restarts, 0);  /* the stop string's first id: held, not rendered, */
  CHECK_EQ(v.n_rollbacks, 1); /* so forgotten                                   */
  CHECK_EQ(v.n_gen, 6);
  CHECK(last_reply_is(&v, said));
  free(said);
  said = turn(&v, &o, "And then?", 60, true, NULL, out);
  test_note("EOS reply of %ld ids: '%s'", v.n_gen, said);
  CHECK(v.n_gen < 60);
  CHECK(last_reply_is(&v, said));
  free(said);
  said = turn(&v, &o, "Go on", 6, false, NULL, out);
  CHECK_EQ(v.n_gen, 6);
  CHECK(last_reply_is(&v, said));
  free(said);
  check_holds_conversation(&v, &o);
  free(stop);
  cli_conv_free(&v);
  rlm_chat_template_free(t);
  mcli_close(&c);
}

/* ------------------------------------------------------------------------
 * The terminal: libedit through a pseudo-terminal.
 * ---------------------------------------------------------------------- */

typedef struct term {
  child c;
  int fd;        /* the master side                    */
  char buf[1 << 16];
  size_t n;      /* bytes the child wrote to its terminal */
} term;

/* Reads what the child writes until buf from `from` on contains want (30
 * s at most, less when the child closes its terminal). */
static bool term_wait(term *t, size_t from, const char *want) {
  for (int i = 0; i < 1500; i++) {
    if (strstr(t->buf + from, want)) return true;
    struct pollfd p = {.fd = t->fd, .events = POLLIN};
    if (poll(&p, 1, 20) <= 0) continue;
    ssize_t got = read(t->fd, t->buf + t->n, sizeof t->buf - 1 - t->n);
    if (got <= 0) return false;
    t->n += (size_t)got;
    t->buf[t->n] = 0;
  }
  return false;
}

/* Types keys once the prompt is back after the n_done-th reply: "> " at
 * the start, then "\n> " after that rendering's generation prompt. */
static bool term_type(term *t, int n_done, const char *keys) {
  static const char gen[] = "<start_of_turn>model\r\n";
  size_t at = 0;
  for (int k = 0; k < n_done; k++) {
    if (!term_wait(t, at, gen)) return false;
    at = (size_t)(strstr(t->buf + at, gen) - t->buf) + strlen(gen);
  }
  bool ready = term_wait(t, at, n_done ? "\n> " : "> ");
  return ready && write(t->fd, keys, strlen(keys)) == (ssize_t)strlen(keys);
}

/* Left arrow edits the line ("Hi" -> "H!i"), up arrow recalls it, and
 * neither reaches the model as an escape sequence; Ctrl-C at the prompt
 * ends the chat (130). */
TEST(terminal_edits_lines) {
  static term t;
  memset(&t, 0, sizeof t);
  struct winsize ws = {.ws_row = 24, .ws_col = 100};
  t.c.pid = forkpty(&t.fd, NULL, NULL, &ws);
  CHECK(t.c.pid >= 0);
  if (t.c.pid < 0) return;
  if (t.c.pid == 0) {
    setenv("TERM", "xterm", 1);
    execl(g_bin, g_bin, "chat", "-m", g_model, "-n", "4", "--verbose-prompt", (char *)NULL);
    _exit(127);
  }
  CHECK(term_type(&t, 0, "Hi\x1b[D!\r"));
  CHECK(term_type(&t, 1, "\x1b[A\r"));
  CHECK(term_type(&t, 2, "\x03"));
  finish(&t.c);
  term_wait(&t, 0, "(never)"); /* drain */
  CHECK_STR_CONTAINS(t.buf, "type /clear to forget, /exit or Ctrl-D to end, Ctrl-C stops a reply");
  CHECK_EQ(count(t.buf, "<start_of_turn>user\r\nH!i<end_of_turn>"), 3); /* 1 + 2 renderings */
  CHECK(!strstr(t.buf, "<start_of_turn>user\r\nHi"));
  CHECK(!strstr(t.buf, "\x1b[A<end_of_turn>"));
  test_note("status %#x", t.c.status);
  CHECK(WIFEXITED(t.c.status) && WEXITSTATUS(t.c.status) == 130);
  if (getenv("DBG")) fwrite(t.buf, 1, t.n, stderr);
  close(t.fd);
}

int main(void) {
  g_bin = t_env("RINGLM_BIN");
  const char *src = t_env("RINGLM_SOURCE_DIR");
  signal(SIGPIPE, SIG_IGN); /* a chat that died must fail a check, not end the test */
  snprintf(g_model, sizeof g_model, "%s/models/brown-15m-4bit", src);
  t_tmpdir(g_dir, sizeof g_dir, "cli-chat");
  snprintf(g_tpl, sizeof g_tpl, "%s/chat.jinja", g_dir);
  write_file(g_tpl, "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}\n"
                    "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}");
  RUN(invalid_utf8_line_is_refused);
  RUN(clear_forgets_all_but_the_system_prompt);
  RUN(exit_ends_the_chat);
  RUN(chat_template_file);
  RUN(ctrl_c_stops_only_the_reply);
  RUN(ctrl_c_at_the_prompt_ends_the_chat);
  RUN(terminal_edits_lines);
  RUN(session_holds_the_conversation);
  return t_finish(g_dir);
}
